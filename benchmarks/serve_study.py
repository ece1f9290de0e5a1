#!/usr/bin/env python
"""Train deep, serve shallow at the evidence study's scale (issue 71, target 1): a converged
24-layer teacher of the study distilled into served int8 students of several shapes, one table.

    python benchmarks/serve_study.py [--teacher-record NAME] [--students 6-1 desdar:1600 ...]
        [--student-updates 3200] [--jobs 2] [--work-dir work/serve-study]
        [--out benchmarks/results/distill-study] [--remeasure] [--teacher-threads N]
        [--until teacher|students|reports] [--beams 2 1] [--vmap] [--deep-row CHECKPOINT]

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
   ``--remeasure`` measures them again, a rerun of the protocol (the old ones kept as ``report.old-N``;
   the tuning pass's choice, ``tuning.json``, copied and so frozen);
5. ``OUT/table.md`` and ``OUT/table.json``: one row per student (sacreBLEU of the teacher, the
   student and the served student; tokens/s of both engines batched and one sentence at a time,
   each at the setting its report's tuning pass chose; the speed-ups: the claim, the lower bound of
   the 95% interval, with the median, where the report has them; parameters), with the commands;
   every report is copied to ``OUT/<student>/``.
6. the frontier (``--beams``, ``--vmap``, ``--deep-row``; ``OUT/frontier.md`` and ``.json``): each
   served student at other beam sizes, with and without the vocabulary shortlist (and what the
   shortlist costs: the full model's tokens it would not allow), and a plain 24-layer model exported
   int8, each timed against the teacher by the same protocol (issue 78, item 3).  The records of the
   first, pre-protocol run (2026-12-02) are ``beams.md``/``beams.json`` next to it.

Every step is skipped when its output is complete, so the study survives being stopped.
"""

from __future__ import annotations

import argparse
import math
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

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
    p.add_argument("--teacher-threads", type=int, default=0,
                   help="torch threads of the teacher's training (default: every core; 1 leaves a core to other work, "
                        "and a different thread count is another run of the same recipe: benchmarks/results/distill-study)")
    p.add_argument("--until", choices=("teacher", "students", "reports"), default="reports",
                   help="stop after this step (the steps are resumable: a later call goes on from there)")
    p.add_argument("--reports", nargs="*", metavar="NAME",
                   help="the students that get a report (default: all; the others enter the frontier only, served "
                        "at the first report's setting)")
    p.add_argument("--compare-with", metavar="TABLE_JSON",
                   help="an earlier run's table.json: write OUT/agreement.json, each student's claims (batched, one "
                        "sentence) in both runs and whether they agree within 10%% (the protocol's rerun check)")
    p.add_argument("--remeasure", action="store_true", help="measure every report again (the old one kept)")
    p.add_argument("--beams", type=int, nargs="*", default=[],
                   help="the frontier (after the reports; OUT/frontier.md): each served student also at these beam "
                        "sizes, sacreBLEU and batched tok/s against the teacher's fairseq-generate (the first "
                        "report's beam and setting), timed by the speed protocol, interleaved with the teacher")
    p.add_argument("--vmap", action="store_true",
                   help="the frontier: each student also exported with the vocabulary shortlist (deepnmt-export-ct2 "
                        "--vmap, built from the study's training pairs) and served with it at every beam")
    p.add_argument("--deep-row", metavar="CHECKPOINT",
                   help="the frontier: one more row, this 24-layer checkpoint of the study's data (a plain pre-norm "
                        "or DeepNorm model: the exporter refuses transparent and MSC) exported int8 and served at "
                        "the report's beam, to show what depth costs apart from the engine")
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
        threads = a.teacher_threads or cores
        run(teacher_argv(record, tdir), tdir / "train.log", threads)
        (tdir / ".done").write_text(json.dumps({"record": name, "threads": threads,
                                                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}))
    if a.until == "teacher":
        return 0

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
    if a.until == "students":
        return 0
    # the reports, one at a time on the otherwise idle machine
    names = [s for s, _ in a.students]
    for s in a.reports or []:
        if s not in names:
            raise SystemExit(f"--reports {s}: not one of --students ({', '.join(names)})")
    for s, u in a.students:
        if a.reports is not None and s not in a.reports:
            continue
        if report_of(work, s).exists() and a.remeasure:
            if not (work / s / "report" / "tuning.json").exists():
                raise SystemExit(f"--remeasure: {work / s / 'report'} has no tuning.json, so a rerun would tune "
                                 "again; the rerun of the protocol keeps the first run's choice")
            n = 1 + len(list((work / s).glob("report.old-*")))
            os.replace(work / s / "report", work / s / f"report.old-{n}")
            # a rerun of the protocol: the tuning pass's choice stays frozen (the report reads it)
            (work / s / "report").mkdir()
            shutil.copy(work / s / f"report.old-{n}" / "tuning.json", work / s / "report" / "tuning.json")
        if not report_of(work, s).exists():
            run(distill_argv(s, u, work, cores), work / f"{s}.log", cores)
    write_table(a, work, out, name, record, a.reports)
    if a.compare_with:
        write_agreement(Path(a.compare_with), out / "table.json", out / "agreement.json")
    if a.beams or a.vmap or a.deep_row:
        frontier(a, work, out, cores)
    return 0


