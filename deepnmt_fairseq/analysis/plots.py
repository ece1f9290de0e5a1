"""The papers' diagnostic figures, one command each (PNG + the numbers as CSV/JSON).

RUN is a training log with ``--log-format json`` lines (train.log or a capture of the console),
a directory holding such ``*.log`` files, or a ``--tensorboard-logdir`` (read with the optional
``tensorboard`` package).  The diagnostics come from ``--task deep_translation`` (see
deepnmt_fairseq/tasks/deep_translation.py): ``--log-grad-norms-every K``, ``--log-grad-ratio``,
``--log-mixing-weights``, ``--log-gate-stats``.  Existing output files are never replaced
without ``--overwrite``.

The library behind ``deepnmt-plot`` (its arguments and help: :mod:`deepnmt_cli.plot`).
"""

from __future__ import annotations

import math
import os
import re
import sys
from typing import Dict, List

from ..analysis import logs as L
from ..analysis import plotting as P

TOOL = "plot"


class PlotError(ValueError):
    pass


def _claim(out: str, names: List[str], overwrite: bool) -> Dict[str, str]:
    existing = [n for n in names if os.path.exists(os.path.join(out, n))]
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds {', '.join(existing)}; choose another --out or pass --overwrite")
    P.ensure_dir(out)
    return {n: os.path.join(out, n) for n in names}


def _need(values: Dict, what: str, flag: str, path: str):
    if not values:
        raise PlotError(f"{path} has no {what}: train with --task deep_translation {flag} and --log-format json "
                        f"(or --tensorboard-logdir)")


def _layer_index(key: str) -> int:
    return int(re.search(r"(\d+)$", key).group(1))


# ------------------------------------------------------------------ grad norms
def cmd_grad_norms(a) -> int:
    records = L.read_run(a.run)
    xs, vals = L.diagnostics(records, r"(enc|dec)_gnorm_\d+")
    _need(vals, "per-layer gradient norms", "--log-grad-norms-every K", a.run)
    stacks = [s for s in ("enc", "dec") if any(k.startswith(s) for k in vals)]
    if a.stack != "both":
        stacks = [s for s in stacks if s == a.stack[:3]]
        if not stacks:
            raise PlotError(f"{a.run} has no {a.stack} gradient norms")
    paths = _claim(a.out, ["grad_norms.png", "grad_norms.csv"], a.overwrite)
    keys = [k for k in vals if k[:3] in stacks]
    P.write_csv(paths["grad_norms.csv"], ["update"] + keys, [[x] + [vals[k][n] for k in keys] for n, x in enumerate(xs)])
    plt = P.pyplot()
    fig, axes = plt.subplots(1, len(stacks), figsize=(6.2 * len(stacks), 4), squeeze=False)
    for ax, s in zip(axes[0], stacks):
        ks = sorted((k for k in keys if k.startswith(s)), key=_layer_index)
        colors = P.line_colors(len(ks), "viridis")
        P.lines(ax, xs, {f"L{_layer_index(k)}": vals[k] for k in ks}, colors, max_legend=12,
                marker="o" if len(xs) < 30 else None)
        if len(ks) > 12:  # a colour bar instead of a long legend
            sm = plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(1, len(ks)))
            fig.colorbar(sm, ax=ax, label="layer")
        if a.logy:
            ax.set_yscale("log")
        ax.set_xlabel("update")
        ax.set_ylabel("gradient norm")
        ax.set_title(f"{'encoder' if s == 'enc' else 'decoder'} layers ({len(ks)}): {L.run_label(a.run)}")
    fig.suptitle("gradient norm of each layer's parameters (MSC Fig. 5)", fontsize="medium")
    P.save(fig, paths["grad_norms.png"])
    print(paths["grad_norms.png"])
    return 0


# ------------------------------------------------------------------ grad ratio
def cmd_grad_ratio(a) -> int:
    labels = a.labels or [L.run_label(r) for r in a.runs]
    if len(labels) != len(a.runs):
        raise PlotError(f"--labels gives {len(labels)} names for {len(a.runs)} runs")
    curves = {}
    for run, label in zip(a.runs, labels):
        xs, vals = L.diagnostics(L.read_run(run), r"grad_ratio")
        _need(vals, "grad_ratio (r_t)", "--log-grad-ratio", run)
        curves[label] = (xs, vals["grad_ratio"])
    paths = _claim(a.out, ["grad_ratio.png", "grad_ratio.csv"], a.overwrite)
    P.write_csv(paths["grad_ratio.csv"], ["run", "update", "r_t"],
                [[lab, x, y] for lab, (xs, ys) in curves.items() for x, y in zip(xs, ys)])
    plt = P.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lab, (xs, ys) in curves.items():
        P.lines(ax, xs, {lab: ys}, marker="o" if len(xs) < 30 else None, max_legend=0)
    ax.legend(fontsize="small")
    if a.logy:
        ax.set_yscale("log")
    ax.set_xlabel("update t")
    ax.set_ylabel(r"$r_t = \|\nabla_{h_1} L\| \,/\, \|\nabla_{h_N} L\|$")
    ax.set_title("grad-norm ratio (Bapna et al. 2018, Sec. 2.3)")
    P.save(fig, paths["grad_ratio.png"])
    print(paths["grad_ratio.png"])
    return 0


