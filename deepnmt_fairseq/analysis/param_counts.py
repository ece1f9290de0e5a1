"""Parameter counts of the named architectures next to the papers' tables.

    deepnmt-param-counts [--arch NAME ...] [--vocab N] [--markdown]   (arguments: deepnmt_cli.param_counts)

Models are built on the CPU from a dictionary of the given size (the papers'
joint vocabularies by default) without any data; nothing is trained.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace


# joint vocabulary sizes used for each paper's counts (see docs/parameter-counts.md)
DEFAULT_VOCAB = {
    "MSC (Wei et al. 2020)": {"iwslt": 10150, "wmt": 37000, "cnndm": 32000},  # cnndm: joint BPE 32k (ours)
    "Transparent (Bapna et al. 2018)": {"wmt": 32000},
    "Deep decoder (CAD/CRT)": {"wmt": 37000},
    "GPKD (Li et al. 2021)": {"wmt": 34000},
}


def default_vocab(arch: str) -> int:
    from ..models.architectures import PAPER_ROWS

    paper = PAPER_ROWS.get(arch, (None,))[0]
    table = DEFAULT_VOCAB.get(paper, {})
    key = "iwslt" if "iwslt" in arch else ("cnndm" if "cnndm" in arch else "wmt")
    return table.get(key, 32000)


def make_dictionary(size: int):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


def build_model(arch: str, vocab_size: int | None = None, extra_args=()):
    """Build ``--arch arch`` (plus flags in ``extra_args``) with a dummy vocabulary."""
    import deepnmt_fairseq  # noqa: F401  (registers the plugin)
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    if arch not in ARCH_MODEL_REGISTRY:
        raise SystemExit(f"unknown architecture {arch!r}")
    parser = argparse.ArgumentParser(allow_abbrev=False, argument_default=argparse.SUPPRESS)
    model_cls = ARCH_MODEL_REGISTRY[arch]
    model_cls.add_args(parser)
    args = parser.parse_args(list(extra_args))
    ARCH_CONFIG_REGISTRY[arch](args)
    d = make_dictionary(vocab_size or default_vocab(arch))
    task = SimpleNamespace(source_dictionary=d, target_dictionary=d)
    return model_cls.build_model(args, task)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def run(a) -> int:
    """``deepnmt-param-counts`` (arguments: :mod:`deepnmt_cli.param_counts`)."""
    from ..models.architectures import PAPER_ROWS

    import shlex

    model_args = shlex.split(a.model_args)
    import deepnmt_fairseq  # noqa: F401

    archs = a.arch or [n for n in PAPER_ROWS]
    rows = []
    for arch in archs:
        vocab = a.vocab or default_vocab(arch)
        n = count_parameters(build_model(arch, vocab, model_args))
        paper, row, ref = PAPER_ROWS.get(arch, ("", "", None))
        rows.append((arch, paper or "", row or "", vocab, n / 1e6, ref))
    if a.markdown:
        print("| architecture | paper | row | vocab | ours (M) | paper (M) | diff |")
        print("|---|---|---|---|---|---|---|")
        for arch, paper, row, vocab, ours, ref in rows:
            diff = f"{(ours - ref) / ref * 100:+.1f}%" if ref else ""
            print(f"| `{arch}` | {paper} | {row} | {vocab} | {ours:.1f} | {ref if ref else '-'} | {diff} |")
    else:
        for arch, paper, row, vocab, ours, ref in rows:
            print(f"{arch:32s} vocab={vocab:6d} ours={ours:8.2f}M paper={ref if ref else '-'}")
    return 0