def export_argv(checkpoint: Path, out: Path, shortlist: bool) -> list:
    """deepnmt-export-ct2 int8 of a checkpoint trained on the study's data (``shortlist``: with the
    vocabulary shortlist built from the study's training pairs, ``--vmap``)."""
    codes = DATA_WORK / "tok" / "bpe.codes"
    return ["deepnmt-export-ct2", str(checkpoint), str(out), "--quantization", "int8", "--data",
            str(DATA_WORK / "data-bin"), *(["--bpe-codes", str(codes)] if codes.exists() else []), "--force",
            *(["--vmap"] if shortlist else [])]


def exported(checkpoint: Path, out: Path, shortlist: bool, cores: int) -> Path:
    """The int8 export of ``checkpoint`` at ``out``, made once: ``.done`` names the checkpoint and its
    modification time, and another checkpoint (or a retrained one) is exported again."""
    stamp = {"checkpoint": str(Path(checkpoint).resolve()), "mtime": Path(checkpoint).stat().st_mtime,
             "shortlist": shortlist}
    done = out / ".done"
    if not done.exists() or json.loads(done.read_text() or "{}") != stamp:
        out.parent.mkdir(parents=True, exist_ok=True)
        run(export_argv(checkpoint, out, shortlist), Path(str(out) + ".log"), cores)
        done.write_text(json.dumps(stamp) + "\n")
    return out


def lost_share(plain: Path, shortlisted: Path, srcs: list, beam: int, search: dict) -> dict:
    """What the shortlist costs the full model (:func:`deepnmt_deploy.vmap.lost_tokens`): the plain
    export's hypotheses at ``beam`` (one sentence a batch: the strictest case), the share of their
    tokens that the shortlist of their own source does not allow, and the lines losing one."""
    from deepnmt_deploy.translate import DeployedModel
    from deepnmt_deploy.vmap import VMAP_FILE, VocabularyMap, lost_tokens

    full = DeployedModel(str(plain), use_vmap=False)
    sources = [full.encode(x) for x in srcs]
    hyps = full.translate_tokens(sources, beam=beam, lenpen=search["lenpen"], max_len=search["max_len_b"],
                                 max_len_a=search["max_len_a"], batch_size=1)
    lost, total, lines = lost_tokens(VocabularyMap.read(shortlisted / VMAP_FILE), sources, hyps)
    return {"lost_tokens": lost, "tokens": total, "lost_share": round(lost / max(1, total), 5),
            "lines_losing": len(lines), "lines": len(srcs)}


