#!/usr/bin/env python
"""Small-scale fidelity study: do the papers' phenomena show on the embedded corpus?

    python benchmarks/fidelity.py [--work-dir work/fidelity] [--only depth deep-decoder gpkd ssl]
                                   [--updates 1200] [--jobs 2] [--threads 1] [--report-only]

Every run is a fairseq-train command of this repository on the bundled
LibreOffice-help corpus (en->de, 4k joint BPE), on the CPU, with the same
budget (``--updates`` updates of at most 2048 tokens, seed 1) for all systems
that are compared.  Runs are resumable (a finished run is reused); the report
(markdown table + PNG plots + the command and seed of every number) is written
to ``--report`` and ``docs/img/fidelity-*.png``.

Studies:
* depth (MSC Fig. 2, Bapna Table 1): post-norm, pre-norm, transparent and MSC
  encoders of 6 / 12 / 24 layers (3 decoder layers; MSC uses 3 blocks);
* deep decoder (deep-decoder Sec. 3): an 8-8 model plain, with CAD, and with
  CAD + collapse-reducing training; BLEU and the gap between the validation loss
  with the real source and with an all-UNK source (a collapsed decoder ignores
  the source, so the gap shrinks towards 0);
* GPKD (Li et al. Table 1): 6-layer student extracted from a 12-layer GP teacher (h = 2)
  and trained on SKD data, vs SKD alone (random init), vs a 6-layer baseline on
  the real data, all with the same student budget;
* skipping sub-layer (Li et al. Table 4): two-stage fine-tuning of the 24-layer
  pre-norm model with phi = 0.4 vs continued plain training, same budget
  (a quarter of ``--updates``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# --user-dir of every command: the installed package (found without importing fairseq here)
USER_DIR = list(importlib.util.find_spec("deepnmt_fairseq").submodule_search_locations)[0]

WIDTH = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256",
         "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--share-all-embeddings", "--dropout", "0.1", "--attention-dropout", "0.0"]
TRAIN = ["--task", "translation", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.003",
         "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--max-tokens", "2048", "--seed", "1",
         "--cpu", "--num-workers", "0", "--log-format", "json", "--log-interval", "10", "--no-epoch-checkpoints",
         "--save-interval-updates", "1000000", "--disable-validation"]
LS = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]


def log(msg):
    print(f"[fidelity {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_quickstart():
    """scripts/quickstart.py of this checkout (its prepare() builds the embedded corpus)."""
    if "deepnmt_quickstart" not in sys.modules:
        spec = importlib.util.spec_from_file_location("deepnmt_quickstart", REPO / "scripts" / "quickstart.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["deepnmt_quickstart"]


def exe(name):
    cand = Path(sys.executable).with_name(name)
    return str(cand) if cand.exists() else name


DEPTHS = (6, 12, 24)


def depth_runs():
    runs = {}
    for n in DEPTHS:
        runs[f"postnorm-{n}"] = ["--arch", "deepnmt_transformer", "--post-norm", "--encoder-layers", str(n),
                                 "--decoder-layers", "3"]
        runs[f"prenorm-{n}"] = ["--arch", "deepnmt_transformer", "--encoder-layers", str(n), "--decoder-layers", "3"]
        runs[f"transparent-{n}"] = ["--arch", "deepnmt_transformer", "--post-norm", "--deep-memory", "transparent",
                                    "--encoder-layers", str(n), "--decoder-layers", "3"]
        runs[f"msc-{n}"] = ["--arch", "deepnmt_transformer", "--deep-memory", "msc", "--msc-block-layers",
                            str(n // 3), "--decoder-layers", "3"]
    return runs


# balanced deep model, 8-8 (the CPU budget; CAD drop depth 6 = 21/27 of the decoder, Fig. 2)
DEEP_DECODER = {
    "dd-plain-8-8": (["--arch", "deepnmt_transformer", "--encoder-layers", "8", "--decoder-layers", "8"], LS),
    "dd-cad-8-8": (["--arch", "deepnmt_transformer", "--encoder-layers", "8", "--decoder-layers", "8",
                    "--cad-drop-depth", "6", "--cad-drop-ratio", "0.5"], LS),
    "dd-cad-crt-8-8": (["--arch", "deepnmt_transformer", "--encoder-layers", "8", "--decoder-layers", "8",
                        "--cad-drop-depth", "6", "--cad-drop-ratio", "0.5"],
                         ["--criterion", "collapse_reducing", "--label-smoothing", "0.1", "--ddr-alpha", "1.0",
                          "--ald-alpha", "0.5"]),
}


class Study:
    def __init__(self, work: Path, data: Path, updates: int, threads: int = 1):
        self.work, self.data, self.updates = work, data, updates
        # runs go in parallel (--jobs), each with this many threads: small models use cores
        # better as separate processes than as intra-op threads
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))

    def train(self, name, model, crit=LS, data=None, updates=None, extra=()):
        save = self.work / "runs" / name
        done = save / "done.json"
        if done.exists():
            return json.loads(done.read_text())
        save.mkdir(parents=True, exist_ok=True)
        cmd = [exe("fairseq-train"), str(data or self.data), "--user-dir", USER_DIR, *model,
               *WIDTH, *TRAIN, *crit, "--max-update", str(updates or self.updates), "--save-dir", str(save), *extra]
        log(f"train {name}")
        t0 = time.time()
        with open(save / "train.log", "w") as f:
            res = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env)
        losses = []
        for line in (save / "train.log").read_text().splitlines():
            # fairseq --log-format json: "... | train_inner | {...}" and the epoch summary "... | train | {...}"
            if ("| train_inner |" in line or "| train |" in line) and "{" in line:
                try:
                    rec = json.loads(line[line.index("{"):])
                except ValueError:
                    continue
                if "num_updates" in rec and "loss" in rec:  # train_inner: mean over --log-interval updates
                    losses.append((int(float(rec["num_updates"])), float(rec["loss"])))
                elif "train_loss" in rec and not losses:  # runs shorter than one log interval
                    epoch_loss = (int(float(rec["train_num_updates"])), float(rec["train_loss"]))
                    losses.append(epoch_loss)
        out = {"name": name, "command": " ".join(shlex.quote(c) for c in cmd), "returncode": res.returncode,
               "seconds": round(time.time() - t0, 1), "losses": losses,
               # mean of the last five logged intervals (the last 50 updates with --log-interval 10)
               "final_train_loss": round(sum(v for _, v in losses[-5:]) / len(losses[-5:]), 3) if losses else math.nan,
               "diverged": res.returncode != 0 or not losses or not math.isfinite(losses[-1][1])}
        if res.returncode == 0:
            out.update(self.evaluate(save / "checkpoint_last.pt", data or self.data))
        done.write_text(json.dumps(out, indent=1) + "\n")
        log(f"  {name}: {json.dumps({k: out.get(k) for k in ('final_train_loss', 'valid_loss', 'bleu', 'seconds')})}")
        return out

    def evaluate(self, ckpt: Path, data: Path, unk_source=False):
        import sacrebleu

        res = {}
        val = subprocess.run([exe("fairseq-validate"), str(data), "--user-dir", USER_DIR,
                              "--path", str(ckpt), "--task", "translation", "--cpu", "--max-tokens", "4096",
                              "--valid-subset", "valid"], capture_output=True, text=True, env=self.env)
        for line in (val.stdout + val.stderr).splitlines():
            if "valid on 'valid' subset" in line and "| loss " in line:
                res["valid_loss"] = float(line.split("| loss ")[1].split()[0])
        gen = subprocess.run([exe("fairseq-generate"), str(self.data), "--user-dir", USER_DIR,
                              "--path", str(ckpt), "--gen-subset", "test", "--beam", "4", "--batch-size", "128",
                              "--required-batch-size-multiple", "1", "--remove-bpe", "--cpu", "--max-len-a", "1.2",
                              "--max-len-b", "10"], capture_output=True, text=True, env=self.env)
        from deepnmt_fairseq.generate_output import parse_generate

        parsed = parse_generate(gen.stdout)
        hyps, refs = parsed["hyps"], parsed["refs"]
        if refs and sorted(hyps) == sorted(refs):
            ids = sorted(refs)
            res["bleu"] = round(sacrebleu.corpus_bleu([hyps[i] for i in ids], [[refs[i] for i in ids]],
                                                      tokenize="none", force=True).score, 2)
        return res

    def unk_gap(self, ckpt: Path):
        """Valid NLL (bits/token, no label smoothing) with every source token replaced by UNK, minus the
        NLL with the real source: how much the predictions depend on the source."""
        import torch

        import deepnmt_fairseq  # noqa: F401
        from fairseq import checkpoint_utils, tasks

        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)],
                                                                          arg_overrides={"data": str(self.data)})
        model = models[0].eval()
        task.load_dataset("valid")
        ds = task.dataset("valid")
        d = task.source_dictionary
        totals = {"real": 0.0, "unk": 0.0}
        ntok = 0
        with torch.no_grad():
            for start in range(0, len(ds), 64):
                sample = ds.collater([ds[i] for i in range(start, min(len(ds), start + 64))])
                net = sample["net_input"]
                target = sample["target"]
                mask = target.ne(d.pad())
                ntok += int(mask.sum())
                for kind in ("real", "unk"):
                    src = net["src_tokens"]
                    if kind == "unk":
                        keep = src.eq(d.pad()) | src.eq(d.eos())
                        src = src.masked_fill(~keep, d.unk())
                    out = model(src, net["src_lengths"], net["prev_output_tokens"])
                    lp = model.get_normalized_probs(out, log_probs=True)
                    nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
                    totals[kind] += float(nll[mask].sum())
        real, unk = totals["real"] / ntok / math.log(2), totals["unk"] / ntok / math.log(2)
        return {"valid_nll_real": round(real, 3), "valid_nll_unk_source": round(unk, 3), "unk_gap": round(unk - real, 3)}


def plot(results, path, title, xs, series):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 3.6))
    for ax, (metric, label) in zip(axes if len(series) > 1 else [axes], series):
        for fam in FAMILIES:
            ys = [results.get(f"{fam}-{n}", {}).get(metric, math.nan) for n in xs]
            ax.plot(xs, ys, marker="o", label=fam)
        ax.set_xlabel("encoder layers")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", default=str(REPO / "work" / "fidelity"))
    ap.add_argument("--only", nargs="*", default=["depth", "deep-decoder", "gpkd", "ssl"])
    ap.add_argument("--updates", type=int, default=1200)
    ap.add_argument("--report-only", action="store_true", help="write the report from the finished runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at the same time")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--report", default=str(REPO / "docs" / "fidelity.md"))
    a = ap.parse_args(argv)
    quickstart = load_quickstart()

    work = Path(a.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = quickstart.prepare(work, 4000)
    study = Study(work, data, a.updates, a.threads)
    results = {}
    if a.report_only:
        for done in sorted((work / "runs").glob("*/done.json")):
            results[done.parent.name] = json.loads(done.read_text())
        budgets = [int(w[1]) for r in results.values() for w in zip(shlex.split(r.get("command", "")),
                                                                    shlex.split(r.get("command", ""))[1:])
                   if w[0] == "--max-update"]
        write_report(results, Path(a.report), max(budgets) if budgets else a.updates)
        return 0
    # phase 1: every independent run, longest first, --jobs at a time
    first = []
    if "depth" in a.only:
        first += [(name, model, LS, {}) for name, model in depth_runs().items()]
    if "deep-decoder" in a.only:
        first += [(name, model, crit, {}) for name, (model, crit) in DEEP_DECODER.items()]
    if "gpkd" in a.only:
        first.append(("gpkd-teacher-12-3", GP_TEACHER, LS, {}))
        first.append(("prenorm-6", depth_runs()["prenorm-6"], LS, {}))  # the 6-layer baseline
    if "ssl" in a.only:
        first.append(("prenorm-24", depth_runs()["prenorm-24"], LS, {}))
    first = list({r[0]: r for r in first}.values())
    first.sort(key=lambda r: -_layers(r[1]))
    with ThreadPoolExecutor(a.jobs) as pool:
        for name, out in zip([r[0] for r in first],
                             pool.map(lambda r: study.train(r[0], r[1], r[2], **r[3]), first)):
            results[name] = out
    # phase 2: what depends on phase 1
    if "deep-decoder" in a.only:
        for name in DEEP_DECODER:
            r = results[name]
            if not r["diverged"] and "unk_gap" not in r:
                r.update(study.unk_gap(work / "runs" / name / "checkpoint_last.pt"))
                (work / "runs" / name / "done.json").write_text(json.dumps(r, indent=1) + "\n")
    second = []
    if "gpkd" in a.only:
        second += gpkd_runs(study, work, data, a.jobs)
    if "ssl" in a.only:
        second += ssl_runs(work, a.updates)
    with ThreadPoolExecutor(a.jobs) as pool:
        for name, out in zip([r[0] for r in second],
                             pool.map(lambda r: study.train(r[0], r[1], r[2], **r[3]), second)):
            results[name] = out
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_report(results, Path(a.report), a.updates)
    return 0


GP_TEACHER = ["--arch", "deepnmt_transformer", "--encoder-layers", "12", "--decoder-layers", "3",
              "--gp-group-size", "2"]
SIX = ["--arch", "deepnmt_transformer", "--encoder-layers", "6", "--decoder-layers", "3"]


def _layers(model):
    """Encoder + decoder layers of a run's flags (to schedule the longest runs first)."""
    n = {"--encoder-layers": 6, "--decoder-layers": 6}
    for i, f in enumerate(model[:-1]):
        if f in n:
            n[f] = int(model[i + 1])
        if f == "--msc-block-layers":
            n["--encoder-layers"] = 3 * int(model[i + 1])
    return sum(n.values())


