"""``python -m deepnmt_data ...`` = ``deepnmt-prepare-data ...``."""

import sys

from deepnmt_data.prepare.cli import main

sys.exit(main())
