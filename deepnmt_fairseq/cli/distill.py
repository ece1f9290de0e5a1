"""Train deep, serve shallow: a trained teacher to a served int8 student in one command.

    deepnmt-distill (--teacher TEACHER.pt|SAVE_DIR --data DATA_BIN | --teacher-row NAME [--repro-args "..."]) \\
        --work-dir WORK \\
        --test-source test.raw.en --test-reference test.raw.de [--bpe-codes CODES] \\
        [--student-init auto|extract|scratch] [--student-encoder-layers 6 --student-decoder-layers 3 ...] \\
        [--student-updates N] [--train-args "..."] [--quantization int8] [--cpu] [--tiny]

Stages (docs/distill.md; each skipped when its output exists, each resumes when interrupted):

  0. with --teacher-row NAME: the registry row's training stages (deepnmt-repro train NAME
     --stage ... REPRO_ARGS; reused when trained earlier); its last stage is the teacher;

  1. teacher average (when --teacher is fairseq-train's save directory: its last --average
     checkpoints);
  2. SKD data: the (averaged) teacher translates the training set (deepnmt-skd, beam 4, lenpen 0.6);
  3. student initialisation: one layer per group (deepnmt-extract-student) when the teacher was
     GP-trained, with h = the teacher's own GP group size from its checkpoint; else a plain
     pre-norm deepnmt_transformer (depths and width are flags, by default the teacher's width and
     depths capped at 6) that starts from every teacher tensor of the same name and shape
     (--student-init teacher; --student-init scratch: fairseq's initialisation);
  4. student training on the SKD data (fairseq-train; resumes from checkpoint_last.pt);
  5. student average (last --average checkpoints);
  6. export to CTranslate2 (deepnmt-export-ct2, --quantization int8 by default);
  7. report (WORK/report/report.{md,json}): teacher sacreBLEU with fairseq-generate, student
     sacreBLEU with fairseq-generate and with deepnmt-translate, tokens/s of each batched and one
     sentence at a time in the same run, parameters and size on disk.

Checked before any work, each error naming the flag or file: a missing teacher, a teacher whose
dictionary differs from --data's, a student that cannot be extracted from this teacher, and a
student that cannot be exported exactly (deploy.export.refusals on the student built from its
flags).  A re-run with other settings refuses the work directory.  Without --cpu the commands
run on CUDA when it is available.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from ..console import quiet_known_warnings

TINY_STUDENT_UPDATES = 8


def parser() -> argparse.ArgumentParser:
    from ..distill.plan import DEFAULT_TRAIN_ARGS

    p = argparse.ArgumentParser(prog="deepnmt-distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    t = p.add_mutually_exclusive_group(required=True)
    t.add_argument("--teacher",
                   help="teacher checkpoint (.pt), or fairseq-train's --save-dir (its last --average checkpoints "
                        "are averaged); any architecture of the plugin")
    t.add_argument("--teacher-row", metavar="NAME",
                   help="a deepnmt-repro registry row (deepnmt-repro list): its training stages run first "
                        "(deepnmt-repro train NAME; reused when trained earlier), its last stage is the teacher")
    p.add_argument("--repro-args", default="",
                   help="--teacher-row: flags of deepnmt-repro train, fairseq-train flags after '--' (e.g. "
                        "'--gpus 8 --bf16 --data-root DIR', '--launcher torchrun')")
    p.add_argument("--data", help="binarized data the teacher was trained on (fairseq-preprocess); "
                                  "--teacher-row: default the row's data")
    p.add_argument("--work-dir", required=True, help="where every stage writes; tied to these settings")
    p.add_argument("--test-source", required=True, help="raw (untokenized) source side of the test split of --data")
    p.add_argument("--test-reference", required=True, help="raw reference translations of the same sentences")
    g = p.add_argument_group("student")
    g.add_argument("--student-init", choices=["auto", "extract", "teacher", "scratch"], default="auto",
                   help="extract: one layer per group (a GP-trained teacher); teacher: every teacher tensor whose name "
                        "and shape the student shares; scratch: fairseq's initialisation; auto: extract when the "
                        "teacher was GP-trained, else teacher")
    g.add_argument("--student-arch", help="architecture of a scratch student (default deepnmt_transformer, pre-norm)")
    g.add_argument("--student-encoder-layers", type=int, help="scratch: encoder depth (default: the teacher's, <= 6)")
    g.add_argument("--student-decoder-layers", type=int, help="scratch: decoder depth (default: the teacher's, <= 6)")
    g.add_argument("--student-dim", type=int, help="scratch: embedding width (default: the teacher's)")
    g.add_argument("--student-ffn-dim", type=int, help="scratch: FFN width (default: the teacher's)")
    g.add_argument("--student-heads", type=int, help="scratch: attention heads (default: the teacher's)")
    g.add_argument("--student-args", default="", help="more fairseq model flags for the student")
    g.add_argument("--select", choices=["random", "first", "last"], default="random",
                   help="extract: which layer of each group")
    g = p.add_argument_group("training")
    g.add_argument("--train-args", default=DEFAULT_TRAIN_ARGS,
                   help="fairseq-train optimization flags of the student (default: the GPKD paper's)")
    g.add_argument("--student-updates", type=int, default=50000, help="--max-update of the student")
    g.add_argument("--save-interval-updates", type=int, default=0,
                   help="student checkpoint interval (default: --student-updates / 16)")
    g.add_argument("--average", type=int, default=5, help="last K checkpoints averaged (teacher directory, student)")
    g.add_argument("--skd-args", default="", help="more deepnmt-skd flags (e.g. --shards 8 --max-tokens 8192)")
    g.add_argument("--seed", type=int, default=1)
    g = p.add_argument_group("export and report")
    g.add_argument("--quantization", default="int8", help="CTranslate2 weight type (deepnmt-export-ct2)")
    seg = g.add_mutually_exclusive_group()
    seg.add_argument("--bpe-codes", help="subword-nmt codes of --data (default: found next to it)")
    seg.add_argument("--spm-model", help="sentencepiece model of --data")
    g.add_argument("--beam", type=int, default=5)
    g.add_argument("--lenpen", type=float, default=1.0)
    g.add_argument("--max-len-a", type=float, default=1.2)
    g.add_argument("--max-len-b", type=int, default=10)
    g.add_argument("--batch-size", type=int, default=64, help="fairseq-generate's batch size (batched speed)")
    g.add_argument("--ct2-batch-size", type=int, default=32, help="deepnmt-translate's batch size (batched speed)")
    g.add_argument("--single-sentences", type=int, default=300,
                   help="about this many test sentences are translated one at a time for the single-sentence speed")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    p.add_argument("--tiny", action="store_true",
                   help=f"CI smoke size: --student-updates <= {TINY_STUDENT_UPDATES}, --average <= 2, short outputs")
    p.add_argument("--dry-run", action="store_true", help="check and print the plan, run nothing")
    return p


def main(argv=None) -> int:
    quiet_known_warnings()
    a = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from ..distill.pipeline import DistillConfig, plan_distillation
    from ..distill.plan import PlanError, Stage
    from ..distill.report import ReportInputs, build_report
    from ..distill.run import RunError, Runner, settings_guard

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
    work = Path(a.work_dir).resolve()
    row = None
    try:
        if a.teacher_row:
            from ..distill.teacher_row import row_teacher

            row = row_teacher(a.teacher_row, shlex.split(a.repro_args), log=work / "teacher-row.log")
            a.data = a.data or str(row.data)
        elif a.repro_args:
            raise PlanError("--repro-args: only with --teacher-row")
        elif not a.data:
            raise PlanError("--data: required with --teacher")
    except PlanError as err:
        print(f"deepnmt-distill: error: {err}", file=sys.stderr)
        return 2
    export_args = (["--bpe-codes", a.bpe_codes] if a.bpe_codes else []) + (["--spm-model", a.spm_model]
                                                                        if a.spm_model else [])
    c = DistillConfig(work=work, data=Path(a.data).resolve(), teacher_row=row,
                      teacher=Path(a.teacher).resolve() if a.teacher else None, average=a.average,
                      student_init=a.student_init, student_arch=a.student_arch,
                      encoder_layers=a.student_encoder_layers, decoder_layers=a.student_decoder_layers,
                      dim=a.student_dim, ffn_dim=a.student_ffn_dim, heads=a.student_heads,
                      student_args=shlex.split(a.student_args), train_args=train_args,
                      student_updates=a.student_updates, save_interval_updates=a.save_interval_updates,
                      select=a.select, seed=a.seed, skd_args=skd_args, quantization=a.quantization,
                      export_args=export_args, cpu=cpu)
    runner = Runner("distill")
    try:
        plan = plan_distillation(c)
    except PlanError as err:
        print(f"deepnmt-distill: error: {err}", file=sys.stderr)
        return 2
    for note in plan.notes:
        runner.log(note)
    runner.log(f"device: {'cpu' if cpu else 'cuda'}")
    report_dir = work / "report"
    inputs = ReportInputs(out=report_dir, data=c.data, teacher=plan.teacher_model, student=plan.student_model,
                          ct2=plan.ct2_model, test_source=Path(a.test_source).resolve(),
                          test_reference=Path(a.test_reference).resolve(), cpu=cpu, beam=a.beam, lenpen=a.lenpen,
                          max_len_a=a.max_len_a, max_len_b=a.max_len_b, batch_size=a.batch_size,
                          ct2_batch_size=a.ct2_batch_size, single_sentences=a.single_sentences,
                          settings_note="deepnmt-distill " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])))
    stages = [*plan.stages, Stage("report", [], report_dir / "report.json", what="report: quality, speed, size",
                                  call=lambda: build_report(inputs, runner.log))]
    if a.dry_run:
        for i, st in enumerate(stages, 1):
            print(f"{i}. {st.name}{' (done)' if st.is_done() else ''}: {st.command_line()}")
        return 0
    # what decides the outputs; not the device (a run moved between a GPU and a CPU node may resume)
    settings = {k: v for k, v in vars(a).items() if k not in ("work_dir", "cpu", "dry_run")}
    for k in ("teacher", "data", "test_source", "test_reference", "bpe_codes", "spm_model"):
        if settings.get(k):  # the same files, whichever directory the command is run from
            settings[k] = str(Path(settings[k]).resolve())
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

    rep = json.loads((report_dir / "report.json").read_text())
    print((report_dir / "report.md").read_text(encoding="utf-8"))
    sm = rep["summary"]
    runner.log(f"served student {sm['bleu_served_minus_teacher']:+.2f} sacreBLEU vs the teacher, "
               f"{sm['speedup_batched']}x batched, {sm['speedup_single']}x single; report: {report_dir / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
