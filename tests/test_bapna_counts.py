"""Bapna et al. (2018) Table 1 sizes: Chen et al. (2018)'s Transformer shapes (docs/parameter-counts.md).

Models are built on the meta device (no memory, no initialisation): only shapes are counted.
"""

import pytest
import torch

from deepnmt_fairseq.analysis.param_counts import build_model, count_parameters
from deepnmt_fairseq.models.architectures import PAPER_ROWS

V = 32000  # "a shared vocabulary of 32k units" (Sec. 2.1)


def _count(arch):
    with torch.device("meta"):
        model = build_model(arch, V)
    return model, count_parameters(model)


@pytest.mark.parametrize("arch", ["postnorm_wmt_base_6l", "transparent_wmt_base_6l", "postnorm_wmt_big_6l"])
def test_six_layer_rows_match_table1_within_1_percent(arch):
    model, n = _count(arch)
    paper = PAPER_ROWS[arch][2]
    assert abs(n / 1e6 - paper) / paper < 0.01, (arch, n)
    # separate source, target and softmax embeddings over one vocabulary
    emb_src, emb_tgt = model.encoder.embed_tokens.weight, model.decoder.embed_tokens.weight
    out = model.decoder.output_projection.weight
    assert emb_src is not emb_tgt and out is not emb_tgt and emb_src.shape[0] == V == out.shape[0]


def test_deeper_rows_add_one_base_encoder_layer_each():
    """The documented gap: ours add 3,152,384 per encoder layer, the paper's rows ~4.25-4.33M."""
    _, six = _count("postnorm_wmt_base_6l")
    layer = 4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 2 * 2 * 512
    for n_layers in (12, 16, 20):
        arch = f"postnorm_wmt_base_{n_layers}l"
        _, n = _count(arch)
        assert n - six == (n_layers - 6) * layer
        paper_step = (PAPER_ROWS[arch][2] - PAPER_ROWS["postnorm_wmt_base_6l"][2]) * 1e6 / (n_layers - 6)
        assert 4.2e6 < paper_step < 4.4e6 and paper_step > 1.3 * layer
        _, transparent = _count(f"transparent_wmt_base_{n_layers}l")
        assert transparent - n == (n_layers + 1) * 6  # the (N+1) x M mixing weights
