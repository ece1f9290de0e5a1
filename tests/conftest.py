import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# tests/ is importable through the pythonpath option of pytest (pyproject.toml)
from fairseq_helpers import make_parallel_text, preprocess  # noqa: E402


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory):
    """A tiny synthetic parallel corpus, binarized with a joined dictionary (once per session)."""
    root = tmp_path_factory.mktemp("tiny")
    raw = make_parallel_text(root / "raw")
    return preprocess(raw, root / "bin")
