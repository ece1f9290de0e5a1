"""MSC Eq. 12 as written (the default) and the count-fitting LayerNorms (an option).

Wei et al. 2020, Eq. 12: O = g * ATTN_h(H, H, H) + (1 - g) * ATTN_c(H, C, C) + H,
g = sigma(W1 ATTN_h + W2 ATTN_c + b).  ``--msc-count-fitting-norms`` adds a LayerNorm on
ATTN_c's query and one on the gate pre-activation (docs/parameter-counts.md).
"""

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_helpers import TINY, build_model, incremental_decode, random_batch

MSC = TINY + ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
              "--dropout", "0", "--attention-dropout", "0"]
FIT = ["--msc-count-fitting-norms"]


def _reference_fused(attn, x, c):
    """Eq. 12's fused attention computed from the module's weights, piece by piece."""
    a_h, _ = MultiheadAttention.forward(attn, x, x, x, need_weights=False)
    c = attn.context_norm(c)
    q_c = x if attn.context_query_norm is None else attn.context_query_norm(x)
    a_c, _ = attn.context_attn(q_c, c, c, need_weights=False)
    z = attn.fusion.w1(a_h) + attn.fusion.w2(a_c)
    if attn.fusion.norm is not None:
        z = attn.fusion.norm(z)
    g = torch.sigmoid(z)
    return g * a_h + (1 - g) * a_c


@pytest.mark.parametrize("extra", [[], FIT], ids=["literal", "count-fitting"])
def test_encoder_fused_attention_is_eq12(extra):
    model = build_model("deepnmt_transformer", MSC + extra, seed=3).eval()
    attn = model.encoder.layers[1].self_attn
    literal = not extra
    assert (attn.context_query_norm is None) == literal and (attn.fusion.norm is None) == literal
    with torch.no_grad():
        for p in attn.parameters():  # LayerNorms away from identity, so that they matter
            p.add_(0.1 * torch.randn_like(p))
        x, c = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
        attn.set_context(c, None)
        out, _ = attn(x, x, x, need_weights=False)
        attn.set_context(None, None)
        assert torch.allclose(out, _reference_fused(attn, x, c), atol=1e-5)
        if literal:  # and the count-fitting reading would differ on the same weights
            attn.add_count_fitting_norms()
            for m in (attn.context_query_norm, attn.fusion.norm):
                m.weight.mul_(1.5)
            attn.set_context(c, None)
            assert not torch.allclose(attn(x, x, x, need_weights=False)[0], out, atol=1e-3)
            attn.set_context(None, None)


def test_decoder_gate_never_has_the_norms():
    """Eq. 13 (decoder) gets neither norm in either reading."""
    for extra in ([], FIT):
        model = build_model("deepnmt_transformer", MSC + extra)
        for layer in model.decoder.layers:
            assert layer.encoder_attn.context_query_norm is None and layer.encoder_attn.fusion.norm is None


def test_count_fitting_norms_add_two_layernorms_per_encoder_layer():
    plain = build_model("deepnmt_transformer", MSC)
    fit = build_model("deepnmt_transformer", MSC + FIT)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(fit) - n(plain) == len(fit.encoder.layers) * 2 * (2 * 16)
    extra = set(fit.state_dict()) - set(plain.state_dict())
    assert extra and set(plain.state_dict()) <= set(fit.state_dict())
    assert all(".self_attn.context_query_norm." in k or ".self_attn.fusion.norm." in k for k in extra)
    assert all(k.startswith("encoder.layers.") for k in extra)


def test_checkpoint_with_the_norms_loads_into_a_default_model():
    """Checkpoints trained before the literal default (norms always on) load unchanged."""
    old = build_model("deepnmt_transformer", MSC + FIT, seed=1).eval()
    with torch.no_grad():
        for name, p in old.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    new = build_model("deepnmt_transformer", MSC, seed=2).eval()
    new.load_state_dict({k: v.clone() for k, v in old.state_dict().items()})  # fairseq's load
    assert new.encoder.layers[0].self_attn.context_query_norm is not None
    assert set(new.state_dict()) == set(old.state_dict())
    src, lens, tgt = random_batch(new)
    with torch.no_grad():
        ref, _ = old(src, lens, tgt)
        assert torch.allclose(new(src, lens, tgt)[0], ref, atol=1e-6)
        assert (incremental_decode(new, src, lens, tgt) - ref).abs().max() <= 1e-5


def test_literal_checkpoint_into_a_count_fitting_model_names_the_flag():
    literal = build_model("deepnmt_transformer", MSC)
    fit = build_model("deepnmt_transformer", MSC + FIT)
    with pytest.raises(ValueError, match="--msc-count-fitting-norms"):
        fit.load_state_dict(literal.state_dict())


@pytest.mark.parametrize("extra", [[], FIT], ids=["literal", "count-fitting"])
def test_incremental_decoding_equals_full_forward(extra):
    model = build_model("deepnmt_transformer", MSC + extra, seed=4).eval()
    src, lens, tgt = random_batch(model)
    with torch.no_grad():
        full, _ = model(src, lens, tgt)
        assert (incremental_decode(model, src, lens, tgt) - full).abs().max() <= 1e-5


def test_distributed_resume_of_a_count_fitting_checkpoint_names_the_flag(monkeypatch):
    """Parameters added after the DDP wrapper would not be synchronised: refuse, naming the flag."""
    old = build_model("deepnmt_transformer", MSC + FIT)
    new = build_model("deepnmt_transformer", MSC)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    with pytest.raises(ValueError, match="resume it with --msc-count-fitting-norms"):
        new.load_state_dict(old.state_dict())
