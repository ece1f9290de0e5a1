"""``python -m deepnmt_fairseq``: print the directory to pass to ``--user-dir`` (``--fixes``:
list the plugin's fixes to fairseq and whether each is on)."""

import argparse
import sys

p = argparse.ArgumentParser(prog="python -m deepnmt_fairseq", description=__doc__.replace("``", ""))
p.add_argument("--fixes", action="store_true", help="list the plugin's fixes to fairseq and whether each is on")
if p.parse_args().fixes:
    from .fairseq_fixes import main as _fixes

    sys.exit(_fixes())

from . import USER_DIR  # noqa: E402

print(USER_DIR)
