"""README's "Your own data" section, run verbatim (issue 72): its ```bash blocks between the
``own-data`` markers, in order, in one shell, on a tiny parallel text cut from the bundled corpus,
with the size knobs the blocks read from the environment (MODEL, MAX_UPDATE, MERGES) set small.
From two plain-text files to sacreBLEU and a served int8 model: if a command of the README
breaks, this fails."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "libreoffice-help" / "en-de"
TINY_MODEL = ("--arch deepnmt_transformer --deepnorm --encoder-layers 2 --decoder-layers 1 --share-all-embeddings "
              "--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 "
              "--encoder-attention-heads 2 --decoder-attention-heads 2")


def readme_blocks() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- own-data:start -->(.*?)<!-- own-data:end -->", text, re.S)
    assert m, "README.md has no <!-- own-data:start --> ... <!-- own-data:end --> section"
    blocks = re.findall(r"```bash\n(.*?)```", m.group(1), re.S)
    assert len(blocks) >= 4, "the own-data section should hold its commands as ```bash blocks"
    return "\n".join(blocks)


def test_readme_own_data_section_is_complete():
    """Train, score and serve are all there, with fairseq's own commands, and within the first
    100 lines of the README (issue 72: a newcomer finds the whole path early)."""
    script = readme_blocks()
    for command in ("sacremoses", "subword-nmt learn-joint-bpe-and-vocab", "fairseq-preprocess", "fairseq-train",
                    "--user-dir", "fairseq-generate", "sacrebleu", "deepnmt-export-ct2", "deepnmt-translate"):
        assert command in script, command
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200; the rest belongs in docs/)"
    first_screen = "\n".join(lines[:40])
    assert "## Install" in first_screen
    end = next(i for i, line in enumerate(lines) if "own-data:end" in line)
    assert end < 100, f"the own-data path ends at line {end + 1} (issue 72: within the first 100)"


@pytest.mark.slow
def test_readme_own_data_commands_run_verbatim(tmp_path):
    raw = tmp_path / "my-text"
    raw.mkdir()
    sizes = {"train": 120, "valid": 12, "test": 15}
    for split, n in sizes.items():
        for lang in ("en", "de"):
            with gzip.open(CORPUS / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (raw / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    env = dict(os.environ, RAW=str(raw), WORK="work/tiny", MODEL=TINY_MODEL, MAX_UPDATE="30", MERGES="300",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("SRC", None), env.pop("TGT", None)
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_blocks()], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    work = tmp_path / "work" / "tiny"
    scores = [float(x) for x in re.findall(r"^\d+(?:\.\d+)?$", out.stdout, re.M)]
    assert len(scores) == 2, out.stdout[-2000:]  # sacrebleu -b of fairseq-generate and of the served model
    hyp = (work / "test.hyp").read_text(encoding="utf-8").splitlines()
    served = (work / "test.served").read_text(encoding="utf-8").splitlines()
    assert len(hyp) == len(served) == sizes["test"]  # one translation per test line, none dropped
    meta = json.loads((work / "served" / "deepnmt_export.json").read_text())
    assert meta["quantization"] == "int8" and meta["encoder_layers"] == 2
