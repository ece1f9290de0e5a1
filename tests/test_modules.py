"""Unit tests of the plain-PyTorch mechanism modules (tiny sizes, seeds, no fairseq)."""

import itertools
import math

import pytest
import torch

from deepnmt_fairseq.modules.context_cell import ContextCell
from deepnmt_fairseq.modules.cross_attention_drop import (
    drop_probabilities,
    layers_without_cross_attention,
    sample_keep,
)
from deepnmt_fairseq.modules.gated_fusion import GatedFusion
from deepnmt_fairseq.modules.group_permutation import check_group_size, layer_order
from deepnmt_fairseq.modules.layer_mix import LayerMix
from deepnmt_fairseq.modules.sublayer_skip import SublayerSkip, skip_probabilities


# ----------------------------------------------------------------- context cell (MSC Eq. 9)
def test_gru_context_cell_matches_gru_equations():
    torch.manual_seed(0)
    d, T, B = 6, 4, 3
    cell = ContextCell(d, "gru")
    c, x = torch.randn(T, B, d), torch.randn(T, B, d)
    out = cell(c, x)
    g = cell.cell
    W_ir, W_iz, W_in = g.weight_ih.chunk(3)
    W_hr, W_hz, W_hn = g.weight_hh.chunk(3)
    b_ir, b_iz, b_in = g.bias_ih.chunk(3)
    b_hr, b_hz, b_hn = g.bias_hh.chunk(3)
    r = torch.sigmoid(x @ W_ir.T + b_ir + c @ W_hr.T + b_hr)
    z = torch.sigmoid(x @ W_iz.T + b_iz + c @ W_hz.T + b_hz)
    n = torch.tanh(x @ W_in.T + b_in + r * (c @ W_hn.T + b_hn))
    ref = (1 - z) * n + z * c  # hidden state = C^{n-1}, input = B_e^n
    assert torch.allclose(out, ref, atol=1e-6)


def test_context_cell_is_position_wise():
    torch.manual_seed(0)
    cell = ContextCell(5, "gru")
    c, x = torch.randn(7, 2, 5), torch.randn(7, 2, 5)
    full = cell(c, x)
    one = cell(c[3:4], x[3:4])  # position 3 alone: no recurrence over time
    assert torch.allclose(full[3:4], one, atol=1e-6)


def test_ffn_context_cell_and_bad_kind():
    cell = ContextCell(4, "ffn", ffn_dim=8)
    assert cell(torch.zeros(2, 1, 4), torch.zeros(2, 1, 4)).shape == (2, 1, 4)
    assert sum(p.numel() for p in cell.parameters()) == 8 * 8 + 8 + 8 * 4 + 4
    with pytest.raises(ValueError, match="unknown context cell"):
        ContextCell(4, "lstm")


# ----------------------------------------------------------------- gated fusion (MSC Eq. 12-13)
def test_gate_formula():
    torch.manual_seed(0)
    f = GatedFusion(4, "gate")
    a_h, a_c = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    g = torch.sigmoid(a_h @ f.w1.weight.T + f.w1.bias + a_c @ f.w2.weight.T)
    assert torch.allclose(f(a_h, a_c), g * a_h + (1 - g) * a_c, atol=1e-6)
    # two d x d matrices and one bias
    assert sum(p.numel() for p in f.parameters()) == 2 * 16 + 4


def test_gate_with_norm_and_additive_fusion():
    torch.manual_seed(0)
    f = GatedFusion(4, "gate", normalize=True)
    a_h, a_c = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    g = torch.sigmoid(f.norm(f.w1(a_h) + f.w2(a_c)))
    assert torch.allclose(f(a_h, a_c), g * a_h + (1 - g) * a_c, atol=1e-6)
    add = GatedFusion(4, "add")
    assert torch.equal(add(a_h, a_c), a_h + a_c)
    assert sum(p.numel() for p in add.parameters()) == 0


# ----------------------------------------------------------------- transparent attention
def test_layer_mix_is_softmax_weighted_sum():
    torch.manual_seed(0)
    mix = LayerMix(4, 3, dropout=0.5).eval()
    with torch.no_grad():
        mix.weight.normal_()
    states = torch.randn(4, 5, 2, 6)
    s = torch.softmax(mix.weight, dim=0)
    assert torch.allclose(mix.mixing_weights().sum(0), torch.ones(3))
    out = mix(states)
    for j in range(3):
        ref = sum(s[i, j] * states[i] for i in range(4))
        assert torch.allclose(out[j], ref, atol=1e-5)


