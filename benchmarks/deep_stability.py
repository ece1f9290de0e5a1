"""Stability at depth: does a very deep post-norm encoder train, with DeepNorm, with Admin?

    python benchmarks/deep_stability.py [--work-dir work/deep-stability] [--encoder-layers 96]
        [--updates 300] [--lrs 1e-3 3e-3] [--seeds 1] [--systems postnorm deepnorm admin prenorm] [--report-only]

The claim of both papers at CPU scale (Wang et al. 2022, DeepNet, Fig. 1/Sec. 4; Liu et al. 2020,
Admin, Sec. 6): with the *same* optimiser, learning rate and warm-up, a plain post-norm stack of
this depth diverges or stalls, while DeepNorm and Admin train.  Every system here is the same
``fairseq-train`` command (96-layer encoder, 6-layer decoder, d = 64, FFN 256, 4 heads, Adam
(0.9, 0.98), peak lr 1e-3 and, separately, 3e-3 (the CPU evidence study's rate) after 100 warm-up
updates, inverse-sqrt decay, label smoothing 0.1,
dropout 0.1, max 1,024 tokens per batch, 300 updates, gradient clipping off) and differs only in the flag
under test; pre-norm is the reference that is known to train.  Data: the bundled
LibreOffice-help corpus (data/libreoffice-help/en-de), whitespace tokens, the 4,000 most
frequent of each side (no BPE: the task only has to be learnable, not good).

Each run writes ``benchmarks/results/deep_stability/<system>-lr<lr>-s<seed>.json`` (the per-interval training
loss, whether it diverged, the wall time) and is skipped when that record exists, so the study
resumes after an interruption (fairseq also resumes a run from its ``checkpoint_last.pt``).
``--report-only`` rewrites ``docs/img/deep-stability.png`` and the table in
``benchmarks/results/deep_stability/README.md`` from the records.  Nothing here is timed as a claim.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deepnmt_data.preprocess import fairseq_preprocess, preprocess_argv
from deepnmt_fairseq.analysis.logs import parse_json_lines, series
from deepnmt_fairseq.jobs.fairseq_argv import fairseq_train
from deepnmt_fairseq.jobs.stage import make_log

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "libreoffice-help" / "en-de"
RESULTS = REPO / "benchmarks" / "results" / "deep_stability"
FIGURE = REPO / "docs" / "img" / "deep-stability.png"

SYSTEMS = {
    "postnorm": ["--post-norm"],
    "deepnorm": ["--deepnorm"],
    "admin": ["--admin"],
    "prenorm": [],
}
LABELS = {"postnorm": "post-norm", "deepnorm": "DeepNorm", "admin": "Admin", "prenorm": "pre-norm (reference)"}


log = make_log("deep-stability", stdout=True)


def prepare(work: Path) -> Path:
    """Whitespace-tokenised bundled corpus, binarized with 4k-word dictionaries."""
    out = work / "data-bin"
    if (out / ".done").exists():
        return out
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid"):
        for lang in ("en", "de"):
            with gzip.open(CORPUS / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                (raw / f"{split}.{lang}").write_text(f.read(), encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    fairseq_preprocess(preprocess_argv("en", "de", out, trainpref=raw / "train", validpref=raw / "valid", nwords=4000,
                                       workers=1), log=None, quiet=True)
    (out / ".done").write_text("")
    return out


def train_command(data: Path, save: Path, system: str, a) -> list:
    return fairseq_train(data, [
        "--task", "translation",
        "--arch", "deepnmt_transformer", *SYSTEMS[system],
        "--encoder-layers", str(a.encoder_layers), "--decoder-layers", str(a.decoder_layers),
        "--encoder-embed-dim", str(a.dim), "--decoder-embed-dim", str(a.dim),
        "--encoder-ffn-embed-dim", str(4 * a.dim), "--decoder-ffn-embed-dim", str(4 * a.dim),
        "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
        "--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", str(a.lr), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(a.warmup), "--warmup-init-lr", "1e-7", "--max-tokens", str(a.max_tokens),
        "--max-update", str(a.updates), "--save-dir", str(save), "--save-interval-updates", "100",
        "--keep-interval-updates", "1", "--no-epoch-checkpoints", "--disable-validation", "--seed", str(a.seed),
        "--log-format", "json", "--log-interval", "10", "--no-progress-bar", "--cpu", "--num-workers", "0",
    ], resolve=True)


def run(data: Path, work: Path, system: str, a) -> dict:
    record = a.results / f"{system}-lr{a.lr:g}-s{a.seed}.json"
    if record.exists():
        return json.loads(record.read_text())
    save = work / f"{system}-lr{a.lr:g}-s{a.seed}"
    save.mkdir(parents=True, exist_ok=True)
    cmd = train_command(data, save, system, a)
    log(f"{system} seed {a.seed}, lr {a.lr:g}: {a.encoder_layers}-layer encoder, {a.updates} updates")
    start = time.time()
    logf = save / "train.log"
    with logf.open("a", encoding="utf-8") as out:  # appended: a resumed run continues the log
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": str(a.threads)})
    text = logf.read_text(encoding="utf-8")
    losses = series(parse_json_lines(text.splitlines()), "loss")  # NaN / inf stay as they are
    diverged = proc.returncode != 0 or any(not math.isfinite(v) for _, v in losses)
    rec = {
        "system": system, "flags": SYSTEMS[system], "seed": a.seed, "encoder_layers": a.encoder_layers,
        "decoder_layers": a.decoder_layers, "dim": a.dim, "lr": a.lr, "warmup": a.warmup, "updates": a.updates,
        "returncode": proc.returncode, "diverged": diverged, "losses": losses,
        "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None,
        "train_seconds": round(time.time() - start, 1), "command": " ".join(cmd[1:]),
        "admin_profile": re.findall(r"Admin profile.*", text)[:1],
    }
    if proc.returncode == 0 or diverged:
        a.results.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(rec, indent=1) + "\n")
    log(f"{system}: loss {rec['first_loss']} -> {rec['last_loss']} ({rec['train_seconds']} s, rc {proc.returncode})")
    return rec


def report(records: list) -> str:
    rows = ["| peak lr | system | seed | loss @ first log | mean of the last 5 logs | lowest | diverged (NaN/inf "
            "or crash) | minutes |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=_order):
        finite = [v for _, v in r["losses"] if math.isfinite(v)]
        tail = [v for _, v in r["losses"][-5:]]
        rows.append(f"| {r['lr']:g} | {LABELS[r['system']]} | {r['seed']} | {r['first_loss']:.2f} | "
                    f"{sum(tail) / max(1, len(tail)):.2f} | {min(finite) if finite else math.nan:.2f} | "
                    f"{'yes' if r['diverged'] else 'no'} | {r['train_seconds'] / 60:.1f} |")
    return "\n".join(rows)


def _order(r: dict):
    return (r["lr"], list(SYSTEMS).index(r["system"]), r["seed"])


def plot(records: list, figure: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["lr"] for r in records})
    fig, axes = plt.subplots(1, len(rates), figsize=(5.2 * len(rates), 3.8), squeeze=False, sharey=True)
    for ax, lr in zip(axes[0], rates):
        for r in sorted((r for r in records if r["lr"] == lr), key=_order):
            xs, ys = zip(*r["losses"]) if r["losses"] else ((), ())
            ax.plot(xs, ys, label=f"{LABELS[r['system']]} (seed {r['seed']})" + (" diverged" if r["diverged"] else ""))
        first = next(r for r in records if r["lr"] == lr)
        ax.set_title(f"{first['encoder_layers']}-layer encoder, {first['decoder_layers']}-layer decoder, "
                     f"d={first['dim']}\npeak lr {lr:g} for all, warm-up {first['warmup']}", fontsize=9)
        ax.set_xlabel("update")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("training loss (label-smoothed, base 2)")
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(figure, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default=str(REPO / "work" / "deep-stability"))
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1])
    p.add_argument("--encoder-layers", type=int, default=96)
    p.add_argument("--decoder-layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-3],
                   help="peak learning rates, each run for every system (default: %(default)s; 3e-3 is the "
                   "CPU evidence study's pre-norm rate)")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", type=Path, default=RESULTS, help="records and README (default: %(default)s)")
    p.add_argument("--figure", type=Path, default=FIGURE)
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args(argv)
    work = Path(a.work_dir)
    if not a.report_only:
        data = prepare(work)
        for lr in a.lrs:
            for seed in a.seeds:
                a.lr, a.seed = lr, seed
                for system in a.systems:
                    run(data, work, system, a)
    records = [json.loads(f.read_text()) for f in sorted(a.results.glob("*-lr*-s*.json"))]
    if not records:
        log("no records yet")
        return 1
    table = report(records)
    (a.results / "README.md").write_text(
        "# Stability at depth (benchmarks/deep_stability.py)\n\n"
        f"Command: `python benchmarks/deep_stability.py` (each record holds its full fairseq-train command).\n"
        f"Figure: docs/img/deep-stability.png.\n\n{table}\n", encoding="utf-8")
    plot(records, a.figure)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
