"""Print the directory to pass to fairseq's --user-dir (the installed deepnmt_fairseq package).

  fairseq-train DATA --user-dir "$(deepnmt-user-dir)" --arch msc_iwslt_36l ...
"""

from __future__ import annotations

import importlib.util
import os
import sys

from . import parser

PROG = "deepnmt-user-dir"


def user_dir() -> str:
    """The package folder, found without importing it (importing registers the plugin in fairseq)."""
    spec = importlib.util.find_spec("deepnmt_fairseq")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{PROG}: error: deepnmt_fairseq is not installed in this Python ({sys.executable})")
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def build_parser():
    return parser(PROG, __doc__)


def main(argv=None) -> int:
    build_parser().parse_args(argv)
    print(user_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
