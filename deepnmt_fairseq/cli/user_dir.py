"""``deepnmt-user-dir``: print the directory to pass to fairseq's ``--user-dir``."""

import os


def main(argv=None):
    # the package folder is the --user-dir; printing it needs nothing but its location
    print(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
