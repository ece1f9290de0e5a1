"""Criterions (fairseq does not auto-import criterions from --user-dir)."""