def gpkd_runs(study, work, data, jobs):
    """GPKD (Li et al. Sec. 3): SKD data from the 12-layer GP teacher, a student initialised
    with one layer per group of 2 (Eq. 4), vs the same student shape trained on SKD data from random
    initialisation; the 6-layer baseline on the real data is ``prenorm-6``."""
    tckpt = work / "runs" / "gpkd-teacher-12-3" / "checkpoint_last.pt"
    skd = work / "skd-bin"
    if not (skd / ".done").exists():
        log("SKD data from the teacher")
        subprocess.run([exe("deepnmt-skd"), "--data", str(data), "--teacher", str(tckpt), "--output", str(skd),
                        "--cpu", "--batch-size", "128", "--shards", str(jobs)], check=True, env=study.env)
    student = work / "student-init.pt"
    if not student.exists():
        subprocess.run([exe("deepnmt-extract-student"), "--teacher", str(tckpt), "--encoder-group-size", "2",
                        "--output", str(student)], check=True)
    return [("gpkd-student-6-3", SIX, LS, dict(data=skd, extra=["--finetune-from-model", str(student)])),
            ("skd-only-6-3", SIX, LS, dict(data=skd))]


def ssl_runs(work, updates):
    """Skipping sub-layer (Li et al. Sec. 4, Table 4): fine-tune the trained 24-layer pre-norm
    model for a quarter of the budget with phi = 0.4, vs continued plain training for the same
    budget."""
    base = work / "runs" / "prenorm-24" / "checkpoint_last.pt"
    model = depth_runs()["prenorm-24"]
    return [("ssl-finetune-24", model + ["--ssl-rate", "0.4"], LS,
             dict(updates=updates // 4, extra=["--finetune-from-model", str(base)])),
            ("plain-continue-24", model, LS, dict(updates=updates // 4, extra=["--finetune-from-model", str(base)]))]


STUDIES = [
    ("Depth (MSC Fig. 2 / Bapna et al. Table 1)", lambda n: n.split("-")[0] in ("postnorm", "prenorm", "transparent",
                                                                              "msc") and n.count("-") == 1),
    ("Deep decoder, 8-8 (CAD and collapse-reducing training)", lambda n: n.startswith("dd-")),
    ("GPKD (Li et al. Table 1 at small scale; baseline = prenorm-6)",
     lambda n: n.startswith(("gpkd-", "skd-")) or n == "prenorm-6"),
    ("Skipping sub-layer fine-tuning (Li et al. Table 4; base = prenorm-24)",
     lambda n: n in ("prenorm-24", "ssl-finetune-24", "plain-continue-24")),
]
FINDINGS = Path(__file__).with_name("fidelity_findings.md")


FAMILIES = ("postnorm", "prenorm", "transparent", "msc")


def _order(name):
    """Depth runs by family then depth; the rest as the study runs them."""
    fam, _, n = name.rpartition("-")
    if fam in FAMILIES and n.isdigit():
        return (FAMILIES.index(fam), int(n), name)
    return (len(FAMILIES), 0, name)


def _portable(command: str) -> str:
    """The command as a user of a fresh clone would type it (repository-relative paths,
    console scripts by name)."""
    words = shlex.split(command)
    if words:
        words[0] = Path(words[0]).name
    return " ".join(shlex.quote(w.replace(str(REPO) + "/", "")) for w in words)


def _row(name, r):
    extra = ""
    if "unk_gap" in r:  # valid NLL (bits/token) with the real source -> with an all-UNK source
        extra = f"UNK-source gap {r['unk_gap']} bits"
        if "valid_nll_real" in r:
            extra += f" (NLL {r['valid_nll_real']} -> {r['valid_nll_unk_source']})"
    valid = r.get("valid_loss")
    valid = f"{valid:.3f}" if isinstance(valid, (int, float)) else "-"
    return (f"| {name} | {r.get('final_train_loss', math.nan):.3f} | {valid} | "
            f"{r.get('bleu', 'diverged' if r.get('diverged') else '-')} | {extra} | {r.get('seconds')} |")


def write_report(results, path: Path, updates):
    img = path.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    lines = ["# Fidelity study on the embedded corpus", "",
             f"Generated by `python benchmarks/fidelity.py` ({time.strftime('%Y-%m-%d')}). Every run: the bundled "
             f"LibreOffice-help corpus (en->de, 18k pairs, 4k joint BPE), width 64 (FFN 256, 4 heads), "
             f"{updates} updates of at most 2048 tokens (SSL fine-tuning runs: a quarter), Adam lr 3e-3, 100 warmup "
             "updates, label smoothing 0.1, dropout 0.1, seed 1, CPU. Train loss: mean of the last 50 updates "
             "(base 2). Valid loss: `fairseq-validate` on the valid split. BLEU: test split, beam 4, on the "
             "Moses-tokenized text (BPE removed). The exact command of every run is listed at the end "
             "(and in `work/fidelity/runs/<name>/done.json`).", ""]
    if FINDINGS.exists():
        lines += [FINDINGS.read_text().strip(), ""]
    for title, pick in STUDIES:
        names = sorted((n for n in results if pick(n)), key=_order)
        if not names:
            continue
        lines += [f"## {title}", "", "| run | train loss | valid loss | test BLEU | extra | seconds |",
                  "|---|---|---|---|---|---|"]
        lines += [_row(n, results[n]) for n in names]
        lines.append("")
    depth = {k: v for k, v in results.items() if STUDIES[0][1](k)}
    if depth:
        plot(depth, img / "fidelity-depth.png", f"Depth study ({updates} updates)", list(DEPTHS),
             [("final_train_loss", "train loss"), ("valid_loss", "valid loss"), ("bleu", "test BLEU")])
        lines += ["![depth](img/fidelity-depth.png)", ""]
    curves = {k: v for k, v in results.items() if v.get("losses")}
    if curves:
        plot_curves(curves, img / "fidelity-curves.png")
        lines += ["![training curves](img/fidelity-curves.png)", ""]
    lines += ["## Commands", ""]
    for name in sorted(results, key=_order):
        lines.append(f"- `{name}`: `{_portable(results[name].get('command', ''))}`")
    path.write_text("\n".join(lines) + "\n")


def plot_curves(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(t, [n for n in results if pick(n)]) for t, pick in STUDIES]
    groups = [(t, ns) for t, ns in groups if ns]
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.6), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups):
        for n in names:
            xs, ys = zip(*results[n]["losses"])
            ax.plot(xs, ys, label=n, linewidth=1)
        ax.set_title(title.split(" (")[0], fontsize=9)
        ax.set_xlabel("update")
        ax.set_ylabel("train loss")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