def test_layer_mix_dropout_only_in_training_and_uniform_init():
    torch.manual_seed(0)
    mix = LayerMix(5, 2, dropout=0.5)
    assert torch.allclose(mix.mixing_weights(), torch.full((5, 2), 0.2))  # W = 0: uniform mix
    with torch.no_grad():
        mix.weight.normal_()
    mix.train()
    draws = {tuple(mix.mixing_weights().flatten().tolist()) for _ in range(5)}
    assert len(draws) > 1  # dropout on W (Eq. 1)
    mix.eval()
    assert torch.equal(mix.mixing_weights(), mix.mixing_weights())
    with pytest.raises(ValueError, match="at least one encoder layer"):
        LayerMix(1, 2)


# ----------------------------------------------------------------- CAD
def test_cad_reading_drops_bottom_layers_only():
    assert drop_probabilities(6, 4, 0.3) == [0.3] * 4 + [0.0] * 2
    assert layers_without_cross_attention(drop_probabilities(5, 2, 1.0)) == [True, True, False, False, False]
    with pytest.raises(ValueError, match="drop-depth"):
        drop_probabilities(4, 5, 0.5)
    assert sample_keep([0.5, 0.5, 0.0], training=False) == [True, True, True]
    assert sample_keep([1.0, 0.0], training=False) == [False, True]


def test_cad_coin_frequency():
    torch.manual_seed(0)
    keeps = [sample_keep([0.3, 0.0], training=True) for _ in range(4000)]
    frac = sum(k[0] for k in keeps) / len(keeps)
    assert abs(frac - 0.7) < 0.03 and all(k[1] for k in keeps)


# ----------------------------------------------------------------- skipping sub-layer
def test_skip_probabilities_eq5():
    L, phi = 3, 0.4
    assert skip_probabilities(L, phi) == pytest.approx([l / (2 * L) * phi for l in range(1, 7)])
    layer = skip_probabilities(2, 0.5, "layer")
    assert layer == pytest.approx([0.25, 0.25, 0.5, 0.5])


def test_skip_inference_scaling_is_expectation_of_training():
    """Eq. 6: for a linear sub-layer, inference output = E[training output]."""
    torch.manual_seed(0)
    L = 2
    skip = SublayerSkip(L, 0.8)
    W = [torch.randn(4, 4) for _ in range(2 * L)]
    x0 = torch.randn(4)

    def run(scales):
        x = x0
        for w, s in zip(W, scales):
            x = x + s * (w @ x0)  # linear branches of the input (no interaction between coins)
        return x

    infer = run(skip.scales(training=False))
    n = 20000
    mean = sum(run(skip.scales(training=True)) for _ in range(n)) / n
    assert torch.allclose(mean, infer, atol=0.05 * infer.abs().max())
    assert skip.scales(training=False) == pytest.approx([1 - p for p in skip.probs])


def test_skip_inactive_gives_no_scales():
    s = SublayerSkip(3, 0.4)
    s.active = False
    assert s.scales(True) is None and s.scales(False) is None


# ----------------------------------------------------------------- group permutation
def test_group_permutation_stays_in_groups_and_reaches_every_order():
    torch.manual_seed(0)
    seen = set()
    for _ in range(300):
        order = layer_order(6, 3, training=True)
        assert sorted(order[:3]) == [0, 1, 2] and sorted(order[3:]) == [3, 4, 5]
        seen.add(tuple(order[:3]))
    assert seen == set(itertools.permutations(range(3)))  # all 3! orders reachable
    assert layer_order(6, 3, training=False) == list(range(6))


def test_group_size_must_divide():
    with pytest.raises(ValueError, match="does not divide"):
        check_group_size(10, 4)
    check_group_size(48, 8)


def test_skip_only_one_kind_of_sublayer():
    both = skip_probabilities(2, 0.4)
    attn = skip_probabilities(2, 0.4, kinds="attn")
    ffn = skip_probabilities(2, 0.4, kinds="ffn")
    assert attn == pytest.approx([both[0], 0.0, both[2], 0.0])  # positions keep their Eq. 5 rate
    assert ffn == pytest.approx([0.0, both[1], 0.0, both[3]])
    torch.manual_seed(0)
    s = SublayerSkip(2, 0.9, kinds="ffn")
    for _ in range(30):
        scales = s.scales(training=True)
        assert scales[0] == scales[2] == 1.0  # attention never skipped
    with pytest.raises(ValueError, match="sub-layer kind"):
        skip_probabilities(2, 0.4, kinds="both-ish")
