"""``python -m deepnmt_fairseq.repro``: the same as ``deepnmt-repro``."""

import sys

from deepnmt_cli.repro import main

sys.exit(main())
