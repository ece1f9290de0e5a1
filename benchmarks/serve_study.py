#!/usr/bin/env python
"""Train deep, serve shallow at the evidence study's scale (issue 71, target 1): a converged
24-layer teacher of the study distilled into served int8 students of several shapes, one table.

    python benchmarks/serve_study.py [--teacher-record NAME] [--students 6-1 desdar:1600 ...]
        [--student-updates 3200] [--jobs 2] [--work-dir work/serve-study]
        [--out benchmarks/results/distill-study] [--remeasure]

1. data: the study's (``python -m study --preset cpu --prepare-only``: the bundled
   LibreOffice-help corpus, 18,000 training pairs, its tokenization and BPE);
2. teacher: by default the converged 24-layer record of the study with the lowest valid NLL
   (``benchmarks/results/fidelity/cpu/conv-*-24-s*.json``), trained again by its recorded
   ``fairseq-train`` command into ``WORK/teacher`` (it stops by its own ``--patience``; resumable);
3. students: ``deepnmt-distill --teacher WORK/teacher`` (its last 3 checkpoints averaged, as the
   study reads BLEU) with one ``--student`` shape each (:data:`STUDENTS`; ``NAME:UPDATES`` gives a
   student its own ``--student-updates``), the study's pre-norm optimization flags and the study's
   search (beam 4, lenpen 1.0, max length 1.2 x source + 10).  The students train side by side
   (``--jobs`` at a time, cores / jobs torch threads each) and stop before their reports
   (``--no-report``); the first makes the SKD data (the averaged teacher's beam-4 translations of
   the training set, one fairseq-generate per core), the others start when it is there and reuse it
   (``WORK/<student>/skd-bin`` links to it: the same teacher, the same SKD settings);
4. the reports, one student at a time on the otherwise idle machine, each measuring speed by the
   project's speed protocol (``deepnmt_deploy/speed_protocol.py``: the report's tuning pass, then
   teacher and served student interleaved, >= 5 rounds of >= 10 s; docs/distill.md);
   ``--remeasure`` measures them again (the old ones kept as ``report.old-N``);
5. ``OUT/table.md`` and ``OUT/table.json``: one row per student (sacreBLEU of the teacher, the
   student and the served student; tokens/s of both engines batched and one sentence at a time,
   each at the setting its report's tuning pass chose; the speed-ups: the claim, the lower bound of
   the 95% interval, with the median, where the report has them; parameters), with the commands;
   every report is copied to ``OUT/<student>/``.
   ``--beams``: each served student at other beam sizes, timed against the teacher by the same
   protocol (``OUT/beams.md``).

Every step is skipped when its output is complete, so the study survives being stopped.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deepnmt_fairseq.jobs.stage import make_log
from deepnmt_fairseq.machine import cores as machine_cores

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "benchmarks" / "results" / "fidelity" / "cpu"
DATA_WORK = REPO / "work" / "fidelity" / "cpu"  # python -m study --preset cpu's work directory

#: student name -> deepnmt-distill flags (its --student presets; "-scratch": fairseq's initialisation)
STUDENTS = {
    "6-3": ["--student", "6-3"],
    "6-1": ["--student", "6-1"],
    "12-1": ["--student", "12-1"],
    "desdar": ["--student", "desdar"],
    "6-1-scratch": ["--student", "6-1", "--student-init", "scratch"],
}
#: the study's optimization flags of its pre-norm models (the students are pre-norm), as recorded
#: in benchmarks/results/fidelity/cpu/conv-prenorm-6-s1.json
STUDY_TRAIN_ARGS = ("--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --optimizer adam "
                    "--adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 0.003 --lr-scheduler inverse_sqrt "
                    "--warmup-updates 150 --max-tokens 2048")
log = make_log("serve-study", stdout=True)  # the project's one timestamped log line


def best_teacher_record() -> str:
    """The converged 24-layer record with the lowest valid NLL (issue 71: "the best by valid")."""
    recs = [json.loads(Path(f).read_text()) for f in sorted(glob.glob(str(RECORDS / "conv-*-24-s*.json")))]
    recs = [r for r in recs if r.get("valid_nll") is not None and not r.get("diverged")]
    return min(recs, key=lambda r: r["valid_nll"])["name"]


def teacher_argv(record: dict, save_dir: Path) -> list:
    from deepnmt_fairseq.jobs.fairseq_argv import user_dir

    words = shlex.split(record["command"].replace("$(deepnmt-user-dir)", user_dir()))
    i = words.index("--save-dir")
    words[i + 1] = str(save_dir)
    return words


def parse_student(spec: str):
    """``NAME`` or ``NAME:UPDATES`` (a student of :data:`STUDENTS`, its own --student-updates)."""
    name, _, updates = spec.partition(":")
    if name not in STUDENTS:
        raise argparse.ArgumentTypeError(f"{spec}: a student of {', '.join(STUDENTS)} (NAME or NAME:UPDATES)")
    if updates and not updates.isdigit():
        raise argparse.ArgumentTypeError(f"{spec}: UPDATES must be a number of updates")
    return name, int(updates) if updates else None


def distill_argv(name: str, updates: int, work: Path, cores: int = 2) -> list:
    """One student's deepnmt-distill command (the SKD data: ``cores`` fairseq-generate shards at once)."""
    tok = DATA_WORK / "tok"
    return ["deepnmt-distill", "--teacher", str(work / "teacher"), "--data", str(DATA_WORK / "data-bin"),
            "--work-dir", str(work / name), "--test-source", str(tok / "test.raw.en"),
            "--test-reference", str(tok / "test.raw.de"), "--bpe-codes", str(tok / "bpe.codes"),
            *STUDENTS[name], "--student-args", "--attention-dropout 0.0",
            "--train-args", STUDY_TRAIN_ARGS, "--student-updates", str(updates),
            "--skd-args", f"--jobs {cores} --shards {2 * cores}",
            "--save-interval-updates", "100", "--average", "3", "--seed", "1",
            "--beam", "4", "--lenpen", "1.0", "--max-len-a", "1.2", "--max-len-b", "10", "--cpu"]


