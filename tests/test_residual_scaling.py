"""DeepNorm (Wang et al. 2022) and Admin (Liu et al. 2020): the equations by hand.

The end-to-end contracts (train -> resume -> generate -> interactive -> validate, incremental
decoding, beam search in a padded batch, exact resume, student round trips) run in
tests/test_matrix.py and tests/test_exactness.py with the other variants.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_helpers import build_model, random_batch

from deepnmt_fairseq.modules.residual_scaling import (AdminProfile, AdminResidual, deepnorm_constants,
                                                      parse_deepnorm_override)

TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-all-embeddings"]


# ------------------------------------------------------------------ DeepNorm constants
def test_deepnorm_constants_are_the_papers_for_6_6():
    c = deepnorm_constants(6, 6)
    # Wang et al. 2022, encoder-decoder: 0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16), (3M)^(1/4), (12M)^(-1/4)
    assert c.encoder_alpha == pytest.approx(0.81 * 6 ** (5 / 16))
    assert c.encoder_beta == pytest.approx(0.87 * 6 ** (-5 / 16))
    assert c.decoder_alpha == pytest.approx(18 ** 0.25)
    assert c.decoder_beta == pytest.approx(72 ** -0.25)
    assert [round(v, 2) for v in (c.encoder_alpha, c.encoder_beta, c.decoder_alpha, c.decoder_beta)] == \
        [1.42, 0.50, 2.06, 0.34]


def test_deepnorm_constants_use_each_depth_and_the_single_stack_formula():
    c = deepnorm_constants(18, 6)
    assert c.encoder_alpha == pytest.approx(0.81 * (18 ** 4 * 6) ** (1 / 16))
    assert c.decoder_alpha == pytest.approx(18 ** 0.25)  # (3M)^(1/4) depends on M only
    only = deepnorm_constants(12, 0)
    assert only.encoder_alpha == pytest.approx(24 ** 0.25) and only.encoder_beta == pytest.approx(96 ** -0.25)
    with pytest.raises(ValueError, match="--deepnorm-alpha-beta"):
        parse_deepnorm_override("1,2,3")
    assert parse_deepnorm_override("2,0.5,3,0.25").decoder_beta == 0.25


# ------------------------------------------------------------------ DeepNorm forward and init
def _encoder_layer_by_hand(layer, x, w_attn, w_ffn):
    """x_{l+1} = LN(w x_l + G(x_l)) for both sub-layers of a post-norm encoder layer (eval)."""
    a, _ = layer.self_attn(query=x, key=x, value=x, need_weights=False)
    x = layer.self_attn_layer_norm(w_attn * x + a)
    f = layer.fc2(F.relu(layer.fc1(x)))
    return layer.final_layer_norm(w_ffn * x + f)


def test_deepnorm_residual_scale_by_hand_on_a_two_layer_model():
    model = build_model(extra=TINY + ["--deepnorm", "--encoder-layers", "2", "--decoder-layers", "2"]).eval()
    alpha = deepnorm_constants(2, 2).encoder_alpha
    assert alpha != pytest.approx(1.0)
    layer = model.encoder.layers[1]
    assert layer.normalize_before is False  # DeepNorm implies post-norm
    x = torch.randn(5, 3, 16)
    with torch.no_grad():
        ours = layer(x, encoder_padding_mask=None)
        by_hand = _encoder_layer_by_hand(layer, x, alpha, alpha)
        plain = _encoder_layer_by_hand(layer, x, 1.0, 1.0)
    assert torch.allclose(ours, by_hand, atol=1e-6)
    assert not torch.allclose(ours, plain, atol=1e-3)
    # the decoder's alpha is (3M)^(1/4), in all three sub-layers
    assert model.decoder.layers[0].residual_weight.alpha == pytest.approx(6 ** 0.25)


def test_deepnorm_init_gains():
    """Xavier normal with gain beta on fc1/fc2/v_proj/out_proj, gain 1 on q_proj/k_proj
    (Wang et al. 2022, Fig. 2), measured as the weights' standard deviation."""
    wide = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256",
            "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
    model = build_model(extra=wide + ["--deepnorm", "--encoder-layers", "6", "--decoder-layers", "6"], seed=1)
    plain = build_model(extra=wide + ["--post-norm", "--encoder-layers", "6", "--decoder-layers", "6"], seed=1)
    c = deepnorm_constants(6, 6)

    def xavier_std(w, gain):
        fan_out, fan_in = w.shape
        return gain * math.sqrt(2.0 / (fan_in + fan_out))

    def check(stack, beta):
        for layer in stack.layers:
            attns = [layer.self_attn] + ([layer.encoder_attn] if getattr(layer, "encoder_attn", None) else [])
            for w in [layer.fc1.weight, layer.fc2.weight] + [a.v_proj.weight for a in attns] + \
                     [a.out_proj.weight for a in attns]:
                assert w.std().item() == pytest.approx(xavier_std(w, beta), rel=0.08)
            for w in [a.q_proj.weight for a in attns] + [a.k_proj.weight for a in attns]:
                assert w.std().item() == pytest.approx(xavier_std(w, 1.0), rel=0.08)

    check(model.encoder, c.encoder_beta)
    check(model.decoder, c.decoder_beta)
    # and fairseq's own init differs (q/k/v: Xavier uniform with gain 1/sqrt 2), so the test can fail
    w = plain.encoder.layers[0].fc1.weight
    assert w.std().item() != pytest.approx(xavier_std(w, c.encoder_beta), rel=0.08)


