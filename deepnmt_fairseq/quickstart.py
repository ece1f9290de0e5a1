"""The whole job on the embedded LibreOffice-help corpus (en->de), on the CPU.

    python scripts/quickstart.py [--work-dir work/quickstart] [--max-update N] ...
    (or bash scripts/quickstart.sh, which sets up the environment first)

From a checkout the corpus is the repository's data/libreoffice-help/en-de and the work directory
work/quickstart; the installed package alone (no checkout) needs --corpus DIR (a directory of
{train,valid,test}.{en,de}.gz files) and works under ./work/quickstart.

Steps, each a stage of the project's job runner (deepnmt_fairseq/jobs/runner.py: skipped when its
output is complete, an interrupted training resumes; nothing is overwritten):
  1. tokenize (sacremoses) and learn/apply a joint BPE (subword-nmt);
  2. fairseq-preprocess with a joined dictionary;
  3. fairseq-train a small MSC model of this plugin (--user-dir);
  4. average the last checkpoints (deepnmt-average-checkpoints);
  5. fairseq-generate on the test split (beam 5, no sentence dropped);
  6. detokenize and score with sacreBLEU, next to a copy-the-source baseline;
  7. train deep, serve shallow (with the deploy extra, CTranslate2): the MSC model cannot be
     exported (its decoder reads encoder blocks and context states), so deepnmt-distill distils
     *this* MSC model into a pre-norm student of the same width, 6 encoder layers and one decoder
     layer (--student 6-1; the teacher's depths: --student auto): SKD data from the
     averaged MSC teacher (beam 4, --skd-beam), the student started from the teacher's matching weights
     and trained on it with the same settings for twice the updates (--student-updates), exported int8
     with the vocabulary shortlist (deepnmt-distill --vmap: work/quickstart/distill/ct2-int8-vmap; --no-vmap:
     ct2-int8 without it) and served by deepnmt-translate on the raw test set; its report
     (work/quickstart/distill/report-vmap/report.{md,json}; --no-vmap: report/) compares teacher and served
     student: sacreBLEU and tokens/s, batched and one sentence at a time, by the shortened speed protocol
     (docs/distill.md).  --deploy off skips the step.

A re-run with the same settings only prints the results (a work directory whose step 7 ran without
the shortlist, before it was the default, gets the shortlist's export and report: nothing retrained);
a re-run with other settings refuses to touch the existing work directory (use a new --work-dir).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from deepnmt_data import small_corpus

from .jobs.decode import Search, generate, generate_command
from .jobs.fairseq_argv import fairseq_train
from .jobs.runner import Runner, settings_guard
from .jobs.stage import Stage, make_log, quote

REPO = Path(__file__).resolve().parents[1]
DATA = small_corpus.EMBEDDED  # the corpus a checkout ships
#: where the work goes by default: the checkout's work/ (as before), else the current directory's
WORK = (REPO if DATA.is_dir() else Path.cwd()) / "work" / "quickstart"
SRC, TGT = "en", "de"

log = make_log("quickstart", stdout=True)


# ---------------------------------------------------------------- step 1-2
def prepare(work: Path, bpe_merges: int, train_pairs: int | None = None, data: Path = DATA) -> Path:
    """Tokenize, BPE and binarize the embedded corpus (or another corpus directory ``data``
    with the same {train,valid,test}.{en,de}.gz files) into ``work/data-bin`` (once): the one
    data preparation, :func:`deepnmt_data.small_corpus.prepare`, with the quickstart's log.

    ``train_pairs`` keeps only the first N training pairs (smoke tests)."""
    from .console import child_env

    return small_corpus.prepare(work, bpe_merges, data, train_pairs, SRC, TGT, log=log,
                                binarize=lambda argv: small_corpus.fairseq_preprocess(
                                    argv, env=child_env(dict(os.environ, PYTHONUNBUFFERED="1")), log=log))


def prepare_stage(work: Path, a, data: Path) -> Stage:
    """Steps 1-2 as the project's stage: :func:`prepare` in this process; done when
    ``work/data-bin/.done`` exists (written last by the preparation)."""
    bin_dir = work / "data-bin"
    # prepare is looked up when the stage runs (a test replaces it)
    return Stage("prepare", [], bin_dir, done=bin_dir / ".done", kind="prepare",
                 call=lambda: prepare(work, a.bpe_merges, a.train_pairs, data),
                 what="tokenize, learn and apply a joint BPE, fairseq-preprocess")


# ---------------------------------------------------------------- step 3-4
def model_flags(a) -> list:
    """The quickstart's MSC model (N blocks of M encoder layers, N decoder layers)."""
    return [
        "--arch", "deepnmt_transformer", "--deep-memory", "msc", "--msc-block-layers", str(a.block_layers),
        "--decoder-layers", str(a.blocks), "--share-all-embeddings",
        "--encoder-embed-dim", str(a.dim), "--decoder-embed-dim", str(a.dim),
        "--encoder-ffn-embed-dim", str(2 * a.dim), "--decoder-ffn-embed-dim", str(2 * a.dim),
        "--encoder-attention-heads", str(a.heads), "--decoder-attention-heads", str(a.heads),
        "--dropout", "0.1", "--attention-dropout", "0.0",
    ]