# ------------------------------------------------------------------ mixing weights
def _mixing_from_checkpoint(path: str):
    import torch

    from ..checkpoint_safety import load_checkpoint

    from ..memories.base import upgrade_memory_keys
    from ..memories.transparent import WEIGHT_KEY

    state = load_checkpoint(path)
    weight = upgrade_memory_keys(dict(state.get("model", {}))).get(WEIGHT_KEY)
    if weight is None:
        raise PlotError(f"{path} has no transparent-attention weights ({WEIGHT_KEY}): the model "
                        f"was not trained with --deep-memory transparent")
    return torch.softmax(weight.float(), dim=0).tolist()  # eval mode: no dropout on W (Bapna Eq. 1)


def _mixing_heatmap(ax, fig, s, title):
    n1, m = len(s), len(s[0])
    im = P.heatmap(ax, s, ["emb"] + [f"L{i}" for i in range(1, n1)], [str(j) for j in range(1, m + 1)],
                   annotate=n1 * m <= 80)
    ax.invert_yaxis()
    ax.set_xlabel("decoder layer j")
    ax.set_ylabel("encoder input i")
    ax.set_title(title, fontsize="medium")
    fig.colorbar(im, ax=ax, label=r"$s_{i,j}$")


def cmd_mixing(a) -> int:
    plt = P.pyplot()
    if a.checkpoint:
        if a.run:
            raise PlotError("give a RUN or --checkpoint, not both")
        s = _mixing_from_checkpoint(a.checkpoint)
        paths = _claim(a.out, ["mixing_checkpoint.png", "mixing_checkpoint.csv"], a.overwrite)
        P.write_csv(paths["mixing_checkpoint.csv"], ["i", "j", "s"],
                    [[i, j + 1, s[i][j]] for i in range(len(s)) for j in range(len(s[0]))])
        fig, ax = plt.subplots(figsize=(max(3.5, 1.5 + 0.6 * len(s[0])), 1.5 + 0.3 * len(s)))
        _mixing_heatmap(ax, fig, s, f"transparent attention s_ij: {os.path.basename(a.checkpoint)}")
        P.save(fig, paths["mixing_checkpoint.png"])
        print(paths["mixing_checkpoint.png"])
        return 0
    if not a.run:
        raise PlotError("give a RUN (training log) or --checkpoint CKPT")
    xs, vals = L.diagnostics(L.read_run(a.run), r"mix_\d+_\d+")
    _need(vals, "mixing weights", "--log-mixing-weights", a.run)
    idx = {k: tuple(int(t) for t in k.split("_")[1:]) for k in vals}
    n1 = max(i for i, _ in idx.values()) + 1
    m = max(j for _, j in idx.values())
    j = a.decoder_layer or m
    if not 1 <= j <= m:
        raise PlotError(f"--decoder-layer must be in 1..{m}")
    paths = _claim(a.out, ["mixing_final.png", f"mixing_evolution_j{j}.png", "mixing.csv"], a.overwrite)
    P.write_csv(paths["mixing.csv"], ["update", "i", "j", "s"],
                [[x, idx[k][0], idx[k][1], vals[k][n]] for n, x in enumerate(xs) for k in vals])
    last = len(xs) - 1
    s = [[vals.get(f"mix_{i}_{jj}", [math.nan] * len(xs))[last] for jj in range(1, m + 1)] for i in range(n1)]
    fig, ax = plt.subplots(figsize=(max(3.5, 1.5 + 0.6 * m), 1.5 + 0.3 * n1))
    _mixing_heatmap(ax, fig, s, f"s_ij at update {xs[last]:g} ({L.run_label(a.run)})")
    P.save(fig, paths["mixing_final.png"])

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    series = {("emb" if i == 0 else f"L{i}"): vals.get(f"mix_{i}_{j}", [math.nan] * len(xs)) for i in range(n1)}
    P.lines(ax1, xs, series, P.line_colors(n1, "viridis"), max_legend=12, marker="o" if len(xs) < 30 else None)
    if n1 > 12:
        sm = plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(0, n1 - 1))
        fig.colorbar(sm, ax=ax1, label="encoder input i (0 = embeddings)")
    ax1.set_xlabel("update")
    ax1.set_ylabel(f"$s_{{i,{j}}}$")
    ax1.set_title(f"weights of decoder layer {j} over training (Bapna Fig. 4)", fontsize="medium")
    mat = [series[k] for k in series]
    mids = [(u + v) / 2 for u, v in zip(xs, xs[1:])]
    edges = [xs[0] - (mids[0] - xs[0] if mids else 0.5)] + mids + [xs[-1] + (xs[-1] - mids[-1] if mids else 0.5)]
    im = ax2.pcolormesh(edges, [i - 0.5 for i in range(n1 + 1)], mat, cmap="viridis", shading="flat")
    ax2.set_xlabel("update")
    ax2.set_ylabel("encoder input i (0 = embeddings)")
    ax2.set_title(f"$s_{{i,{j}}}$ over updates", fontsize="medium")
    fig.colorbar(im, ax=ax2)
    P.save(fig, paths[f"mixing_evolution_j{j}.png"])
    print(paths["mixing_final.png"])
    return 0


