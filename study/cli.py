"""Evidence study: each paper's central effect, measured with models that learn, with seeds.

    python -m study [--preset cpu|gpu|tiny] [--only depth deep-decoder gpkd ssl converged]
                    [--jobs 2] [--threads 1] [--seeds 1 2] [--report-only | --prepare-only]
                    [--work-dir work/fidelity/<preset>] [--report docs/fidelity[-gpu].md]
                    [--records benchmarks/results/fidelity/<preset>] [--deadline-minutes M]

Every number is a ``fairseq-train``/``fairseq-generate`` command of this repository (listed in the
report).  Runs are resumable: a finished run (``runs/<name>/done.json``) is never recomputed, an
interrupted one resumes from its ``checkpoint_last.pt``, so the study survives being stopped and
can be spread over several sessions; ``--report-only`` writes the report from what has finished.
Each finished run's result is also kept as a *record* (``--records``, committed with the report:
``benchmarks/results/fidelity/<preset>/<run>.json``), so that a fresh clone, whose ``work/`` is
empty, reuses it too and regenerates the same report.  A run that still needs the checkpoint of a
recorded run (the GPKD teacher for the SKD data, stage 1 of the skipping study) retrains that run
in the work directory first (:meth:`study.run.Study.rebuild`).  The data is rebuilt too, and checked:
``<records>/data.json`` holds the sha256 of every binarized file the records' runs read, and a command
whose rebuilt data differs stops before it trains, naming the files (:func:`study.run.check_data`).
``--deadline-minutes`` stops the running commands at a wall-clock limit (exit code 3), for
machines lent in 10-minute commands: the same command goes on.  SIGTERM or SIGINT during the runs
(not the data preparation before them) stops the study the same way within a second (exit code
128 + the signal; :meth:`study.launcher.Launcher.stopping_on_signals`).

Presets (:data:`study.plan.PRESETS`): ``cpu`` = the bundled LibreOffice-help corpus at width 128 and 1600
updates (the pre-norm 6-layer baseline reaches 14 sacreBLEU); ``gpu`` = the evidence corpus of
``scripts/build_evidence_corpus.py`` (``--corpus``) at IWSLT-small shapes in bf16; ``tiny`` = a few
updates of width-16 models on 400 sentence pairs (the CI test of the whole pipeline).

Comparisons (each paper's central claim; docs/fidelity.md has the results):

1. **depth** (MSC Fig. 2 / Table 3; Bapna et al. Table 1): post-norm, pre-norm, transparent on
   post-norm (Bapna's setting) and on pre-norm (MSC's), DLCL and MSC encoders at three depths,
   3 decoder layers; train loss, valid loss, test BLEU and the BLEU on a sample of the training
   sentences (the degradation test of Fig. 2: a deeper plain net fits its own training data worse).
2. **deep decoder** (Sec. 3-4): a search over plain decoder depths (6-layer encoder) for a depth
   that is worse than the shallow decoder *and* whose predictions depend less on the source
   (the UNK-source NLL gap); at that depth plain vs CAD vs collapse-reducing training (CRT:
   DDR + ALD) vs CAD + CRT.
3. **GPKD** (Tables 1, 6): a GP-trained deep teacher vs the 6-layer baseline; SKD data from the
   *averaged* teacher; a student initialised with one layer per group (h = teacher layers /
   student layers, the group size the teacher was trained with) vs the same student trained on
   the SKD data from scratch vs the baseline on the references.
4. **skipping sub-layer** (Tables 3-4): a deep pre-norm model trained until its validation loss
   stops improving (``--patience``); a second stage with skipping (phi 0.4) vs the same second
   stage without it, both continuing stage 1's optimizer state, schedule and update count
   (``--continue-once``: no warm-up restart at the peak rate).
5. **converged** (evidence round 2): the depth study's systems trained until the valid loss stops
   improving (``Preset.converged_patience`` validations) or ``Preset.converged_cap`` updates, 3 seeds,
   with a checkpoint every ``Preset.curve_every`` updates kept and evaluated (BLEU-vs-updates
   curves); at the deepest depth the subset of :data:`study.plan.CONVERGED_DEEPEST` and the
   transparent variant with the lower valid NLL at the middle depth.  Section 1's 1600-update tables
   are the short-budget setting.

Every headline system is trained with each seed of ``--seeds`` (at least 2); the report gives the
mean and the spread (max - min).  One rule makes every call (``study.report.call``): the means
differ by more than both systems' spreads, and, for test BLEU, both the paired bootstrap over the test
sentences and the seed-level bootstrap (seeds, then sentences; ``study/stats.py``) give p < 0.05;
records made before the sentence statistics were kept are called on the spreads and the seeds' scores,
and say so.  A call within 0.5 BLEU of the larger spread is "narrow"; the report marks calls whose two
sides ran on different CPU types and runs still improving at their stop.  The deep-decoder depth and
the transparent variant are chosen on valid NLL; the 1600-update budget and post-norm's schedule were
chosen on test BLEU (docs/fidelity.md says so).
A headline comparison (:func:`study.plan.headline_pairs`) whose 2-seed test-BLEU means differ by less than
``Preset.close_bleu`` (1 BLEU) then gets a third seed of both systems (issue 16: "3 where the
difference is under 1 BLEU").

The study's modules and what each owns: :mod:`study` (study/__init__.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
import time

from .launcher import Deadline
from .plan import PRESETS, STUDIES, dd_depth, finished, outputs, planned, stamp_settings
from .report import is_committed, write_report
from .retune import write as write_retune
from .run import Study, check_data, log, prepare, run_study


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m study", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--work-dir", help="default: work/fidelity/<preset>")
    ap.add_argument("--only", nargs="*", choices=STUDIES, default=list(STUDIES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="seeds of every headline system (>= 2)")
    ap.add_argument("--report-only", action="store_true", help="write the report from the finished runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at the same time")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--order", choices=["long-first", "short-first"], default="long-first",
                    help="order of the independent runs (long-first: shortest total time)")
    ap.add_argument("--runs", nargs="+", metavar="PATTERN", default=[],
                    help="train only the planned runs whose names match one of these shell patterns, in the "
                         "patterns' order (e.g. 'conv-*-12-s1' 'conv-*-12-s2': every 12-layer system's first "
                         "seed before any second) within each of the study's three phases (the runs that need no other; "
                         "those that need them: GPKD students, SSL stage 2, the deep-decoder comparison, the deepest "
                         "transparent runs; the third seeds of close comparisons), never across them; the report "
                         "still covers every finished run")
    ap.add_argument("--exec", action="store_true",
                    help="start every command as a new process (default: forked from one interpreter that "
                         "has imported torch and fairseq; same argv and environment, without the imports)")
    ap.add_argument("--corpus", help="corpus directory ({train,valid,test}.{en,de}.gz); default: the preset's")
    ap.add_argument("--prepare-only", action="store_true",
                    help="build the preset's binarized data in the work directory, then stop (to carry it to "
                         "a machine without network: study/lease.sh pack)")
    ap.add_argument("--report", help="default: docs/fidelity.md (cpu), docs/fidelity-gpu.md (gpu); "
                                      "with --work-dir or another preset: <work-dir>/report.md")
    ap.add_argument("--records", metavar="DIR",
                    help="where every finished run's result is also kept, to be committed: a fresh clone "
                         "reuses them (default: benchmarks/results/fidelity/<preset> for cpu and gpu; with "
                         "--work-dir or another preset: <work-dir>/records)")
    ap.add_argument("--add-statistics", action="store_true",
                    help="train again the selected runs (--runs) whose records lack the sentence statistics "
                         "of the paired bootstrap (the first round's): a run that reproduces its record "
                         "(deterministic training) adds them to it; one that does not is kept as "
                         "<run>.rebuilt.json and the record stays")
    ap.add_argument("--cuda", action="store_true",
                    help="train and evaluate a float32 preset (cpu) on the GPU: the same commands without "
                         "--cpu, TensorFloat-32 off (NVIDIA_TF32_OVERRIDE=0); each record says so "
                         "(machine.device: cuda) and its seconds stay out of the status line's CPU budget")
    ap.add_argument("--deadline-minutes", type=float, metavar="M",
                    help="stop after M minutes of wall time (the running commands are stopped, the report is "
                         "written, exit code 3); the same command resumes. For machines lent by the 10 minutes. "
                         "SIGTERM or SIGINT during the runs stops the study the same way (exit code 128 + the signal)")
    a = ap.parse_args(argv)
    # fairseq's wav2vec2_classification module calls logging.basicConfig(level=DEBUG) when it is
    # imported (by the checkpoint reader here); configure the root logger first so that its
    # call does nothing and matplotlib's font search does not flood the output
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(set(a.seeds)) < 2:
        ap.error("--seeds: every headline comparison needs at least 2 seeds (issue 16)")
    p = PRESETS[a.preset]
    if a.corpus:
        p = dataclasses.replace(p, corpus=a.corpus)
    work, records, report = outputs(a.preset, a.work_dir, a.records, a.report)
    for d, flag in ((work, "--work-dir"), (records, "--records")):
        stamp_settings(d, p, flag)
    deadline = None if a.deadline_minutes is None else time.time() + 60 * a.deadline_minutes
    stopped, signalled = False, None
    if a.prepare_only:
        data = prepare(p, work)[0]
        check_data(data, records)
        log(f"data ready: {data}")
        return 0
    if a.runs and not a.report_only:
        import fnmatch

        names = planned(p, a.seeds, dd_depth(work, records), finished(work, records))
        for pat in a.runs:
            if not any(fnmatch.fnmatchcase(n, pat) for n in names):
                ap.error(f"--runs {pat!r} matches none of the study's {len(names)} planned runs "
                         f"(e.g. {', '.join(names[:3])}; docs/fidelity.md's status line lists those not yet run)")
    if a.cuda and not a.report_only:
        import torch

        if not torch.cuda.is_available():
            ap.error("--cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if not a.report_only:
        data, tok = prepare(p, work)
        check_data(data, records)  # the records' runs were trained on this data, or the study stops here
        study = Study(p, work, data, tok, a.threads, a.order == "short-first", fork=not a.exec, deadline=deadline,
                      records=records, select=a.runs, add_statistics=a.add_statistics, cuda=a.cuda)
        try:
            with study.launch.stopping_on_signals():  # kill or Ctrl-C: as the deadline, now
                run_study(study, p, a.only, a.seeds, a.jobs)
        except Deadline:
            stopped = True
        except Exception as e:  # e.g. a command the signal ended before the study's handler ran
            if study.launch.signalled is None:
                raise
            log(f"after the signal: {e!r}")
            stopped = True
        signalled = study.launch.signalled if stopped else None  # a signal as the study ended: no matter
    results = finished(work, records)
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if is_committed(p, report):  # issue 77's generated words first: the report embeds the findings
        write_retune(p, results)
    write_report(results, p, report, work, planned(p, a.seeds, dd_depth(work, records), results),
                 records=records)
    log(f"report: {report} ({len(results)} runs)")
    if signalled:
        log(f"stopped by {signal.Signals(signalled).name}: the running commands were stopped; "
            "the same command resumes the study")
        return 128 + signalled
    if stopped:
        log(f"--deadline-minutes {a.deadline_minutes:g} reached: the running commands were stopped; "
            "the same command resumes the study")
        return 3
    return 0