def test_deepnorm_with_msc_scales_both_attentions_and_leaves_the_gate_and_gru_at_their_init():
    """DeepNorm's beta goes by layer name (fc1/fc2/v_proj/out_proj: beta; q_proj/k_proj: 1). With MSC
    (docs/mechanisms.md, 'DeepNorm with MSC'): the fused attention's ATTN_h *and* ATTN_c projections get
    them, in the encoder (Eq. 12) and the decoder (Eq. 13); the gate's W1, W2 (Eq. 12-13) and the shared
    GRU cell of the context (Eq. 9) keep their default initialisation: bit for bit the post-norm MSC
    model's of the same seed in the encoder, built before DeepNorm re-initialises anything."""
    wide = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256",
            "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
    msc = ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "3"]
    model = build_model(extra=wide + msc + ["--deepnorm"], seed=1)
    plain = build_model(extra=wide + msc + ["--post-norm"], seed=1)
    c = deepnorm_constants(6, 3)

    def xavier_std(w, gain):
        fan_out, fan_in = w.shape
        return gain * math.sqrt(2.0 / (fan_in + fan_out))

    fused = {"encoder": [layer.self_attn for layer in model.encoder.layers],
             "decoder": [layer.encoder_attn for layer in model.decoder.layers]}
    assert all(type(a).__name__ == "ContextFusionAttention" for attns in fused.values() for a in attns)
    for side, beta in (("encoder", c.encoder_beta), ("decoder", c.decoder_beta)):
        for attn in fused[side]:
            for a in (attn, attn.context_attn):  # ATTN_h and ATTN_c
                for w in (a.v_proj.weight, a.out_proj.weight):
                    assert w.std().item() == pytest.approx(xavier_std(w, beta), rel=0.1), side
                for w in (a.q_proj.weight, a.k_proj.weight):
                    assert w.std().item() == pytest.approx(xavier_std(w, 1.0), rel=0.1), side
            # the gate: torch's nn.Linear default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), not Xavier-normal
            for w in (attn.fusion.w1.weight, attn.fusion.w2.weight):
                bound = 1 / math.sqrt(w.shape[1])
                assert w.abs().max().item() <= bound
                assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    for mine, theirs in zip(model.encoder.layers, plain.encoder.layers):
        for name in ("fusion.w1.weight", "fusion.w1.bias", "fusion.w2.weight"):
            assert torch.equal(mine.self_attn.get_parameter(name), theirs.self_attn.get_parameter(name)), name
    gru = dict(model.encoder.named_parameters())
    gru_plain = dict(plain.encoder.named_parameters())
    cell = [n for n in gru if ".cell." in n]
    assert cell and all(torch.equal(gru[n], gru_plain[n]) for n in cell)
    # sensitivity: the same ATTN_c value projection in the plain model is not beta-scaled
    w = plain.encoder.layers[0].self_attn.context_attn.v_proj.weight
    assert w.std().item() != pytest.approx(xavier_std(w, c.encoder_beta), rel=0.1)


def test_deepnorm_override_and_student_depths():
    m = build_model(extra=TINY + ["--deepnorm", "--deepnorm-alpha-beta", "3,0.5,4,0.25", "--encoder-layers", "2",
                                  "--decoder-layers", "1"])
    assert m.encoder.layers[0].residual_weight.alpha == 3 and m.decoder.layers[0].residual_weight.alpha == 4


