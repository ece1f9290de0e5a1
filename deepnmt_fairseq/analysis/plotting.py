"""matplotlib (Agg) figures and the CSV/JSON files written next to them."""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Dict, List, Optional, Sequence


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), or a clear error."""
    try:
        import logging

        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit("the analysis plots need matplotlib: pip install matplotlib "
                         "(or pip install 'deepnmt-fairseq[plot]')") from e
    return plt


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def write_csv(path: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(list(header))
        for row in rows:
            w.writerow(["" if (isinstance(v, float) and math.isnan(v)) else v for v in row])
    return path


def write_json(path: str, obj) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False, allow_nan=True)
        f.write("\n")
    return path


def save(fig, path: str, dpi: int = 120) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def line_colors(n: int, cmap: str = "viridis"):
    plt = pyplot()
    cm = plt.get_cmap(cmap)
    return [cm(i / max(n - 1, 1)) for i in range(n)]


def lines(ax, x: Sequence[float], ys: Dict[str, Sequence[float]], colors=None, max_legend: int = 12,
          marker: Optional[str] = None):
    """One line per series; a legend only when it stays readable."""
    colors = colors or [None] * len(ys)
    for (label, y), c in zip(ys.items(), colors):
        pts = [(a, b) for a, b in zip(x, y) if b is not None and not math.isnan(b)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, color=c, marker=marker,
                    markersize=3 if marker else None)
    if 0 < len(ys) <= max_legend:
        ax.legend(fontsize="small")


def heatmap(ax, matrix, row_labels: List[str], col_labels: List[str], cmap: str = "viridis",
            annotate: bool = False, vmin=None, vmax=None):
    im = ax.imshow(matrix, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_yticks(range(len(row_labels)))
    ax.set_yticklabels(row_labels, fontsize="small")
    ax.set_xticks(range(len(col_labels)))
    ax.set_xticklabels(col_labels, fontsize="small", rotation=90 if max(map(len, col_labels or [""])) > 3 else 0)
    if annotate:
        for i, row in enumerate(matrix):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=6, color="w")
    return im
