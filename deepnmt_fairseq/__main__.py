"""``python -m deepnmt_fairseq``: print the directory to pass to ``--user-dir``."""

from .cli.user_dir import main

main()
