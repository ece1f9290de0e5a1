"""Criterions (fairseq does not auto-import criterions from --user-dir: the package does)."""

from . import collapse_reducing  # noqa: F401
