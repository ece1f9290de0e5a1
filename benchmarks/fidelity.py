#!/usr/bin/env python
"""Moved: the evidence study is ``python -m study`` (the study/ folder, issue 80 part 2).  This
forwarding shim keeps the command that older notes and records cite working: this script, with any
arguments, runs the study's command with them."""

import sys
from pathlib import Path

if __name__ == "__main__":
    # the checkout holding study/, last: the library stays the one the environment imports (the fork
    # server that starts the study's commands imports it by the environment's own path)
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from study.cli import main

    sys.exit(main())
