"""Tasks (auto-imported by fairseq's --user-dir)."""
