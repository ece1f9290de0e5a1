#!/usr/bin/env python
"""Moved: the evidence study is ``python -m study`` (the study/ folder, issue 80 part 2), run from the
repository root.  This script only says so, with the command to run instead (older notes cite it)."""

import shlex
import sys

if __name__ == "__main__":
    sys.exit("benchmarks/fidelity.py moved: the evidence study is now, from the repository root,\n"
             "    python -m study " + " ".join(shlex.quote(a) for a in sys.argv[1:]) +
             "\n(its code: study/; docs/architecture.md)")
