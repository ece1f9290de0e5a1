"""``deepnmt-repro arch NAME``: what a named architecture is - the paper row it implements, the
settings it gives its model (beyond the model's own defaults; flags on the command line win), and
the registry experiments that train it.  ``deepnmt-repro arch --list``: every name, one a line.

The names are registered in :mod:`deepnmt_fairseq.models.architectures` (and ``rnmt.py``,
``hiertrans.py``), each written out literally once, so ``grep -rn NAME deepnmt_fairseq/models``
finds its definition too.
"""

from __future__ import annotations

import argparse
from typing import Dict, List


def names() -> List[str]:
    """Every architecture name of the plugin that implements a paper row."""
    from ..models.architectures import PAPER_ROWS

    return sorted(PAPER_ROWS)


def settings(name: str) -> Dict[str, object]:
    """The options the name sets, where they differ from its model's defaults (fairseq's
    ``ARCH_CONFIG_REGISTRY`` functions applied to an empty namespace)."""
    import deepnmt_fairseq  # noqa: F401  (registers the architectures)
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY

    mine, base = argparse.Namespace(), argparse.Namespace()
    ARCH_CONFIG_REGISTRY[name](mine)
    model = ARCH_MODEL_NAME_REGISTRY[name]
    if model in ARCH_CONFIG_REGISTRY and model != name:
        ARCH_CONFIG_REGISTRY[model](base)
    theirs = vars(base)
    return {k: v for k, v in sorted(vars(mine).items()) if k not in theirs or theirs[k] != v}


def experiments_of(name: str, registry=None) -> List[str]:
    """The registry's experiments with a training stage of this architecture (``exp/stage``)."""
    if registry is None:
        from .registry import EXPERIMENTS as registry
    return [f"{exp.name}/{s.name}" for exp in registry.values() for s in exp.stages
            if s.kind == "train" and s.arch == name]


def describe(name: str, registry=None) -> str:
    """The text of ``deepnmt-repro arch NAME``; a :class:`~deepnmt_fairseq.jobs.stage.JobError`
    naming close names for an unknown one."""
    from ..jobs.stage import JobError
    from ..models.architectures import PAPER_ROWS
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    if name not in PAPER_ROWS:
        import difflib

        close = difflib.get_close_matches(name, names(), n=5, cutoff=0.5)
        raise JobError(f"unknown architecture {name!r}" + (f"; did you mean {', '.join(close)}?" if close else "")
                       + " (deepnmt-repro arch --list)")
    paper, row, params = PAPER_ROWS[name]
    lines = [f"{name}: --arch {name} (model {ARCH_MODEL_NAME_REGISTRY[name]})",
             f"  paper: {paper}", f"  row: {row}",
             f"  parameters (paper): {f'{params}M' if params is not None else 'not stated'}",
             "  settings (flags on the command line win):"]
    lines += [f"    {k} = {v!r}" for k, v in settings(name).items()]
    used = experiments_of(name, registry)
    lines.append("  trained by: " + (", ".join(used) if used else "no registry experiment (deepnmt-repro list)"))
    return "\n".join(lines)


def cmd_arch(a: argparse.Namespace) -> int:
    """``deepnmt-repro arch NAME`` / ``deepnmt-repro arch --list`` (arguments: ``name``, ``list``)."""
    if getattr(a, "list", False) or not getattr(a, "name", None):
        print("\n".join(names()))
        return 0
    print(describe(a.name))
    return 0
