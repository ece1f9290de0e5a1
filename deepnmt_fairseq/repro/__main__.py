"""``python -m deepnmt_fairseq.repro``: the same as ``deepnmt-repro``."""

import sys

from .cli import main

sys.exit(main())
