"""The papers' figures as runnable registry entries and one plot command each.

    deepnmt-repro plot KEY [--checkpoint-root DIR] [--out DIR] [--overwrite]   # PNG + CSV
    deepnmt-repro plot --list                                                   # the figures

A figure is either a set of **curves** read from the runs' training logs (``train.log`` of the
stages, ``--log-format simple`` or ``json``: training PPL/loss per logging interval and per
epoch, validation PPL per validation) or a **sweep** whose points are the ``results.json`` of
registry experiments (BLEU, decoding tokens/s) or a value of their training log.  Every
experiment behind a figure is an ordinary registry entry (``deepnmt-repro train NAME``), listed
in the table of the same key (``deepnmt-repro list --table KEY``).

Where a figure's axes or grid are not stated in its paper, :attr:`Figure.chosen` says what we
chose; docs/reproduction.md prints it under the figure's table.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..analysis.logs import last_value, parse_curves
# the data model (Figure, Run, Point) is the registry's (spec.py); the figures themselves are registry.FIGURES
from .registry import FIGURES
from .spec import Figure, experiments_of


# ------------------------------------------------------------------------------ collecting
def _stage_log(root: Path, experiment: str, stage: Optional[str]) -> Path:
    from .registry import EXPERIMENTS

    exp = EXPERIMENTS[experiment]
    st = exp.stage(stage) if stage else exp.eval_stage
    base = root / experiment
    return (base / st.name if exp.multi_stage else base) / "train.log"


def collect(fig: Figure, root: Path) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    """{panel metric: {line label: [(x, y), ...]}} from whatever runs exist under ``root``."""
    data: Dict[str, Dict[str, List[Tuple[float, float]]]] = {m: {} for m, _ in fig.panels}
    for label, item in fig.lines:
        if fig.kind == "curves":
            merged: Dict[str, Dict[float, float]] = {}
            for experiment, stage in item.logs:
                path = _stage_log(root, experiment, stage)
                if not path.exists():
                    continue
                for metric, series in parse_curves(path.read_text(encoding="utf-8", errors="replace")).items():
                    merged.setdefault(metric, {}).update(dict(series))
            for metric, _ in fig.panels:
                if merged.get(metric):
                    data[metric][label] = sorted(merged[metric].items())
            continue
        for p in item:
            res_path = root / p.experiment / p.results
            res = {}
            if res_path.exists():
                try:
                    res = json.loads(res_path.read_text(encoding="utf-8"))
                except ValueError:
                    res = {}
            for metric, _ in fig.panels:
                if metric.startswith("last_"):  # a value of the training log (e.g. last_train_ppl)
                    path = _stage_log(root, p.experiment, None)
                    val = last_value(path.read_text(encoding="utf-8", errors="replace"), metric[5:]) \
                        if path.exists() else None
                else:
                    val = res.get(metric)
                if isinstance(val, (int, float)):
                    data[metric].setdefault(label, []).append((p.x, float(val)))
    return data


def plot(fig: Figure, root: Path, out: Path, overwrite: bool = False) -> List[Path]:
    """Write ``<out>/<key>.png`` and ``<out>/<key>.csv`` (metric, line, x, y); returns the paths."""
    from ..analysis import plotting as P

    png, csv = out / f"{fig.key}.png", out / f"{fig.key}.csv"
    if not overwrite:
        for path in (png, csv):
            if path.exists():
                raise FileExistsError(f"{path} exists; pass --overwrite")
    data = collect(fig, root)
    if not any(data[m] for m in data):
        missing = ", ".join(experiments_of(fig)[:6])
        raise FileNotFoundError(f"{fig.key}: nothing to plot under {root} yet (train/evaluate: {missing} ...)")
    P.ensure_dir(str(out))
    rows = [(m, label, x, y) for m, lines in data.items() for label, pts in lines.items() for x, y in pts]
    P.write_csv(str(csv), ["metric", "line", "x", "y"], rows)
    plt = P.pyplot()
    fig_, axes = plt.subplots(1, len(fig.panels), figsize=(5.5 * len(fig.panels), 4), squeeze=False)
    for ax, (metric, ylabel) in zip(axes[0], fig.panels):
        for label, pts in data[metric].items():
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o" if fig.kind == "sweep" else None, label=label)
        ax.set_xlabel(fig.x_label)
        ax.set_ylabel(ylabel)
        if data[metric]:
            ax.legend(fontsize=8)
    fig_.suptitle(fig.title, fontsize=10)
    P.save(fig_, str(png))
    return [png, csv]


def main(a) -> int:
    """``deepnmt-repro plot`` (arguments: :mod:`deepnmt_cli.repro`)."""
    from .commands import default_work_dir

    if a.list or not a.key:
        for fig in FIGURES.values():
            print(f"{fig.key}: {fig.title} ({fig.kind}; {len(experiments_of(fig))} experiment(s))")
            if fig.chosen:
                print(f"    our choice: {fig.chosen}")
        return 0 if a.list else 2
    if a.key not in FIGURES:
        print(f"error: unknown figure {a.key!r} (deepnmt-repro plot --list)", file=sys.stderr)
        return 1
    root = Path(a.checkpoint_root) if a.checkpoint_root else default_work_dir() / "checkpoints"
    try:
        paths = plot(FIGURES[a.key], root, Path(a.out), a.overwrite)
    except (FileExistsError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0