def frontier(a, work: Path, out: Path, cores: int) -> None:
    """Speed against BLEU (issue 78, item 3): each served student at each beam of ``--beams`` (and its
    report's), without and (``--vmap``) with the vocabulary shortlist, and (``--deep-row``) a plain
    24-layer model exported int8 at the report's beam; each against the teacher's fairseq-generate
    batched (the first student's report's beam and the setting its tuning pass chose), timed by the
    speed protocol (:func:`~deepnmt_fairseq.distill.report.timed_pairs`: interleaved with the teacher,
    calibrated, pinned); every ratio the median of the pairs with its interval and claim.  Each
    student is served at the batched setting its report chose (the deep row at the first student's)."""
    import re
    import statistics
    from dataclasses import asdict, replace
    from types import SimpleNamespace

    from deepnmt_deploy import speed_protocol as protocol
    from deepnmt_fairseq.distill.report import (BinarizedSplit, Measure, ReportInputs, Setting, params_of,
                                                sacrebleu_of, timed_pairs)

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
    first = next((s for s, _ in a.students if report_of(work, s).exists()), None)
    if first is None:
        raise SystemExit("the frontier needs one student's report (the teacher's setting and beam come from it)")
    rep0 = json.loads(report_of(work, first).read_text())
    search = rep0["search"]
    d0 = work / first
    r = ReportInputs(out=work / "frontier", data=DATA_WORK / "data-bin", teacher=Path(rep0["sizes"]["teacher"]["checkpoint"]),
                     student=d0, ct2=d0 / "ct2-int8", test_source=tok / "test.raw.en", test_reference=tok / "test.raw.de",
                     beam=search["beam"], lenpen=search["lenpen"], max_len_a=search["max_len_a"],
                     max_len_b=search["max_len_b"], speed_repeats=a.speed_repeats, speed_min_seconds=a.speed_min_seconds)
    m = Measure(r, log)
    taught = setting(rep0["systems"]["teacher fairseq-generate"]["batched"]["setting"])
    # the systems: (name, student, beam, shortlist, export directory, served setting, parameters, checkpoint)
    systems = []
    for s, _ in a.students:
        # a student without a report (--reports): served at the first report's setting, its averaged model
        rep = json.loads(report_of(work, s).read_text()) if report_of(work, s).exists() else None
        served = setting((rep or rep0)["systems"]["student deepnmt-translate"]["batched"]["setting"])
        ckpt = Path(rep["sizes"]["student"]["checkpoint"]) if rep else work / s / "student" / "checkpoint_avg3.pt"
        params = rep["sizes"]["student"]["parameters"] if rep else params_of(ckpt)
        for shortlist in ((False, True) if a.vmap else (False,)):
            ct2 = (exported(ckpt, work / s / "ct2-int8-vmap", True, cores) if shortlist else work / s / "ct2-int8")
            for beam in sorted(set(a.beams) | {r.beam}, reverse=True):
                systems.append((f"{s}-beam{beam}{'-vmap' if shortlist else ''}", s, beam, shortlist, ct2, served,
                                params, ckpt))
    if a.deep_row:
        ckpt = Path(a.deep_row).resolve()
        systems.append(("deep-row", "deep-row", r.beam, False, exported(ckpt, work / "deep-row" / "ct2-int8", False, cores),
                        setting(rep0["systems"]["student deepnmt-translate"]["batched"]["setting"]), params_of(ckpt), ckpt))
    # the rows measured so far (a stopped frontier goes on from there; the same protocol settings)
    partial = r.out / "rows.json"
    key = {"repeats": a.speed_repeats, "min_seconds": a.speed_min_seconds, "teacher": str(r.teacher),
           "teacher_setting": asdict(taught), "beam": r.beam}
    old = json.loads(partial.read_text()) if partial.exists() else {}
    done = old.get("rows", {}) if old.get("key") == key else {}
    with protocol.pinned(protocol.allowed_cores()) as pinned_to:
        teacher = m.fairseq("teacher", r.teacher, taught)  # the warm-up and calibration pass
        teacher_bleu = sacrebleu_of(_texts(teacher, r.ct2), refs)["sacrebleu"]
        for name, s, beam, shortlist, ct2, served, params, ckpt in systems:
            if name in done and done[name]["checkpoint"] == str(ct2):
                log(f"frontier: {name} measured before ({partial}), kept")
                continue
            ms = Measure(replace(r, beam=beam, ct2=ct2), log)
            run1 = ms.ct2(name, r.test_source, served)  # quality, warm-up and calibration
            both = SimpleNamespace(r=r, tmp=m.tmp, fairseq=m.fairseq, ct2=ms.ct2)
            timed = timed_pairs(both, split, srcs, "batched", list(range(len(srcs))),
                                {"teacher": (taught, teacher), "student": (served, run1)}, log)
            res = timed["result"]
            rate = {who: statistics.median(x["tokens"] / x["seconds"] for x in timed["runs"][who])
                    for who in ("teacher", "student")}
            lo, hi = res["interval"]
            row = {"system": name, "student": s, "beam": beam, "shortlist": shortlist, "teacher_beam": r.beam,
                   "sacrebleu": sacrebleu_of(run1["lines"], refs)["sacrebleu"], "teacher_sacrebleu": teacher_bleu,
                   "tokens_per_s": round(rate["student"], 1), "teacher_tokens_per_s": round(rate["teacher"], 1),
                   "speedup_batched": round(res["median"], 2),
                   "speedup_batched_interval": [math.floor(lo * 100) / 100, math.ceil(hi * 100) / 100],
                   "speedup_batched_claim": math.floor(lo * 100) / 100, "parameters": params,
                   "setting": run1["setting"], "teacher_setting": teacher["setting"], "timed": timed,
                   "loaded": any(x["load_before"] >= m.cores for runs in timed["runs"].values() for x in runs)}
            if shortlist:
                row["shortlist_cost"] = lost_share(work / s / "ct2-int8", ct2, srcs, beam, search)
            row["checkpoint"] = str(ct2)
            row["model"] = str(ckpt)
            done[name] = row
            partial.write_text(json.dumps({"key": key, "rows": done}, indent=1) + "\n")
    write_frontier(a, out, [done[name] for name, *_ in systems], pinned_to)


