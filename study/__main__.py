"""``python -m study ...``: the evidence study's command (:func:`study.cli.main`)."""

import sys

from study.cli import main

if __name__ == "__main__":
    sys.exit(main())
