"""Difficulty-split test sets and BLEU per part (MSC, Wei et al. 2020, Sec. 4.3, Eq. 14-15, Fig. 3).

Score (Eq. 14-15): s(x, y) = mean_k NLL_k + std_k NLL_k over the K checkpoints, where NLL_k =
-log P(y|x; Theta^(k)) is summed over the target tokens (EOS included), in nats, teacher-forced, no
label smoothing; std is the population standard deviation (the paper does not say which).  The
pairs, ordered by s (ties by id), are cut into Simple / Ordinary / Difficult / Challenging parts
whose sizes differ by at most one.

``split`` writes to --out: ``scores.tsv`` (id, score, mean, std, part, one NLL column per
checkpoint), ``split.json`` (ids per part, checkpoints, score ranges), the parallel text of every
part (``simple.SRC``/``simple.TGT``... : the lines of --source-text/--target-text when given,
else the binarized sentences as text, BPE removed with --post-process), ``references.txt``
(all targets, test order), ``bin/`` (each part binarized with the data's dictionaries:
``fairseq-generate OUT/bin --gen-subset difficult ...``) and ``scores.png`` (score distribution and
part boundaries).

``evaluate`` reads hypotheses from fairseq-generate outputs (``D-`` lines, else ``H-``; run
fairseq-generate on the *whole* test set with --required-batch-size-multiple 1) or from plain
files with one hypothesis per test sentence in test order, and references from
``references.txt`` (or --refs).  Hypotheses and references must be in the same form (both
detokenized, or both tokenized with BPE removed).  It writes ``bleu.csv``/``bleu.json`` (sacreBLEU
of every system on every part, gains over --baseline) and ``difficulty_bleu.png`` (Fig. 3: gains
per part, the baseline's BLEU in parentheses).

The library behind ``deepnmt-difficulty`` (its arguments and help: :mod:`deepnmt_cli.difficulty`).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Dict, List

from ..analysis import difficulty as D
from ..analysis import plotting as P

TOOL = "difficulty"


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _claim(out: str, names: List[str], overwrite: bool) -> None:
    """Refuse to overwrite earlier results (nothing is lost without --overwrite)."""
    existing = [n for n in names if os.path.exists(os.path.join(out, n))]
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds {', '.join(existing[:4])}{' ...' if len(existing) > 4 else ''}; "
                              f"choose another --out or pass --overwrite")
    P.ensure_dir(out)


def _checkpoints(a) -> List[str]:
    if a.checkpoints:
        return list(a.checkpoints)
    if not a.checkpoint_dir:
        raise ValueError("give --checkpoints A.pt B.pt ... or --checkpoint-dir DIR --last K")
    from ..checkpoint_averaging import newest_checkpoints

    return newest_checkpoints(a.checkpoint_dir, a.last)


def _pair_prefixes(data: str, subset: str, src: str, tgt: str) -> Dict[str, str]:
    for a, b in ((src, tgt), (tgt, src)):
        base = os.path.join(data, f"{subset}.{a}-{b}")
        if os.path.exists(f"{base}.{src}.idx"):
            return {src: f"{base}.{src}", tgt: f"{base}.{tgt}"}
    raise FileNotFoundError(f"no binarized {subset} split ({subset}.{src}-{tgt}.{src}.idx) in {data}")


def _write_binarized(data: str, subset: str, src: str, tgt: str, parts: Dict[str, List[int]], dest: str,
                     dicts) -> None:
    """Each part as its own binarized split of ``dest`` (same dictionaries as ``data``)."""
    from fairseq.data import data_utils, indexed_dataset

    P.ensure_dir(dest)
    prefixes = _pair_prefixes(data, subset, src, tgt)
    for lang in (src, tgt):
        shutil.copyfile(os.path.join(data, f"dict.{lang}.txt"), os.path.join(dest, f"dict.{lang}.txt"))
        ds = data_utils.load_indexed_dataset(prefixes[lang], dicts[lang])
        if ds is None:
            raise FileNotFoundError(f"cannot read {prefixes[lang]}")
        for name, ids in parts.items():
            out = os.path.join(dest, f"{name}.{src}-{tgt}.{lang}")
            builder = indexed_dataset.make_builder(out + ".bin", impl="mmap", vocab_size=len(dicts[lang]))
            for i in ids:  # in part order = ascending score
                builder.add_item(ds[i])
            builder.finalize(out + ".idx")


def _read_lines(path: str, n: int, what: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f]
    if len(lines) != n:
        raise ValueError(f"{what} {path} has {len(lines)} lines, the binarized split has {n} sentences")
    return lines


def cmd_split(a) -> int:
    import torch

    from ..analysis.models import load_model, load_split, pick_device, progress, sentence_nll

    ckpts = _checkpoints(a)
    names = ["scores.tsv", "split.json", "references.txt", "scores.png", "bin"]
    device = pick_device(a.cpu)
    nll: List[List[float]] = []
    task = dataset = None
    for k, path in enumerate(ckpts):
        progress(f"scoring the {a.subset} split with checkpoint {k + 1}/{len(ckpts)}: {path}", TOOL)
        model, task, _cfg = load_model(path, a.data, device)
        dataset = load_split(task, a.subset)
        if k == 0:
            src, tgt = task.cfg.source_lang, task.cfg.target_lang
            names += [f"{p}.{l}" for p in D.PARTS for l in (src, tgt, "ids")]
            _claim(a.out, names, a.overwrite)
        scores = sentence_nll(model, dataset, range(len(dataset)), a.batch_size, device)
        nll.append([scores[i] for i in range(len(dataset))])
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    n = len(dataset)
    stats = D.difficulty_scores(nll)
    split = D.split_by_score([s["score"] for s in stats])
    parts = dict(zip(D.PARTS, split))
    part_of = {i: name for name, ids in parts.items() for i in ids}

    src, tgt = task.cfg.source_lang, task.cfg.target_lang
    if a.source_text:
        src_lines = _read_lines(a.source_text, n, "--source-text")
    else:
        src_lines = [dataset.src_dict.string(dataset[i]["source"], a.post_process) for i in range(n)]
    if a.target_text:
        tgt_lines = _read_lines(a.target_text, n, "--target-text")
    else:
        tgt_lines = [dataset.tgt_dict.string(dataset[i]["target"], a.post_process) for i in range(n)]

    with open(os.path.join(a.out, "scores.tsv"), "w", encoding="utf-8") as f:
        f.write("\t".join(["id", "score", "mean_nll", "std_nll", "part"] + [f"nll_ckpt{k + 1}" for k in range(len(nll))]) + "\n")
        for i in range(n):
            s = stats[i]
            f.write("\t".join([str(i), f"{s['score']:.6f}", f"{s['mean']:.6f}", f"{s['std']:.6f}", part_of[i]]
                              + [f"{row[i]:.6f}" for row in nll]) + "\n")
    for name, ids in parts.items():
        for lang, lines in ((src, src_lines), (tgt, tgt_lines)):
            with open(os.path.join(a.out, f"{name}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(lines[i] + "\n" for i in ids)
        with open(os.path.join(a.out, f"{name}.ids"), "w", encoding="utf-8") as f:
            f.writelines(f"{i}\n" for i in ids)
    with open(os.path.join(a.out, "references.txt"), "w", encoding="utf-8") as f:
        f.writelines(l + "\n" for l in tgt_lines)
    ranges = {name: [stats[ids[0]]["score"], stats[ids[-1]]["score"]] for name, ids in parts.items()}
    P.write_json(os.path.join(a.out, "split.json"), {
        "definition": "score = mean + population std over checkpoints of -log P(y|x), summed over target "
                      "tokens incl. EOS, nats (MSC Eq. 14-15)",
        "data": a.data, "subset": a.subset, "source_lang": src, "target_lang": tgt, "size": n,
        "checkpoints": ckpts, "parts": parts, "score_ranges": ranges,
        "sizes": {k: len(v) for k, v in parts.items()},
    })
    _write_binarized(a.data or task.cfg.data.split(os.pathsep)[0], a.subset, src, tgt, parts,
                     os.path.join(a.out, "bin"), {src: task.src_dict, tgt: task.tgt_dict})

    plt = P.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    scores = sorted(s["score"] for s in stats)
    ax.plot(range(1, n + 1), scores, color="k", lw=1)
    start = 0
    for name, c in zip(D.PARTS, P.line_colors(4, "RdYlGn_r")):
        size = len(parts[name])
        ax.axvspan(start + 0.5, start + size + 0.5, color=c, alpha=0.3, label=f"{D.PART_TITLES[name]} ({size})")
        start += size
    ax.set_xlabel("sentence rank")
    ax.set_ylabel("s(x, y) = E[NLL] + Std[NLL]")
    ax.set_title(f"difficulty of {a.subset} ({len(ckpts)} checkpoints, MSC Eq. 14)")
    ax.legend(fontsize="small")
    P.save(fig, os.path.join(a.out, "scores.png"))
    progress(f"wrote {a.out}: parts of sizes {[len(v) for v in parts.values()]}", TOOL)
    return 0


def cmd_evaluate(a) -> int:
    import json

    with open(os.path.join(a.split, "split.json"), encoding="utf-8") as f:
        info = json.load(f)
    parts = {k: [int(i) for i in v] for k, v in info["parts"].items()}
    n = int(info["size"])
    refs_path = a.refs or os.path.join(a.split, "references.txt")
    refs = _read_lines(refs_path, n, "references")
    systems: Dict[str, List[str]] = {}
    for spec in a.system:
        if "=" not in spec:
            raise ValueError(f"--system takes NAME=FILE (got {spec!r})")
        name, path = spec.split("=", 1)
        if name in systems:
            raise ValueError(f"system {name!r} given twice")
        systems[name] = D.read_hypotheses(path, n)
    if a.baseline not in systems:
        raise ValueError(f"--baseline {a.baseline!r} is not one of the --system names ({', '.join(systems)})")
    _claim(a.out, ["bleu.csv", "bleu.json", "difficulty_bleu.png"], a.overwrite)
    bleu = {name: D.bleu_by_part(h, refs, parts, a.tokenize) for name, h in systems.items()}
    base = bleu[a.baseline]
    cols = list(D.PARTS) + ["all"]
    rows = []
    for name, b in bleu.items():
        for part in cols:
            rows.append([name, part, len(parts[part]) if part in parts else n, round(b[part], 4),
                         round(b[part] - base[part], 4)])
    P.write_csv(os.path.join(a.out, "bleu.csv"), ["system", "part", "sentences", "bleu", "gain_over_baseline"], rows)
    P.write_json(os.path.join(a.out, "bleu.json"), {
        "baseline": a.baseline, "tokenize": a.tokenize, "references": refs_path, "bleu": bleu,
        "gain": {name: {p: b[p] - base[p] for p in cols} for name, b in bleu.items()},
    })

    plt = P.pyplot()
    others = [s for s in systems if s != a.baseline]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(D.PARTS), 3.8))
    width = 0.8 / max(len(others), 1)
    for k, (name, c) in enumerate(zip(others, P.line_colors(len(others), "tab10" if len(others) <= 10 else "viridis"))):
        xs = [p + (k - (len(others) - 1) / 2) * width for p in range(len(D.PARTS))]
        gains = [bleu[name][p] - base[p] for p in D.PARTS]
        bars = ax.bar(xs, gains, width, label=name, color=c)
        for bar, g in zip(bars, gains):
            ax.annotate(f"{g:+.2f}", (bar.get_x() + bar.get_width() / 2, g), ha="center",
                        va="bottom" if g >= 0 else "top", fontsize=7 if len(others) <= 3 else 6,
                        rotation=0 if len(others) <= 3 else 90)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(D.PARTS)))
    ax.set_xticklabels([f"{D.PART_TITLES[p]}\n({base[p]:.2f})" for p in D.PARTS])
    ax.set_ylabel(f"BLEU gain over {a.baseline}")
    ax.set_title("BLEU by translation difficulty (MSC Fig. 3)")
    if others:
        ax.legend(fontsize="small")
    P.save(fig, os.path.join(a.out, "difficulty_bleu.png"))
    for name, b in bleu.items():
        print(f"{name:20s} " + "  ".join(f"{D.PART_TITLES.get(p, p)}={b[p]:.2f}" for p in cols))
    return 0