def _texts(run: dict, ct2: Path) -> list:
    """fairseq-generate's subword hypotheses back to text by the export's own pipeline (as the report)."""
    from deepnmt_deploy.text import TextPipeline, Tokenization
    from deepnmt_deploy.translate import read_metadata

    pipeline = TextPipeline(Tokenization.from_dict(read_metadata(str(ct2))["tokenization"]), str(ct2))
    return [pipeline.decode(run["hyps"][i].split()) for i in sorted(run["hyps"])]


def write_frontier(a, out: Path, rows: list, pinned_to) -> None:
    """``OUT/frontier.json`` (every timed run) and ``OUT/frontier.md`` (the table)."""
    from deepnmt_deploy import speed_protocol as protocol

    mc = protocol.machine(pinned_to)
    t = rows[0]
    lines = ["# Speed against BLEU at the study's scale: the served students' frontier (issue 78, item 3)", "",
             f"Teacher: fairseq-generate at beam {t['teacher_beam']} ({t['teacher_setting']}), sacreBLEU "
             f"{t['teacher_sacrebleu']}, timed in every row; each served system by deepnmt-translate at its "
             f"report's batched setting; the speed protocol ({a.speed_repeats} interleaved rounds of >= "
             f"{a.speed_min_seconds:g} s, deepnmt_deploy/speed_protocol.py): the claim is the lower bound of the 95% "
             f"interval of the median ratio. Shortlist: CTranslate2's vocabulary map built from the training pairs "
             f"(deepnmt-export-ct2 --vmap); its cost: the share of the full model's tokens (same beam, one sentence "
             f"a batch) that the shortlist of their source does not allow. Measured {time.strftime('%Y-%m-%d %H:%M:%S')} "
             f"on {mc.get('cpu')} ({' '.join(mc.get('vector_extensions') or [])}).", "",
             "| system | beam | shortlist | served sacreBLEU | served - teacher | batched tok/s served / teacher | "
             "speed-up batched: claim (median, 95% CI) | tokens lost to the shortlist | loaded |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        lo, hi = x["speedup_batched_interval"]
        cost = x.get("shortlist_cost")
        lines.append(f"| {x['student']} | {x['beam']} | {'yes' if x['shortlist'] else 'no'} | {x['sacrebleu']} | "
                     f"{x['sacrebleu'] - x['teacher_sacrebleu']:+.2f} | {x['tokens_per_s']:.0f} / "
                     f"{x['teacher_tokens_per_s']:.0f} | ≥{x['speedup_batched_claim']:.2f}x ({x['speedup_batched']}x, "
                     f"{lo:.2f}-{hi:.2f}) | "
                     + (f"{100 * cost['lost_share']:.2f}% ({cost['lines_losing']} of {cost['lines']} lines)" if cost else "")
                     + f" | {'yes' if x['loaded'] else 'no'} |")
    deep = [x for x in rows if x["student"] == "deep-row"]
    if deep:
        lines += ["", f"deep-row: `{deep[0]['model']}` exported int8 (a plain 24-layer model of the study's data; its "
                      "own training, not the teacher's: its BLEU difference mixes training with depth, its speed is "
                      "what 24 encoder layers cost in the engine)."]
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/serve_study.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    (out / "frontier.json").write_text(json.dumps({"rows": rows, "machine": mc, "command": command}, indent=2) + "\n")
    (out / "frontier.md").write_text("\n".join(lines + ["", f"Command: `{command}`"]) + "\n")
    print("\n".join(lines))


def agreement(first: dict, second: dict) -> dict:
    """The protocol's rerun check (:func:`deepnmt_deploy.speed_protocol.rerun_agreement`) on two
    tables: per student and kind (batched, single) present in both, the two claims (lower bounds) and
    their relative difference; ``all_within_10_percent``."""
    from deepnmt_deploy import speed_protocol as protocol

    def results(table: dict) -> dict:
        return {f"{r['student']} {kind}": {"claim": r[f"speedup_{kind}_claim"]} for r in table["rows"]
                for kind in ("batched", "single") if f"speedup_{kind}_claim" in r}

    agree = protocol.rerun_agreement({"results": results(first)}, {"results": results(second)})
    return {"pairs": agree, "all_within_10_percent": bool(agree) and all(v["within_10_percent"] for v in agree.values())}


def write_agreement(first: Path, second: Path, out: Path) -> dict:
    rec = {"first": str(first.relative_to(REPO) if first.is_relative_to(REPO) else first),
           "second": str(second.relative_to(REPO) if second.is_relative_to(REPO) else second),
           **agreement(json.loads(first.read_text()), json.loads(second.read_text()))}
    out.write_text(json.dumps(rec, indent=2) + "\n")
    log(f"rerun agreement: {json.dumps(rec['pairs'])}")
    return rec


def bleu_difference(report_dir: Path, refs: list) -> dict:
    """The served student's sacreBLEU minus the teacher's on the report's own translations
    (``student.deepnmt-translate.txt``, ``teacher.fairseq-generate.txt``) with the paired bootstrap's
    95% interval (:func:`deepnmt_fairseq.scoring.paired_bootstrap`, the evidence study's: Koehn 2004, seeded);
    None without those files (a report of another layout)."""
    files = [report_dir / f"{who}.txt" for who in ("student.deepnmt-translate", "teacher.fairseq-generate")]
    if not refs or not all(f.exists() for f in files):
        return None
    from deepnmt_fairseq.scoring import paired_bootstrap, sentence_stats

    hyps = {who: (report_dir / f"{who}.txt").read_text(encoding="utf-8").split("\n")[:len(refs)]
            for who in ("student.deepnmt-translate", "teacher.fairseq-generate")}
    return paired_bootstrap([sentence_stats(hyps["student.deepnmt-translate"], refs)],
                            [sentence_stats(hyps["teacher.fairseq-generate"], refs)])


def write_table(a, work: Path, out: Path, name: str, record: dict, reports=None) -> None:
    from deepnmt_fairseq.distill.report import speed_claim

    ref_file = DATA_WORK / "tok" / "test.raw.de"
    refs = ref_file.read_text(encoding="utf-8").splitlines() if ref_file.exists() else []
    rows = []
    for s, u in a.students:
        if reports is not None and s not in reports:
            continue
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
                     "bleu_difference": bleu_difference(work / s / "report", refs),
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


def doc_tables(run: Path, rerun: Optional[Path] = None) -> str:
    """docs/distill.md's study-scale tables, written from the records (``run``: a ``--out`` directory
    with table.json and frontier.json; ``rerun``: the ``--remeasure`` run's, with agreement.json), so
    that every figure the docs give is a record's (tests/test_docs_figures.py compares them)."""
    def claim(r: dict, kind: str) -> str:
        lo, hi = r[f"speedup_{kind}_interval"]
        return f"≥{r[f'speedup_{kind}_claim']:.2f}x ({r[f'speedup_{kind}']:.2f}x, {lo:.2f}-{hi:.2f})"

    table = json.loads((run / "table.json").read_text())
    runs = [("run 1", table)]
    if rerun is not None:
        runs.append(("run 2 (`--remeasure`: the tuning pass's choice frozen)", json.loads((rerun / "table.json").read_text())))
    teacher = {r["teacher_bleu"] for _, t in runs for r in t["rows"]}
    lines = [f"| student (updates), report | served sacreBLEU (teacher {'/'.join(f'{x:.2f}' for x in sorted(teacher))}) | "
             "served - teacher (paired bootstrap 95% CI) | batched: claim (median, 95% CI) | "
             "one sentence: claim (median, 95% CI) |",
             "|---|---|---|---|---|"]
    for label, t in runs:
        for r in t["rows"]:
            d = r.get("bleu_difference")
            ci = f" ({d['low']:+.2f} to {d['high']:+.2f})" if d else ""
            lines.append(f"| {r['student']} ({r['updates']}), {label} | {r['served_bleu']:.2f} | "
                         f"{r['served_minus_teacher']:+.2f}{ci} | {claim(r, 'batched')} | {claim(r, 'single')} |")
    if rerun is not None and (rerun / "agreement.json").exists():
        agree = json.loads((rerun / "agreement.json").read_text())
        parts = [f"{name}: {v['claims'][0]:.2f}x and {v['claims'][1]:.2f}x, {100 * v['relative_difference']:.1f}% apart"
                 for name, v in agree["pairs"].items()]
        lines += ["", f"Rerun agreement (the lower bounds of the two runs): {'; '.join(parts)}; within 10%: "
                      f"{'yes' if agree['all_within_10_percent'] else 'no'}."]
    if (run / "frontier.json").exists():
        rows = json.loads((run / "frontier.json").read_text())["rows"]
        lines += ["", f"| system | beam | shortlist | served sacreBLEU | served - teacher ({rows[0]['teacher_sacrebleu']:.2f}) | "
                      "batched: claim (median) | tokens lost to the shortlist |", "|---|---|---|---|---|---|---|"]
        for x in rows:
            cost = x.get("shortlist_cost")
            lines.append(f"| {x['student']} | {x['beam']} | {'yes' if x['shortlist'] else 'no'} | {x['sacrebleu']:.2f} | "
                         f"{x['sacrebleu'] - x['teacher_sacrebleu']:+.2f} | ≥{x['speedup_batched_claim']:.2f}x "
                         f"({x['speedup_batched']:.2f}x) | "
                         + (f"{100 * cost['lost_share']:.2f}%" if cost else "") + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