# ------------------------------------------------------------------ gates
def cmd_gates(a) -> int:
    xs, vals = L.diagnostics(L.read_run(a.run), r"gate_(enc|dec)_\d+")
    _need(vals, "gate statistics", "--log-gate-stats", a.run)
    paths = _claim(a.out, ["gates.png", "gates.csv"], a.overwrite)
    keys = list(vals)
    P.write_csv(paths["gates.csv"], ["update"] + keys, [[x] + [vals[k][n] for k in keys] for n, x in enumerate(xs)])
    stacks = [s for s in ("enc", "dec") if any(k.startswith(f"gate_{s}") for k in keys)]
    plt = P.pyplot()
    fig, axes = plt.subplots(1, len(stacks), figsize=(6.2 * len(stacks), 4), squeeze=False)
    for ax, s in zip(axes[0], stacks):
        ks = sorted((k for k in keys if k.startswith(f"gate_{s}")), key=_layer_index)
        P.lines(ax, xs, {f"L{_layer_index(k)}": vals[k] for k in ks}, P.line_colors(len(ks), "viridis"),
                marker="o" if len(xs) < 30 else None)
        ax.set_ylim(0, 1)
        ax.set_xlabel("update")
        ax.set_ylabel("mean gate g")
        where = "encoder self-attention (Eq. 12)" if s == "enc" else "decoder cross-attention (Eq. 13)"
        ax.set_title(f"MSC gate, {where}", fontsize="medium")
    P.save(fig, paths["gates.png"])
    print(paths["gates.png"])
    return 0


