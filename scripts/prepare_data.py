#!/usr/bin/env python
"""Download (or take from a directory), process and binarize the papers' corpora for fairseq.

    python scripts/prepare_data.py --list
    python scripts/prepare_data.py NAME [--data-root DIR] [--from-dir DIR] [--workers N]
                                        [--spm] [--bpe-merges N] [--force] [--dry-run]

A thin wrapper of ``deepnmt-prepare-data`` (:mod:`deepnmt_data.prepare.cli`, where the
options and the output layout are described) whose data root defaults to ``<repo>/work/data``
($DEEPNMT_DATA or --data-root say otherwise).  docs/data-preparation.md explains every choice.
"""

import sys
from pathlib import Path

from deepnmt_data.prepare.cli import main

if __name__ == "__main__":
    sys.exit(main(default_data_root=Path(__file__).resolve().parents[1] / "work" / "data"))
