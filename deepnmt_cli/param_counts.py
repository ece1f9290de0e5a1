"""Parameter counts of the plugin's named architectures next to the papers' tables.

  deepnmt-param-counts                          # every named architecture
  deepnmt-param-counts --arch msc_iwslt_36l --markdown

Models are built on the CPU from a dictionary of the given size (the papers' joint
vocabularies by default) without any data; nothing is trained.
"""

from __future__ import annotations

import sys

from . import parser, run

PROG = "deepnmt-param-counts"


def build_parser():
    p = parser(PROG, __doc__)
    p.add_argument("--arch", nargs="*", help="architectures (default: every named one)")
    p.add_argument("--vocab", type=int, help="joint vocabulary size (default: the paper's)")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.add_argument("--model-args", default="",
                   help="model flags added to every architecture, e.g. --model-args=--msc-count-fitting-norms")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return run(PROG, "deepnmt_fairseq.analysis.param_counts:run", a, errors=(ValueError,))


if __name__ == "__main__":
    sys.exit(main())