def train_flags(a) -> list:
    """The optimization flags of every model the quickstart trains (the MSC teacher, the student)."""
    return ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
            "--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(a.warmup),
            "--max-tokens", str(a.max_tokens)]


def train_stages(work: Path, bin_dir: Path, a) -> list:
    """Steps 3-4 as the project's stages: fairseq-train of the MSC model, then the average of its
    last checkpoints (each skipped when done; an interrupted training resumes)."""
    ckpt = work / "checkpoints"
    avg = ckpt / "checkpoint_avg.pt"
    argv = fairseq_train(bin_dir, model_flags(a), [
        "--task", "translation", *train_flags(a), "--max-update", a.max_update, "--save-dir", ckpt,
        "--save-interval-updates", a.save_every, "--keep-interval-updates", a.average,
        "--keep-last-epochs", a.average, "--validate-after-updates", max(0, a.max_update - 3 * a.save_every),
        "--log-format", "simple", "--log-interval", "25", "--seed", a.seed, "--cpu",
        "--num-workers", "0", "--skip-invalid-size-inputs-valid-test"])
    return [Stage("train", argv, ckpt, marker=True, kind="train", what="fairseq-train the MSC model"),
            Stage("average", ["deepnmt-average-checkpoints", "--inputs", ckpt, "--num-checkpoints", a.average,
                              "--output", avg], avg, kind="average",
                  what=f"average the last {a.average} checkpoints")]


# ---------------------------------------------------------------- step 5-6
def evaluate_stage(work: Path, bin_dir: Path, model: Path, a) -> Stage:
    """Steps 5-6 as the project's stage: :func:`evaluate` in this process; done when
    ``work/eval/results.json`` exists (written last)."""
    results = work / "eval" / "results.json"
    return Stage("evaluate", [], results, kind="report", call=lambda: evaluate(work, bin_dir, model, a),
                 what="fairseq-generate the test split (beam 5), detokenize, sacreBLEU")


