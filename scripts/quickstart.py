#!/usr/bin/env python
"""The quickstart (deepnmt_fairseq/quickstart.py): the whole job on the embedded corpus, on the CPU.

    python scripts/quickstart.py [--work-dir work/quickstart] [--max-update N] ...   (--help lists all)
"""
import sys

from deepnmt_fairseq.quickstart import main

if __name__ == "__main__":
    sys.exit(main())