def run(argv: list, log_file: Path, threads: int, wait: bool = True):
    from deepnmt_fairseq.console import child_env, exe

    env = child_env(dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads),
                         MKL_NUM_THREADS=str(threads)))
    log(f"$ {' '.join(shlex.quote(w) for w in argv)}  (log: {log_file}, {threads} torch thread(s))")
    f = open(log_file, "a", encoding="utf-8")
    proc = subprocess.Popen([exe(argv[0]), *argv[1:]], stdout=f, stderr=subprocess.STDOUT, env=env)
    if wait:
        if proc.wait():
            raise SystemExit(f"{argv[0]} failed (exit {proc.returncode}); see {log_file}")
    return proc


def report_of(work: Path, name: str) -> Path:
    return work / name / "report" / "report.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher-record", help="a record of benchmarks/results/fidelity/cpu (default: the converged "
                                            "24-layer one with the lowest valid NLL)")
    p.add_argument("--students", nargs="+", type=parse_student, default=[("6-1", None), ("desdar", 1600)],
                   metavar="NAME[:UPDATES]", help=f"students of {', '.join(STUDENTS)}, each with its own updates "
                                                  "(default: 6-1 desdar:1600)")
    p.add_argument("--student-updates", type=int, default=3200, help="updates of a student given without its own")
    p.add_argument("--jobs", type=int, default=2, help="students trained at once (cores / jobs torch threads each)")
    p.add_argument("--work-dir", default=str(REPO / "work" / "serve-study"))
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "distill-study"))
    p.add_argument("--remeasure", action="store_true", help="measure every report again (the old one kept)")
    p.add_argument("--beams", type=int, nargs="*", default=[],
                   help="also serve each student with these beam sizes (a lever of issue 71): sacreBLEU and batched "
                        "tok/s against the teacher's fairseq-generate (its report's beam and setting), timed by the "
                        "speed protocol, interleaved with the teacher, after the reports (OUT/beams.md)")
    p.add_argument("--speed-repeats", type=int, default=5, help="--beams: the protocol's interleaved rounds (5)")
    p.add_argument("--speed-min-seconds", type=float, default=10.0,
                   help="--beams: seconds of decoding in one timed run, at least (the protocol's 10)")
    a = p.parse_args(argv)
    a.students = [(n, u or a.student_updates) for n, u in a.students]
    work, out = Path(a.work_dir).resolve(), Path(a.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cores = machine_cores()

    if not (DATA_WORK / "data-bin" / "dict.en.txt").exists():
        subprocess.run([sys.executable, "-m", "study", "--preset", "cpu", "--prepare-only"], check=True, cwd=REPO)
    name = a.teacher_record or best_teacher_record()
    record = json.loads((RECORDS / f"{name}.json").read_text())
    log(f"teacher: {name} (study: valid NLL {record['valid_nll']}, test sacreBLEU {record['bleu']}, stopped at "
        f"{record['stopped_at']} updates)")
    tdir = work / "teacher"
    if not (tdir / ".done").exists():
        tdir.mkdir(parents=True, exist_ok=True)
        run(teacher_argv(record, tdir), tdir / "train.log", cores)
        (tdir / ".done").write_text(json.dumps({"record": name, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}))

    # the students, side by side up to --jobs, each stopping before its report; the first makes the
    # SKD data (--jobs shards at once), the others start when it is there and reuse it
    threads = max(1, cores // max(1, a.jobs))
    first = a.students[0][0]
    skd = work / first / "skd-bin"
    pending = [(s, u) for s, u in a.students if not (work / s / "ct2-int8" / ".done").exists()]
    running = []
    while pending or running:
        while pending and len(running) < max(1, a.jobs) and (pending[0][0] == first or (skd / ".done").exists()):
            s, u = pending.pop(0)
            (work / s).mkdir(parents=True, exist_ok=True)
            if s != first and not (work / s / "skd-bin").exists():
                os.symlink(skd, work / s / "skd-bin")  # the same teacher's SKD data (module doc)
            running.append((s, run(distill_argv(s, u, work, cores) + ["--no-report"], work / f"{s}.log", threads,
                                   wait=False)))
        if not running:
            raise SystemExit(f"no SKD data at {skd}: the first student ({first}) did not make it; see {work / first}.log")
        time.sleep(10)
        for s, proc in list(running):
            if proc.poll() is not None:
                running.remove((s, proc))
                if proc.returncode:
                    raise SystemExit(f"deepnmt-distill for student {s} failed (exit {proc.returncode}); "
                                     f"see {work / (s + '.log')}")
    # the reports, one at a time on the otherwise idle machine
    for s, u in a.students:
        if report_of(work, s).exists() and a.remeasure:
            n = 1 + len(list((work / s).glob("report.old-*")))
            os.replace(work / s / "report", work / s / f"report.old-{n}")
        if not report_of(work, s).exists():
            run(distill_argv(s, u, work, cores), work / f"{s}.log", cores)
    write_table(a, work, out, name, record)
    if a.beams:
        beam_sweep(a, work, out)
    return 0


def beam_sweep(a, work: Path, out: Path) -> None:
    """Beam size against BLEU and speed for each served student: the teacher's fairseq-generate batched
    (the report's beam, at the setting its report's tuning pass chose) against deepnmt-translate at each
    beam of ``--beams`` (at the setting its report chose), timed by the speed protocol (the report's
    :func:`~deepnmt_fairseq.distill.report.timed_pairs`: interleaved, calibrated, pinned by the
    report's rules); every ratio the median of the pairs with its interval and claim."""
    import re
    import statistics
    from dataclasses import replace
    from types import SimpleNamespace

    from deepnmt_fairseq.distill.report import (BinarizedSplit, Measure, ReportInputs, Setting, sacrebleu_of,
                                                timed_pairs)

    def setting(text: str) -> Setting:
        tokens = re.search(r"batches of up to (\d+) tokens", text)
        size = 0 if tokens else int(re.search(r"batches of (\d+)", text)[1])
        if text.startswith("fairseq-generate"):
            return Setting(size, int(re.search(r"(\d+) torch thread", text)[1]), max_tokens=int(tokens[1]) if tokens else 0)
        inter, intra = re.search(r"inter_threads (\d+) x intra_threads (\d+)", text).groups()
        return Setting(size, int(intra), int(inter))

    tok = DATA_WORK / "tok"
    refs = (tok / "test.raw.de").read_text(encoding="utf-8").splitlines()
    srcs = (tok / "test.raw.en").read_text(encoding="utf-8").splitlines()
    split = BinarizedSplit(DATA_WORK / "data-bin")
    rows = []
    for s, _ in a.students:
        rep = json.loads(report_of(work, s).read_text())
        d = work / s
        sy = rep["systems"]
        r = ReportInputs(out=d / "beams", data=DATA_WORK / "data-bin", teacher=d / "teacher-avg3.pt", student=d,
                         ct2=d / "ct2-int8", test_source=tok / "test.raw.en", test_reference=tok / "test.raw.de",
                         beam=rep["search"]["beam"], lenpen=rep["search"]["lenpen"],
                         max_len_a=rep["search"]["max_len_a"], max_len_b=rep["search"]["max_len_b"],
                         speed_repeats=a.speed_repeats, speed_min_seconds=a.speed_min_seconds)
        m = Measure(r, log)
        taught = setting(sy["teacher fairseq-generate"]["batched"]["setting"])
        teacher = m.fairseq("teacher", r.teacher, taught)  # the warm-up and calibration pass
        served = setting(sy["student deepnmt-translate"]["batched"]["setting"])
        for beam in sorted(set(a.beams) | {r.beam}, reverse=True):
            ms = Measure(replace(r, beam=beam), log)  # the student at this beam, the teacher at the report's
            run = ms.ct2(f"student-beam{beam}", r.test_source, served)
            both = SimpleNamespace(r=r, tmp=m.tmp, fairseq=m.fairseq, ct2=ms.ct2)
            timed = timed_pairs(both, split, srcs, "batched", list(range(len(srcs))),
                                {"teacher": (taught, teacher), "student": (served, run)}, log)
            res = timed["result"]
            median_rate = {who: statistics.median(x["tokens"] / x["seconds"] for x in timed["runs"][who])
                           for who in ("teacher", "student")}
            rows.append({"student": s, "beam": beam, "teacher_beam": r.beam, "sacrebleu": sacrebleu_of(run["lines"], refs)["sacrebleu"],
                         "teacher_sacrebleu": sy["teacher fairseq-generate"]["sacrebleu"],
                         "tokens_per_s": round(median_rate["student"], 1),
                         "teacher_tokens_per_s": round(median_rate["teacher"], 1),
                         "speedup_batched": round(res["median"], 2), "speedup_batched_interval": res["interval"],
                         "speedup_batched_claim": res["claim"], "timed": timed,
                         "setting": run["setting"], "teacher_setting": teacher["setting"],
                         "loaded": any(x["load_before"] >= m.cores for runs in timed["runs"].values() for x in runs)})
    lines = ["# Beam size against BLEU and speed, the served students (issue 71's levers)", "",
             f"Teacher: fairseq-generate at beam {rows[0]['teacher_beam']} ({rows[0]['teacher_setting']}), measured in "
             "this run; each served student with deepnmt-translate at the batched setting its report chose; timed by "
             f"the speed protocol ({a.speed_repeats} interleaved rounds of >= {a.speed_min_seconds:g} s; "
             "deepnmt_deploy/speed_protocol.py): the claim is the lower bound of the 95% interval of the median "
             f"ratio. Measured {time.strftime('%Y-%m-%d %H:%M:%S')}.", "",
             "| student | beam | served sacreBLEU (teacher) | served - teacher | batched tok/s served / teacher | "
             "speed-up batched: claim (median, 95% CI) | loaded |", "|---|---|---|---|---|---|---|"]
    for x in rows:
        lo, hi = x["speedup_batched_interval"]
        lines.append(f"| {x['student']} | {x['beam']} | {x['sacrebleu']} ({x['teacher_sacrebleu']}) | "
                     f"{x['sacrebleu'] - x['teacher_sacrebleu']:+.2f} | {x['tokens_per_s']:.0f} / "
                     f"{x['teacher_tokens_per_s']:.0f} | ≥{x['speedup_batched_claim']:.2f}x ({x['speedup_batched']}x, "
                     f"{lo:.2f}-{hi:.2f}) | {'yes' if x['loaded'] else 'no'} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "beams.json").write_text(json.dumps({"rows": rows, "command": "python benchmarks/serve_study.py " + " ".join(
        shlex.quote(x) for x in sys.argv[1:])}, indent=2) + "\n")
    (out / "beams.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_table(a, work: Path, out: Path, name: str, record: dict) -> None:
    from deepnmt_fairseq.distill.report import speed_claim

    rows = []
    for s, u in a.students:
        rep = json.loads(report_of(work, s).read_text())
        dest = out / s
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("report.json", "report.md"):
            shutil.copy(work / s / "report" / f, dest / f)
        sy, sm = rep["systems"], rep["summary"]
        t, st, sv = sy["teacher fairseq-generate"], sy["student fairseq-generate"], sy["student deepnmt-translate"]
        rows.append({"student": s, "flags": STUDENTS[s], "teacher_bleu": t["sacrebleu"], "student_bleu": st["sacrebleu"],
                     "served_bleu": sv["sacrebleu"], "served_minus_teacher": sm["bleu_served_minus_teacher"],
                     "teacher_tok_s": [t["batched"]["tokens_per_s"], t["single"]["tokens_per_s"]],
                     "served_tok_s": [sv["batched"]["tokens_per_s"], sv["single"]["tokens_per_s"]],
                     "speedup_batched": sm["speedup_batched"], "speedup_single": sm["speedup_single"],
                     **{k: sm[k] for k in ("speedup_batched_interval", "speedup_batched_claim",
                                           "speedup_single_interval", "speedup_single_claim", "speed_meets_protocol")
                        if k in sm},
                     "student_parameters": rep["sizes"]["student"]["parameters"],
                     "teacher_parameters": rep["sizes"]["teacher"]["parameters"],
                     "loaded": rep["loaded_machine"], "machine": rep.get("machine"), "measured_at": rep["measured_at"],
                     "updates": u,
                     "command": " ".join(shlex.quote(w) for w in distill_argv(s, u, work, machine_cores()))})
    table = {"teacher_record": name, "teacher_command": record["command"], "study_bleu": record["bleu"],
             "rows": rows,
             "command": "python benchmarks/serve_study.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])}
    lines = ["# Train deep, serve shallow at the study's scale (issue 71)", "",
             f"Teacher: `{name}` of the evidence study (24-layer encoder, 3-layer decoder, width 128; the study's "
             f"record: valid NLL {record['valid_nll']}, test sacreBLEU {record['bleu']}), trained again by its "
             f"recorded command; students: deepnmt-distill on its SKD data. "
             "Test: the study's 1,059 sentences, beam 4. Each engine at the fastest setting its report's tuning pass "
             "found; speed-ups by the speed protocol where the report has them: the claim (the lower bound of the 95% "
             "interval of the median ratio) first, then the median and the interval.",
             "", "| student (updates) | served sacreBLEU (teacher) | served - teacher | batched tok/s served / teacher | "
                 "speed-up batched | one sentence tok/s served / teacher | speed-up single | student params |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['student']} ({r['updates']}) | {r['served_bleu']} ({r['teacher_bleu']}) | {r['served_minus_teacher']:+.2f} | "
                     f"{r['served_tok_s'][0]:.0f} / {r['teacher_tok_s'][0]:.0f} | {speed_claim(r, 'batched')} | "
                     f"{r['served_tok_s'][1]:.0f} / {r['teacher_tok_s'][1]:.0f} | {speed_claim(r, 'single')} | "
                     f"{r['student_parameters']:,} |")
    mc = rows[0]["machine"] or {}
    loaded = ", ".join(f"{r['student']}: {r['loaded']}" for r in rows if r["loaded"]) or "none"
    lines += ["", f"Machine: {mc.get('cpu')}, {mc.get('kernels')} kernels, {mc.get('cores')} cores. Measurements "
                  f"started on a loaded machine: {loaded}.",
              "", f"Command: `{table['command']}`; each student's command and report: `{out.name}/<student>/`."]
    (out / "table.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
