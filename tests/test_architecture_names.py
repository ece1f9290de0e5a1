"""Named architectures are greppable (issue 68): each registered name is written out literally in
deepnmt_fairseq/models/, and ``deepnmt-repro arch NAME`` says what it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deepnmt_fairseq.jobs.stage import JobError
from deepnmt_fairseq.models.architectures import ARCHS, PAPER_ROWS
from deepnmt_fairseq.repro import architecture

MODELS = Path(__file__).resolve().parents[1] / "deepnmt_fairseq" / "models"


def test_every_registered_name_is_written_out_in_the_models_package():
    text = "\n".join(p.read_text(encoding="utf-8") for p in MODELS.glob("*.py"))
    missing = [name for name in PAPER_ROWS if f'"{name}"' not in text]
    assert not missing, f"registered without their name written out (grep finds nothing): {missing}"
    assert set(ARCHS.values()) <= set(PAPER_ROWS)
    # no name assembled from pieces at registration
    assert not re.search(r'(@_arch|register_model_architecture)\(\s*(MODEL_NAME,\s*)?f"', text)


def test_repro_arch_prints_the_paper_row_settings_and_experiments():
    text = architecture.describe("msc_iwslt_36l")
    assert "MSC (Wei et al. 2020)" in text and "Table 2 row 3 (36 layers, 6x6)" in text and "43.3M" in text
    assert "encoder_layers = 36" in text and "deep_memory = 'msc'" in text and "msc_block_layers = '6'" in text
    assert "msc-iwslt14-ende-36L/train" in text
    cad = architecture.describe("dd_base_27_27_cad")
    assert "cad_drop_ratio = 0.5" in cad and "cad_drop_depth = 21" in cad
    assert "msc_iwslt_36l" in architecture.names() and "rnmt_plus_512_transparent_6l" in architecture.names()
    with pytest.raises(JobError, match="did you mean .*msc_iwslt_36l"):
        architecture.describe("msc_iwslt_37l")


def test_deepnmt_repro_arch_prints_a_names_settings_and_rows(capsys):
    """deepnmt-repro arch NAME: the settings a named architecture sets, its paper row and the
    registry's experiments that train it; --list names them all; an unknown name is one line."""
    from deepnmt_cli.repro import main

    assert main(["arch", "msc_iwslt_36l"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("msc_iwslt_36l: --arch msc_iwslt_36l") and "Table 2" in out and "decoder_embed_dim" in out
    assert main(["arch", "--list"]) == 0
    assert "msc_iwslt_36l" in capsys.readouterr().out.split()
    assert main(["arch", "no_such_arch"]) == 1
    assert "unknown architecture" in capsys.readouterr().err
