"""Train deep, serve shallow: the library behind ``deepnmt-distill`` (its arguments and the
stages it runs: :mod:`deepnmt_cli.distill`, docs/distill.md)."""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path


TINY_STUDENT_UPDATES = 8
#: --tiny: the report's timed runs, one round of one pass (a smoke test of the protocol, not a claim)
TINY_SPEED_REPEATS = 1


def report_name(shortlist: bool) -> str:
    """The report's directory in the work directory: ``report``, or ``report-vmap`` for the student
    served with the vocabulary shortlist (``--vmap``), so that both stay side by side."""
    return "report-vmap" if shortlist else "report"


def work_dir_settings(args: dict) -> dict:
    """The options that tie a work directory (``WORK/settings.json``): what decides the outputs. Not the
    device (a run moved between a GPU and a CPU node may resume), the speed protocol's options, nor
    --vmap (its export and report have their own directories: one student served with and without it)."""
    settings = {k: v for k, v in args.items() if k not in ("work_dir", "cpu", "dry_run", "student_depth_cap",
                                                           "no_speed_search", "no_report", "speed_repeats",
                                                           "speed_min_seconds", "speed_cores", "vmap")}
    if settings.get("student") == "auto":  # the default shape: work directories made before --student existed
        del settings["student"]
    for k in ("teacher", "data", "test_source", "test_reference", "bpe_codes", "spm_model"):
        if settings.get(k):  # the same files, whichever directory the command is run from
            settings[k] = str(Path(settings[k]).resolve())
    return settings


def run(a) -> int:
    """``deepnmt-distill`` (arguments: :mod:`deepnmt_cli.distill`)."""
    argv = vars(a).pop("argv", None)  # the command line, for the report (not a setting)
    repro = vars(a).pop("repro", None)  # --repro-args parsed by deepnmt_cli.distill: (flags, argv, extra)
    if a.train_args is None:
        from .plan import DEFAULT_TRAIN_ARGS

        a.train_args = DEFAULT_TRAIN_ARGS
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from .pipeline import DistillConfig, plan_distillation
    from .plan import PlanError, Stage
    from .report import ReportInputs, build_report
    from .run import RunError, Runner, settings_guard

    import torch

    cpu = a.cpu or not torch.cuda.is_available()
    train_args = shlex.split(a.train_args)
    skd_args = shlex.split(a.skd_args)
    if a.tiny:
        a.student_updates = min(a.student_updates, TINY_STUDENT_UPDATES)
        a.average = min(a.average, 2)
        a.save_interval_updates = a.save_interval_updates or 2
        a.max_len_b = min(a.max_len_b, 8)
        train_args += ["--warmup-updates", "4", "--max-tokens", "2048", "--update-freq", "1"]
        skd_args = ["--max-len-a", "0", "--max-len-b", "8", "--batch-size", "128", *skd_args]
        a.single_sentences = min(a.single_sentences, 5)
        a.speed_repeats, a.speed_min_seconds = min(a.speed_repeats, TINY_SPEED_REPEATS), 0.0
    if a.speed_repeats < 1 or a.speed_min_seconds < 0:
        print(f"deepnmt-distill: error: --speed-repeats {a.speed_repeats} (at least 1), --speed-min-seconds "
              f"{a.speed_min_seconds} (at least 0)", file=sys.stderr)
        return 2
    from deepnmt_deploy.speed_protocol import parse_cores

    try:
        speed_cores = parse_cores(a.speed_cores)
    except ValueError as err:
        print(f"deepnmt-distill: error: --speed-cores: {err}", file=sys.stderr)
        return 2
    work = Path(a.work_dir).resolve()
    row = None
    try:
        if a.teacher_row:
            from .teacher_row import row_teacher

            row = row_teacher(a.teacher_row, *repro, log=work / "teacher-row.log")
            a.data = a.data or str(row.data)
        elif a.repro_args:
            raise PlanError("--repro-args: only with --teacher-row")
        elif not a.data:
            raise PlanError("--data: required with --teacher")
    except PlanError as err:
        print(f"deepnmt-distill: error: {err}", file=sys.stderr)
        return 2
    export_args = ((["--bpe-codes", a.bpe_codes] if a.bpe_codes else [])
                   + (["--spm-model", a.spm_model] if a.spm_model else []))
    c = DistillConfig(work=work, data=Path(a.data).resolve(), teacher_row=row,
                      teacher=Path(a.teacher).resolve() if a.teacher else None, average=a.average,
                      student_init=a.student_init, student_arch=a.student_arch,
                      encoder_layers=a.student_encoder_layers, decoder_layers=a.student_decoder_layers,
                      depth_cap=a.student_depth_cap,
                      dim=a.student_dim, ffn_dim=a.student_ffn_dim, heads=a.student_heads,
                      student_args=shlex.split(a.student_args), train_args=train_args,
                      student_updates=a.student_updates, save_interval_updates=a.save_interval_updates,
                      select=a.select, seed=a.seed, skd_args=skd_args, quantization=a.quantization,
                      export_args=export_args, shortlist=a.vmap, cpu=cpu)
    runner = Runner("distill")
    try:
        plan = plan_distillation(c)
    except PlanError as err:
        print(f"deepnmt-distill: error: {err}", file=sys.stderr)
        return 2
    for note in plan.notes:
        runner.log(note)
    runner.log(f"device: {'cpu' if cpu else 'cuda'}")
    report_dir = work / report_name(a.vmap)
    inputs = ReportInputs(out=report_dir, data=c.data, teacher=plan.teacher_model, student=plan.student_model,
                          ct2=plan.ct2_model, test_source=Path(a.test_source).resolve(),
                          test_reference=Path(a.test_reference).resolve(), cpu=cpu, beam=a.beam, lenpen=a.lenpen,
                          max_len_a=a.max_len_a, max_len_b=a.max_len_b, batch_size=a.batch_size,
                          ct2_batch_size=a.ct2_batch_size, single_sentences=a.single_sentences,
                          search=not (a.tiny or a.no_speed_search), speed_repeats=a.speed_repeats,
                          speed_min_seconds=a.speed_min_seconds, speed_cores=speed_cores,
                          settings_note="deepnmt-distill " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])))
    stages = [*plan.stages, *([] if a.no_report else [
        Stage("report", [], report_dir / "report.json", what="report: quality, speed, size",
              call=lambda: build_report(inputs, runner.log))])]
    if a.dry_run:
        for i, st in enumerate(stages, 1):
            print(f"{i}. {st.name}{' (done)' if st.is_done() else ''}: {st.command_line()}")
        return 0
    settings = work_dir_settings(vars(a))
    try:
        for flag in ("test_source", "test_reference"):
            if not Path(getattr(a, flag)).is_file():
                raise FileNotFoundError(f"--{flag.replace('_', '-')} {getattr(a, flag)}: no such file")
        settings_guard(work, settings)
        runner.run(stages)
    except (RunError, FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"deepnmt-distill: error: {err}", file=sys.stderr)
        return 1
    import json

    if a.no_report:
        runner.log(f"served student ready: {plan.ct2_model} (--no-report: the same command without it measures "
                   "the report)")
        return 0
    rep = json.loads((report_dir / "report.json").read_text())
    print((report_dir / "report.md").read_text(encoding="utf-8"))
    sm = rep["summary"]
    from .report import speed_claim

    runner.log(f"served student {sm['bleu_served_minus_teacher']:+.2f} sacreBLEU vs the teacher, "
               f"{speed_claim(sm, 'batched')} batched, {speed_claim(sm, 'single')} single (the claim: the lower "
               f"bound of the 95% interval); report: {report_dir / 'report.md'}")
    return 0