# ------------------------------------------------------------------ Admin
def test_admin_profile_recursion_from_known_variances():
    """omega_1 = 1, omega_{i+1}^2 = Var[omega_i x] + Var[f_i(x)] (released code's form of
    omega_i^2 = sum_{j<i} Var[f_j])."""
    g = torch.Generator().manual_seed(0)
    res = AdminResidual(slots=2, dim=1000)
    prof = AdminProfile()
    res.profile = prof
    x = torch.randn(4, 1000, generator=g)
    f1 = 2.0 * torch.randn(4, 1000, generator=g)
    out = res(x, f1, 0)
    assert res.omega_init[0].item() == 1.0
    assert torch.equal(out, x + f1)
    expected = math.sqrt(x.var(unbiased=False).item() + f1.var(unbiased=False).item())
    assert prof.ratio == pytest.approx(expected) and prof.ratio == pytest.approx(math.sqrt(5), rel=0.05)
    f2 = 3.0 * torch.randn(4, 1000, generator=g)
    res(x, f2, 1)
    assert res.omega_init[1].item() == pytest.approx(expected)
    assert prof.ratio == pytest.approx(math.sqrt((expected * x).var(unbiased=False).item()
                                                 + f2.var(unbiased=False).item()))
    res.profile = None
    y = res(x, f2, 1)
    assert torch.allclose(y, x * expected + f2)


def _admin_model(extra=(), seed=0):
    return build_model(extra=TINY + ["--admin", "--encoder-layers", "2", "--decoder-layers", "2", *extra], seed=seed)


def test_admin_profile_of_a_two_layer_encoder_by_hand():
    model = _admin_model()
    src, lens, tgt = random_batch(model, bsz=3, src_len=7, tgt_len=6, pad_last=False)
    omegas = model.profile_admin(src, lens, tgt)
    assert bool(model.admin_profiled)
    assert len(omegas["encoder"]) == 4 and len(omegas["decoder"]) == 6
    # by hand, in eval mode: the sub-layers' outputs and the recursion
    enc = model.encoder.eval()
    with torch.no_grad():
        x, _ = enc.forward_embedding(src)
        x = x.transpose(0, 1)
        ratio, expected = 1.0, []
        for layer in enc.layers:
            w = layer.residual_weight
            a, _ = layer.self_attn(query=x, key=x, value=x, need_weights=False)
            expected.append(ratio)
            ratio = math.sqrt((ratio * x).var(unbiased=False).item() + a.var(unbiased=False).item())
            x = layer.self_attn_layer_norm(w.omega(0) * x + a)
            f = layer.fc2(F.relu(layer.fc1(x)))
            expected.append(ratio)
            ratio = math.sqrt((ratio * x).var(unbiased=False).item() + f.var(unbiased=False).item())
            x = layer.final_layer_norm(w.omega(1) * x + f)
    assert omegas["encoder"] == pytest.approx(expected, rel=1e-5)
    assert [v for layer in enc.layers for v in layer.residual_weight.omega_init.tolist()] == \
        pytest.approx(expected, rel=1e-5)
    assert omegas["encoder"][1] > 1.0  # the profile moved omega


def test_admin_profiles_once_on_the_first_training_batch_deterministically():
    a, b = _admin_model(seed=4), _admin_model(seed=4)
    batch = random_batch(a, bsz=3, src_len=7, tgt_len=6)
    assert not bool(a.admin_profiled)
    a.eval()
    a(*batch)  # inference never profiles
    assert not bool(a.admin_profiled)
    for m in (a, b):
        m.train()
        m(*batch)
    assert bool(a.admin_profiled)
    init_a = {n: t.clone() for n, t in a.named_buffers() if n.endswith("omega_init")}
    init_b = {n: t for n, t in b.named_buffers() if n.endswith("omega_init")}
    assert init_a.keys() == init_b.keys() and all(torch.equal(init_a[n], init_b[n]) for n in init_a)
    assert any((t != 1).any() for t in init_a.values())
    # a second batch does not profile again
    other = random_batch(a, bsz=2, src_len=5, tgt_len=4, seed=9)
    a(*other)
    assert all(torch.equal(init_a[n], t) for n, t in a.named_buffers() if n.endswith("omega_init"))
    # the profile lives in buffers, out of the optimizer's parameters (fp16's fp32 master copy)
    assert not any("omega_init" in n for n, _ in a.named_parameters())
    # it is in the state dict, so a loaded (resumed) model does not profile again
    c = _admin_model(seed=5)
    c.load_state_dict(copy.deepcopy(a.state_dict()))
    assert bool(c.admin_profiled)
    c.train()
    c(*other)
    assert all(torch.equal(init_a[n], t) for n, t in c.named_buffers() if n.endswith("omega_init"))


def test_admin_omega_is_learned():
    model = _admin_model()
    batch = random_batch(model, bsz=3, src_len=7, tgt_len=6)
    model.train()
    out, _ = model(*batch)
    out.float().logsumexp(-1).sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if n.endswith("omega_delta")]
    assert len(grads) == 4 and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["--deepnorm", "--admin"])
def test_half_precision_forward_and_backward_are_finite(method, dtype):
    model = build_model(extra=TINY + [method, "--encoder-layers", "6", "--decoder-layers", "2"])
    batch = random_batch(model, bsz=3, src_len=7, tgt_len=6)
    model.to(dtype).train()
    out, _ = model(*batch)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().log_softmax(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