# ------------------------------------------------------------------ degradation
def cmd_degradation(a) -> int:
    import random

    from ..analysis.difficulty import corpus_bleu
    from ..analysis.models import (detok, load_model, load_split, model_depth, pick_device, progress,
                                   translate)

    specs = []
    for spec in a.model:
        if "=" not in spec:
            raise PlotError(f"--model takes FAMILY=CHECKPOINT (got {spec!r})")
        fam, path = spec.split("=", 1)
        specs.append((fam, path))
    paths = _claim(a.out, ["degradation.png", "degradation.csv", "degradation.json"], a.overwrite)
    device = pick_device(a.cpu)
    rows, sample_ids = [], None
    for fam, path in specs:
        progress(f"{fam}: {path}", TOOL)
        model, task, _cfg = load_model(path, a.data, device)
        enc, dec = model_depth(model)
        depth = {"encoder": enc, "decoder": dec, "total": enc + dec}[a.depth]
        row = {"family": fam, "checkpoint": path, "encoder_layers": enc, "decoder_layers": dec, "depth": depth}
        for split in (a.train_subset, a.valid_subset):
            ds = load_split(task, split)
            if split == a.train_subset:
                if sample_ids is None:
                    n = min(a.train_sample, len(ds))
                    sample_ids = sorted(random.Random(a.seed).sample(range(len(ds)), n))
                elif max(sample_ids) >= len(ds):
                    raise PlotError(f"{path}: its {split} split is smaller than the first model's")
                ids = sample_ids
            else:
                ids = list(range(len(ds)))
            progress(f"  {split}: translating {len(ids)} sentences (beam {a.beam})", TOOL)
            hyps = translate(model, task, ds, ids, a.beam, a.lenpen, a.max_len_a, a.max_len_b, a.batch_size,
                             device, log_every=500, tool=TOOL)
            hyp_s = [detok(task.target_dictionary, hyps[i], a.post_process) for i in ids]
            ref_s = [detok(task.target_dictionary, ds[i]["target"], a.post_process) for i in ids]
            key = "train_bleu" if split == a.train_subset else "valid_bleu"
            row[key] = corpus_bleu(hyp_s, ref_s, a.tokenize)
            progress(f"  {key} = {row[key]:.2f}", TOOL)
        rows.append(row)
        del model
    cols = ["family", "depth", "encoder_layers", "decoder_layers", "train_bleu", "valid_bleu", "checkpoint"]
    P.write_csv(paths["degradation.csv"], cols, [[r[c] for c in cols] for r in rows])
    P.write_json(paths["degradation.json"], {"train_subset": a.train_subset, "valid_subset": a.valid_subset,
                                             "train_sample_ids": sample_ids, "seed": a.seed, "beam": a.beam,
                                             "lenpen": a.lenpen, "tokenize": a.tokenize, "models": rows})
    plt = P.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    fams = list(dict.fromkeys(r["family"] for r in rows))
    for ax, key, title in ((axes[0], "train_bleu", f"training sample ({len(sample_ids)} pairs)"),
                           (axes[1], "valid_bleu", a.valid_subset)):
        for fam, c in zip(fams, P.line_colors(len(fams), "tab10")):
            pts = sorted((r["depth"], r[key]) for r in rows if r["family"] == fam)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=fam, color=c)
        ax.set_xlabel(f"{a.depth} layers")
        ax.set_ylabel("BLEU")
        ax.set_title(title, fontsize="medium")
        ax.legend(fontsize="small")
    fig.suptitle("degradation: train and valid BLEU vs depth (MSC Fig. 2)", fontsize="medium")
    P.save(fig, paths["degradation.png"])
    print(paths["degradation.png"])
    return 0


# ------------------------------------------------------------------ depth
def cmd_depth(a) -> int:
    from ..analysis.results import load_results

    entries = load_results(a.results) if a.results else []
    counted = []
    if a.arch:
        from ..models.architectures import PAPER_ROWS
        from .param_counts import build_model, count_parameters, default_vocab

        for arch in a.arch:
            model = build_model(arch, a.vocab or default_vocab(arch))
            enc, dec = len(model.encoder.layers), len(model.decoder.layers)
            paper = PAPER_ROWS.get(arch, (None, None, None))[2]
            counted.append({"experiment": arch, "params": float(count_parameters(model)), "encoder_layers": enc,
                            "decoder_layers": dec, "total_layers": enc + dec, "paper_params": paper,
                            "series_name": re.sub(r"\d+", "N", arch)})
            del model
    if not entries and not counted:
        raise PlotError("give --results FILE_OR_DIR ... and/or --arch NAME ...")
    paths = _claim(a.out, ["depth.png", "depth.csv"], a.overwrite)
    rows = [[e["series_name"], e["experiment"], e["encoder_layers"], e["decoder_layers"], e["total_layers"],
             e["params"], e.get("paper_params") or "", e.get("bleu_value", ""),
             e.get("source_file", "deepnmt-param-counts")] for e in entries + counted]
    P.write_csv(paths["depth.csv"], ["series", "experiment", "encoder_layers", "decoder_layers", "total_layers",
                                     "params", "paper_params_millions", "bleu", "source"], rows)
    plt = P.pyplot()
    panels = (["bleu"] if entries else []) + ["params"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, what in zip(axes[0], panels):
        groups: Dict[str, List] = {}
        for e in entries + (counted if what == "params" else []):
            groups.setdefault(e["series_name"], []).append(e)
        for (name, es), c in zip(groups.items(), P.line_colors(len(groups), "tab10" if len(groups) <= 10 else "viridis")):
            es = sorted(es, key=lambda e: e[a.x])
            ys = [e["bleu_value"] if what == "bleu" else e["params"] / 1e6 for e in es]
            ax.plot([e[a.x] for e in es], ys, marker="o", label=name, color=c)
            if what == "params":
                paper = [(e[a.x], e["paper_params"]) for e in es if e.get("paper_params")]
                if paper:
                    ax.scatter(*zip(*paper), marker="x", color=c, label=f"{name} (paper)")
        ax.set_xlabel(a.x.replace("_", " "))
        ax.set_ylabel("BLEU" if what == "bleu" else "parameters (M)")
        ax.set_title(("BLEU" if what == "bleu" else "parameters") + " vs depth", fontsize="medium")
        ax.legend(fontsize="small")
    P.save(fig, paths["depth.png"])
    print(paths["depth.png"])
    return 0


