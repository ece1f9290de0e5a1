"""``python -m deepnmt_fairseq``: print the directory to pass to ``--user-dir``
(``--fixes``: list the plugin's fixes to fairseq and whether each is on)."""

import sys

if sys.argv[1:] == ["--fixes"]:
    from .fairseq_fixes import main as _fixes

    raise SystemExit(_fixes())

from .cli.user_dir import main

main()
