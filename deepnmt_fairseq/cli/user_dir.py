"""``deepnmt-user-dir``: print the directory to pass to fairseq's ``--user-dir``."""

import os

from ..console import quiet_known_warnings


def main(argv=None):
    quiet_known_warnings()  # known-harmless hydra/torch/fairseq warnings (deepnmt_fairseq/console.py)
    # the package folder is the --user-dir; printing it needs nothing but its location
    print(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
