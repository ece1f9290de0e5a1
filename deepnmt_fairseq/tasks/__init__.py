"""Tasks (auto-imported by fairseq's --user-dir)."""

from . import deep_translation  # noqa: E402,F401