def evaluate(work: Path, bin_dir: Path, model: Path, a, out_dir: Path | None = None) -> dict:
    from . import scoring
    from .console import child_env

    out_dir = out_dir or work / "eval"
    results = out_dir / "results.json"
    if results.exists():
        return json.loads(results.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = out_dir / "generate-test.txt"
    if not gen.exists():
        argv = generate_command(bin_dir, model, Search(beam=5, lenpen="1.0", batch_size=64, max_len_a=1.2,
                                                       max_len_b=a.max_len_b, remove_bpe=True), "test",
                                cpu=True, resolve=True)
        log("$ " + " ".join(argv))
        # fairseq's log (its "Translated ... tokens/s" line) goes to stderr
        generate(argv, gen, stderr=out_dir / "generate-test.log",
                 env=child_env(dict(os.environ, PYTHONUNBUFFERED="1")))
    from deepnmt_fairseq.generate_output import parse_generate

    hyps = parse_generate(gen.read_text(encoding="utf-8"))["hyps"]
    tok = work / "tok"
    refs = (tok / f"test.raw.{TGT}").read_text(encoding="utf-8").splitlines()
    srcs = (tok / f"test.raw.{SRC}").read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(refs):
        raise SystemExit(f"fairseq-generate translated {len(hyps)} of {len(refs)} test sentences")
    gen_log = out_dir / "generate-test.log"
    speed = re.search(r"Translated [\d,]+ sentences \(([\d,]+) tokens\) in ([\d.]+)s",
                      gen_log.read_text(encoding="utf-8") if gen_log.exists() else "")
    detok = scoring.detokenize([hyps[i] for i in range(len(refs))], TGT, join_at=False)
    hyp_file = out_dir / f"test.hyp.{TGT}"
    hyp_file.write_text("\n".join(detok) + "\n", encoding="utf-8")
    bleu = scoring.corpus_bleu(detok, refs)
    copy = scoring.corpus_bleu(srcs, refs)
    tok_refs = (tok / f"test.tok.{TGT}").read_text(encoding="utf-8").splitlines()
    tok_bleu = scoring.corpus_bleu([hyps[i] for i in range(len(refs))], tok_refs, tokenize="none", force=True)
    res = {
        "sacrebleu": round(bleu.score, 2),
        "signature": bleu.signature,
        "tokenized_bleu": round(tok_bleu.score, 2),
        "copy_source_sacrebleu": round(copy.score, 2),
        "sentences": len(refs),
        # fairseq-generate's own count: target subword tokens per second of its generation loop
        "tokens_per_s": round(int(speed[1].replace(",", "")) / max(float(speed[2]), 1e-9), 1) if speed else None,
        "translations": str(hyp_file),
        "model": str(model),
    }
    results.write_text(json.dumps(res, indent=2) + "\n")
    return res


def deployment_note(model: Path, bin_dir: Path) -> str:
    """Whether the quickstart's model exports to CTranslate2 (docs/deployment.md)."""
    try:
        from deepnmt_fairseq.deploy.export import load_model, refusals

        m, cfg, _ = load_model(str(model), str(bin_dir))
        why = refusals(m, cfg.model)
    except Exception as e:  # noqa: BLE001 - a note, never a failure of the quickstart
        return f"CTranslate2 export: not checked ({type(e).__name__}: {e})"
    if why:
        return (f"CTranslate2 export: not exportable ({why[0].split(':')[0]}: its decoder reads encoder blocks "
                f"and context states); step 7 distils it into an exportable student (deepnmt-distill, docs/distill.md)")
    return f"CTranslate2 export: deepnmt-export-ct2 {model} OUT_DIR --quantization int8"


# ---------------------------------------------------------------- step 7
def student_updates(a) -> int:
    """Step 7's student updates: --student-updates, else twice the teacher's (at least the averaged
    checkpoints' span)."""
    return max(a.student_updates or 2 * a.max_update, a.average * a.save_every)


def step7_report(work: Path, a) -> Path:
    """Step 7's report directory (deepnmt-distill's, with or without the shortlist)."""
    from .distill.command import report_name

    return work / "distill" / report_name(a.vmap)


def deploy_stage(work: Path, bin_dir: Path, model: Path, a) -> Stage:
    """Step 7 as the project's stage: train deep, serve shallow - ``deepnmt-distill`` from the
    quickstart's own MSC model (the teacher) to a served int8 student (--student, 6-1 by default);
    done when its report exists (deepnmt-distill writes it last)."""
    d = work / "distill"
    tok = work / "tok"
    argv = ["deepnmt-distill", "--teacher", model, "--data", bin_dir, "--work-dir", d,
            "--test-source", tok / f"test.raw.{SRC}", "--test-reference", tok / f"test.raw.{TGT}",
            "--bpe-codes", tok / "bpe.codes",
            "--student-args", "--attention-dropout 0.0",  # as the teacher (model_flags)
            # SKD with GPKD's beam 4 (--skd-beam 1: greedy, a third of the time, a lower student)
            "--skd-args", f"--beam {a.skd_beam} --batch-size 128",
            # one string that deepnmt-distill splits as a shell would (shlex)
            "--train-args", quote(train_flags(a)),
            # twice the teacher's updates: with 800 (the teacher's) the served student stayed 1.69
            # sacreBLEU below the teacher, with 1600 0.58 (docs/distill.md); it costs time
            "--student-updates", student_updates(a), "--save-interval-updates", a.save_every,
            "--average", a.average,
            "--seed", a.seed, "--beam", "5", "--lenpen", "1.0", "--max-len-a", "1.2", "--max-len-b", a.max_len_b,
            "--cpu", *(["--single-sentences", a.single_sentences] if a.single_sentences else []),
            *speed_flags(a),
            *(["--student", a.student] if a.student != "auto" else []),
            # the vocabulary shortlist (issue 78): on the step-7 record it took the batched claim from
            # >=9.1x to >=10.82x for 0.15 sacreBLEU (benchmarks/results/distill-step7/)
            *(["--vmap"] if a.vmap else [])]
    return Stage("distill", argv, step7_report(work, a) / "report.json", kind="distill",
                 what=f"distil the MSC model into a served int8 student ({a.student}): deepnmt-distill")


#: step 7's shortened speed protocol (docs/distill.md): the protocol's 5 interleaved rounds, each run
#: >= 2 s of decoding (the protocol's 10 s would add about 5-6 minutes on 2 cores), one sentence at a
#: time on about 100 test sentences.  From the committed step-7 record's pass times (teacher 12.9 s
#: batched on AVX-512, 606 tok/s i.e. ~26 s on AVX2), the timed rounds add about 3 min (AVX-512) to
#: 4.5 min (AVX2) on 2 cores; the teacher's whole-test-set pass in each of the 5 rounds is most of it
STEP7_SPEED_REPEATS, STEP7_SPEED_MIN_SECONDS, STEP7_SINGLE_SENTENCES = 5, 2.0, 100


def speed_flags(a) -> list:
    """deepnmt-distill's speed-protocol flags for step 7's report (the quickstart's shortened protocol)."""
    return ["--speed-repeats", a.speed_repeats, "--speed-min-seconds", f"{a.speed_min_seconds:g}"]


def deploy_line(rep: dict) -> str:
    """Step 7's result line: quality, and the speed claims (the lower bounds of the 95% intervals)
    with the medians; a report measured before the speed protocol: its ratios."""
    from .distill.report import speed_claim

    s, sm = rep["systems"], rep["summary"]
    t, f, c = s["teacher fairseq-generate"], s["student fairseq-generate"], s["student deepnmt-translate"]
    loaded = " (measured on a loaded machine)" if rep["loaded_machine"] else ""
    protocol = (rep.get("speed") or {}).get("protocol")
    short = ""
    if protocol and not protocol["meets_protocol"]:
        rounds = f"{protocol['repeats']} round{'s' if protocol['repeats'] != 1 else ''}"
        short = (f" (shortened speed protocol: {rounds} of >= {protocol['min_seconds']:g} s)"
                 if protocol["repeats"] < 5 or protocol["min_seconds"] < 10 else
                 " (some timed runs held less work than asked: not the protocol's claim)")
    shortlist = " with the vocabulary shortlist" if rep["sizes"]["served"].get("shortlist") else ""
    return (f"served student (MSC teacher distilled by deepnmt-distill, CTranslate2 {rep['sizes']['served']['quantization']}"
            f"{shortlist}): "
            f"sacreBLEU {c['sacrebleu']} (teacher {t['sacrebleu']}, student with fairseq-generate {f['sacrebleu']}); "
            f"{c['batched']['tokens_per_s']:.0f} tok/s batched, {c['single']['tokens_per_s']:.0f} one sentence at a time "
            f"= {speed_claim(sm, 'batched')} batched / {speed_claim(sm, 'single')} one sentence at a time the teacher's "
            f"fairseq-generate ({t['batched']['tokens_per_s']:.0f} / {t['single']['tokens_per_s']:.0f} tok/s){short}{loaded}")


#: the committed record of measured quickstart times (package data): entries by CPU kind, each with the
#: version of the quickstart it timed; a complete run writes its own entry (:func:`write_time_record`)
TIMES = Path(__file__).with_name("quickstart_times.json")

#: the quickstart's version, as its time records name it: 1 = step 7 with the 6-3 student and fixed
#: thread settings; 2 = step 7 with the 6-1 student, its settings search and the shortened speed
#: protocol (issues 71 and 78).  Raise it when a change moves the quickstart's time.
QUICKSTART_VERSION = 2
VERSION_WORDS = {1: "step 7 with the 6-3 student and fixed thread settings",
                 2: "step 7 with the 6-1 student, its settings search and the shortened speed protocol "
                    "(and, since 2026-12-05, the vocabulary shortlist)"}


def time_runs() -> List[dict]:
    """Every entry of :data:`TIMES` (an entry without ``version`` timed version 1)."""
    return [{"version": 1, **r} for r in json.loads(TIMES.read_text())["runs"]]


def measured_times() -> Dict[str, dict]:
    """{kernels: that kind's entry of the newest version (the latest date among equals)}."""
    newest: Dict[str, dict] = {}
    for r in sorted(time_runs(), key=lambda r: (r["version"], r["date"])):
        newest[r["kernels"]] = r
    return newest


def _minutes(run: dict) -> int:
    return round(_raw_minutes(run))


def _raw_minutes(run: dict) -> float:
    return (run["seconds"] - run.get("setup_seconds", 0)) / 60


def reference_minutes(kernels: str) -> Tuple[float, str]:
    """Minutes of the current quickstart with the defaults on 2 cores of this CPU kind (another kind
    reads as the slower AVX2 one), set-up excluded, and where the figure comes from.  A kind timed
    only on an older version is scaled by how much the version changed the time on a kind timed on
    both (the record's ratio, named in the words); with no such kind, its old time, said so."""
    runs, times = time_runs(), measured_times()
    ref = times.get(kernels, times.get("AVX2") or next(iter(times.values())))
    if ref["version"] == QUICKSTART_VERSION:
        return _raw_minutes(ref), f"measured {ref['date']} on this version, {ref['kernels'].replace('512', '-512')}"
    for other in sorted({r["kernels"] for r in runs}):
        new = sorted((r for r in runs if r["kernels"] == other and r["version"] == QUICKSTART_VERSION),
                     key=lambda r: r["date"])
        old = sorted((r for r in runs if r["kernels"] == other and r["version"] == ref["version"]),
                     key=lambda r: r["date"])
        if new and old:
            ratio = _raw_minutes(new[-1]) / _raw_minutes(old[-1])
            return (_raw_minutes(ref) * ratio,
                    f"{ref['kernels']} timed {ref['date']} on version {ref['version']} "
                    f"({VERSION_WORDS.get(ref['version'], '?')}), scaled x{ratio:.2f} as the change "
                    f"to version {QUICKSTART_VERSION} measured on {other.replace('512', '-512')}")
    return _raw_minutes(ref), f"timed {ref['date']} on version {ref['version']}, not this version"


def estimate(a, kernels: str, cores: int) -> str:
    """The line the quickstart prints before it starts: its expected time on this machine, from the
    measured times of :data:`TIMES` (:func:`reference_minutes`), scaled by the cores (the runs use
    every core; 2 were measured) and by the training pairs and updates asked for; and the options that
    make it shorter.  The line says which measurement the figure comes from."""
    base, source = reference_minutes(kernels)
    share = min(a.train_pairs or 18000, 18000) / 18000  # SKD and the step-7 report scale with the data
    minutes = base * (2 / max(1, min(cores, 8))) * (a.max_update / 800) * (0.55 + 0.45 * share)
    if a.deploy == "off":
        minutes *= 0.35  # steps 1-6 only: about a third of the default run (quickstart-timing.txt)
    measured = ", ".join(f"{_minutes(r)} min {k.replace('512', '-512')} (version {r['version']})"
                         for k, r in sorted(measured_times().items(), reverse=True))
    return (f"estimated time on this machine ({kernels} kernels, {cores} cores): about {max(1, round(minutes))} min "
            f"({source}; the records, with the defaults on 2 cores, set-up excluded: {measured}); "
            f"shorter: --train-pairs 3000, --deploy off")


def write_time_record(work: Path, a, seconds: float, complete: bool) -> Optional[Path]:
    """After a run that did every step from an empty work directory (``complete``): its time, machine
    and options as an entry of :data:`TIMES`'s format, in ``WORK/quickstart-time.json``.  The
    environment's set-up time, which scripts/quickstart.sh measures before it starts this program
    (``DEEPNMT_SETUP_SECONDS``: a few seconds where the environment was already set up), is part of
    ``seconds`` and recorded apart as ``setup_seconds``, which the estimate leaves out."""
    if not complete:
        return None
    from .machine import cores, cpu_kernels, cpu_model

    try:
        setup = max(0, int(os.environ.get("DEEPNMT_SETUP_SECONDS") or 0))
    except ValueError:  # not a number: no set-up time, rather than a crash at the end of the run
        setup = 0
    entry = {"kernels": cpu_kernels(), "cpu": cpu_model(), "date": time.strftime("%Y-%m-%d"),
             "seconds": round(seconds) + setup, "cores": cores(), "setup_seconds": setup,
             # every option that moves the time: an entry of other options is not the defaults' estimate
             "options": {"train_pairs": a.train_pairs, "max_update": a.max_update, "deploy": a.deploy,
                         "vmap": a.vmap, "student": a.student, "skd_beam": a.skd_beam,
                         "student_updates": a.student_updates, "speed_repeats": a.speed_repeats,
                         "speed_min_seconds": a.speed_min_seconds, "single_sentences": a.single_sentences},
             "version": QUICKSTART_VERSION, "quickstart": VERSION_WORDS[QUICKSTART_VERSION],
             "source": f"{work}/quickstart-time.json"}
    path = work / "quickstart-time.json"
    path.write_text(json.dumps(entry, indent=1) + "\n")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default=str(WORK))
    p.add_argument("--corpus", metavar="DIR",
                   help="the corpus: {train,valid,test}.{en,de}.gz files (default: the checkout's embedded "
                        "LibreOffice-help corpus, data/libreoffice-help/en-de; needed without a checkout)")
    p.add_argument("--bpe-merges", type=int, default=4000)
    p.add_argument("--blocks", type=int, default=3, help="MSC blocks N = decoder layers")
    p.add_argument("--block-layers", type=int, default=2, help="encoder layers per block M")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-update", type=int, default=800)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--average", type=int, default=3, help="average the last K checkpoints")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train-pairs", type=int, metavar="N",
                   help="train on the first N training pairs only (default: all 18,000; valid and test stay whole): "
                        "a try-out, also of step 7, whose SKD translates the training set")
    p.add_argument("--max-len-b", type=int, default=10, help="hypotheses are at most 1.2*src_len + b tokens")
    p.add_argument("--deploy", choices=["auto", "on", "off"], default="auto",
                   help="step 7, the MSC model distilled into a served CTranslate2 student (auto: when the deploy "
                        "extra is installed)")
    p.add_argument("--student-updates", type=int,
                   help="step 7: the student's updates (default: twice the teacher's --max-update; measured: "
                        "800 updates leave the served student 1.69 sacreBLEU below the teacher, 1600 0.58)")
    p.add_argument("--student", default="6-1", metavar="NAME",
                   help="step 7: the student's shape, a deepnmt-distill --student name (6-1: six encoder layers and "
                        "one decoder layer, the shape that reaches 10x the teacher's speed with the shortlist; "
                        "auto: the teacher's "
                        "depths, 6-3; 12-1, desdar: one decoder layer; docs/distill.md)")
    p.add_argument("--skd-beam", type=int, default=4,
                   help="step 7: beam of the teacher's translations of the training set (GPKD's 4; 1 = greedy, "
                        "about a third of the time)")
    p.add_argument("--single-sentences", type=int, metavar="N", default=STEP7_SINGLE_SENTENCES,
                   help="step 7's report: about N test sentences translated one at a time for the one-sentence "
                        f"speed (default {STEP7_SINGLE_SENTENCES}, part of the shortened speed protocol below)")
    p.add_argument("--speed-repeats", type=int, metavar="N", default=STEP7_SPEED_REPEATS,
                   help=f"step 7's report: interleaved rounds of the speed protocol (default {STEP7_SPEED_REPEATS}, "
                        "the protocol's)")
    p.add_argument("--speed-min-seconds", type=float, metavar="S", default=STEP7_SPEED_MIN_SECONDS,
                   help=f"step 7's report: seconds of decoding in one timed run (default {STEP7_SPEED_MIN_SECONDS:g}: "
                        "a shortened protocol, the protocol's 10 would add about 5-6 min on 2 cores; with "
                        f"--single-sentences {STEP7_SINGLE_SENTENCES} and {STEP7_SPEED_REPEATS} rounds the timing adds "
                        "about 3 min (AVX-512) to 4.5 min (AVX2) on 2 cores; the report then says its figures are "
                        "not the full protocol's; docs/distill.md)")
    p.add_argument("--no-vmap", dest="vmap", action="store_false",
                   help="step 7: serve the student without the vocabulary shortlist (deepnmt-distill --vmap, on by "
                        "default: measured, it costs about 0.15 sacreBLEU and buys about 1.2x batched, 1.6x one "
                        "sentence at a time; docs/distill.md)")
    a = p.parse_args(argv)
    if a.train_pairs is not None and a.train_pairs < 1:
        p.error(f"--train-pairs {a.train_pairs}: at least 1 training pair")
    if a.corpus:  # the same corpus, whichever directory the command is run from
        a.corpus = str(Path(a.corpus).resolve())
    # the in-process model loads (deployment note) import fairseq, one of whose modules calls
    # logging.basicConfig(level=DEBUG): configure the root logger first, quietly
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.time()
    work = Path(a.work_dir).resolve()
    fresh = not work.exists() or not any(work.iterdir())  # every step runs: this run's time is a measurement
    work.mkdir(parents=True, exist_ok=True)
    # --deploy adds a step and changes no result: not part of the settings a work dir is tied to
    # nor do step 7's own options: deepnmt-distill ties WORK/distill to its settings itself
    settings = {k: v for k, v in vars(a).items()
                if k not in ("work_dir", "deploy", "student_updates", "skd_beam", "single_sentences", "student",
                             "speed_repeats", "speed_min_seconds", "vmap")}
    # a setting added later is absent from older stamps: absent reads as its default (None)
    settings_guard(work, settings, error=SystemExit, missing_as_default=True)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    from .machine import cores, cpu_kernels

    log(estimate(a, cpu_kernels(), cores()))

    # every step is a stage of the project's runner: a finished one (its output or .done) is skipped
    runner = Runner("quickstart", echo=print, echo_all=True, in_process=False)
    bin_dir = work / "data-bin"
    stages = [prepare_stage(work, a, Path(a.corpus) if a.corpus else DATA), *train_stages(work, bin_dir, a)]
    model = stages[-1].output
    stages.append(evaluate_stage(work, bin_dir, model, a))
    runner.run(stages)
    res = json.loads(stages[-1].output.read_text())
    print()
    print(f"sacreBLEU (detokenized, test, {res['sentences']} sentences): {res['sacrebleu']}")
    print(f"  signature: {res['signature']}")
    print(f"tokenized BLEU: {res['tokenized_bleu']}")
    print(f"copy-the-source baseline (sacreBLEU): {res['copy_source_sacrebleu']}")
    print(f"translations: {res['translations']}")
    # the model of *this* work directory (results.json keeps the path it was evaluated at, which a
    # moved or copied work directory no longer has)
    print(f"model:        {model}")
    print(deployment_note(model, bin_dir))
    if a.deploy == "on" or (a.deploy == "auto" and importlib.util.find_spec("ctranslate2") is not None):
        step7 = deploy_stage(work, bin_dir, model, a)
        plain = work / "distill" / "report" / "report.json"
        if a.vmap and plain.exists() and not step7.output.exists():
            log(f"step 7 serves the student with the vocabulary shortlist since issue 78: its export and report are "
                f"made now (nothing is retrained); the report without it stays in {plain.parent} (--no-vmap)")
        runner.run([step7])
        print(deploy_line(json.loads(step7.output.read_text())))
        print(f"report:       {step7_report(work, a) / 'report.md'}")
    elif a.deploy == "auto":
        print("step 7 (CTranslate2 export) skipped: pip install '.[deploy]' to run it")
    print(f"results:      {work / 'eval' / 'results.json'}  ({time.time() - t0:.0f} s this run)")
    timed = write_time_record(work, a, time.time() - t0, fresh)
    if timed is not None:
        print(f"time record:  {timed}  (the estimate's source is deepnmt_fairseq/quickstart_times.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
