"""GPKD pieces in-process: relative positions, GP, skipping sub-layer, student extraction."""

import argparse

import pytest
import torch

from deepnmt_fairseq.modules.student_extraction import extract, remap_state, select_layers
from deepnmt_fairseq.modules.relative_position import RelativePositionEmbeddings, relative_buckets
from fairseq_helpers import build_model, incremental_decode, random_batch, TINY



# ----------------------------------------------------------------- RPR
def test_relative_buckets_clip():
    b = relative_buckets(3, 5, 2)
    assert b.tolist() == [[2, 3, 4, 4, 4], [1, 2, 3, 4, 4], [0, 1, 2, 3, 4]]
    assert relative_buckets(1, 5, 2, q_offset=4).tolist() == [[0, 0, 0, 1, 2]]


def test_relative_terms_match_naive_loops():
    torch.manual_seed(0)
    rel = RelativePositionEmbeddings(4, 2, values=True)
    q = torch.randn(3, 5, 4)
    probs = torch.rand(3, 5, 6).softmax(-1)
    b = relative_buckets(5, 6, 2)
    kl = rel.key_logits(q, b)
    vt = rel.value_term(probs, b)
    for n in range(3):
        for i in range(5):
            for j in range(6):
                a = rel.keys[max(-2, min(2, j - i)) + 2]
                assert torch.allclose(kl[n, i, j], q[n, i] @ a, atol=1e-6)
            ref = sum(probs[n, i, j] * rel.values[max(-2, min(2, j - i)) + 2] for j in range(6))
            assert torch.allclose(vt[n, i], ref, atol=1e-6)


@pytest.mark.parametrize("extra", [
    ["--rpr-max-relative-position", "3"],
    ["--rpr-max-relative-position", "2", "--rpr-values"],
    ["--rpr-max-relative-position", "2", "--deep-memory", "msc", "--msc-block-layers", "1", "--decoder-layers", "2"],
])
def test_rpr_incremental_equals_full(extra):
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "2"] + extra).eval()
    src, lens, tgt = random_batch(model, tgt_len=9)  # longer than k: clipping is exercised
    with torch.no_grad():
        full, _ = model(src, lens, tgt)
        inc = incremental_decode(model, src, lens, tgt)
    assert (full - inc).abs().max() <= 1e-5
    assert any("relative" in n for n, _ in model.named_parameters())


def test_rpr_is_translation_invariant_in_the_encoder_without_absolute_positions():
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "1", "--decoder-layers", "1",
                                                        "--rpr-max-relative-position", "4",
                                                        "--no-token-positional-embeddings"]).eval()
    d = model.encoder.dictionary
    x = torch.tensor([[10, 11, 12, 13, d.eos()]])
    padded = torch.tensor([[d.pad(), d.pad(), 10, 11, 12, 13, d.eos()]])
    with torch.no_grad():
        a = model.encoder(x, torch.tensor([5]))["encoder_out"][0]
        b = model.encoder(padded, torch.tensor([5]))["encoder_out"][0][2:]
    assert torch.allclose(a, b, atol=1e-5)


def test_rpr_named_architecture_counts_within_2_percent():
    from deepnmt_fairseq.analysis.param_counts import build_model as build, count_parameters

    for arch, paper in (("rpr_base_6_6", 62), ("gpkd_student_6_3", 48)):
        n = count_parameters(build(arch, 34000)) / 1e6
        assert abs(n - paper) / paper <= 0.02, (arch, n)


# ----------------------------------------------------------------- GP and SSL in the model
def test_gp_permutes_in_training_only():
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "4", "--decoder-layers", "1",
                                                        "--gp-group-size", "2", "--dropout", "0",
                                                        "--attention-dropout", "0"])
    order = []
    for i, layer in enumerate(model.encoder.layers):
        layer.register_forward_hook(lambda *a, i=i: order.append(i))
    src, lens, _ = random_batch(model)
    model.train()
    torch.manual_seed(0)
    seen = set()
    for _ in range(30):
        order.clear()
        model.encoder(src, lens)
        seen.add(tuple(order))
        assert sorted(order[:2]) == [0, 1] and sorted(order[2:]) == [2, 3]
    assert len(seen) == 4  # 2! x 2! orders, all reached
    model.eval()
    for _ in range(5):
        order.clear()
        model.encoder(src, lens)
        assert order == [0, 1, 2, 3]


def test_ssl_inference_rescales_and_training_skips():
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1",
                                                        "--ssl-rate", "0.8", "--dropout", "0",
                                                        "--attention-dropout", "0"])
    from deepnmt_fairseq.modules.sublayer_skip import BranchScales

    seen = []
    orig = BranchScales.next

    def spy(self):
        seen.append(orig(self))
        return seen[-1]

    BranchScales.next = spy
    try:
        src, lens, _ = random_batch(model)
        model.eval()
        model.encoder(src, lens)
        assert seen == pytest.approx([1 - 0.2, 1 - 0.4, 1 - 0.6, 1 - 0.8])  # p_l = l/(2L)*phi
        seen.clear()
        model.train()
        torch.manual_seed(0)
        for _ in range(50):
            model.encoder(src, lens)
        assert set(seen) == {0.0, 1.0}
    finally:
        BranchScales.next = orig


def test_ssl_two_stage_switch_is_saved_with_the_model():
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1",
                                                        "--ssl-rate", "0.4", "--ssl-start-update", "10"])
    assert model.encoder.draw_branch_scales() is None  # stage 1: no skipping, no rescaling
    model.set_num_updates(10)
    assert model.encoder.draw_branch_scales() is not None
    state = model.state_dict()
    assert bool(state["encoder.ssl_active"])
    fresh = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1",
                                                        "--ssl-rate", "0.4", "--ssl-start-update", "10"])
    fresh.load_state_dict(state)
    fresh.eval()
    assert fresh.encoder.draw_branch_scales() == pytest.approx([0.9, 0.8, 0.7, 0.6])
    # a model trained without skipping loads into an SSL model (fine-tuning = stage 2)
    plain = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1"])
    ssl = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1",
                                                      "--ssl-rate", "0.4"])
    ssl.load_state_dict(plain.state_dict())
    assert bool(ssl.encoder.ssl_active)


def test_stochastic_layers_share_one_coin_per_layer():
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "3", "--decoder-layers", "1",
                                                        "--ssl-rate", "0.6", "--ssl-mode", "layer"])
    model.train()
    torch.manual_seed(0)
    for _ in range(20):
        s = model.encoder.draw_branch_scales()
        assert s[0::2] == s[1::2]
    model.eval()
    assert model.encoder.draw_branch_scales() == pytest.approx([0.8, 0.8, 0.6, 0.6, 0.4, 0.4])


# ----------------------------------------------------------------- extraction
def test_select_layers():
    assert select_layers(6, 2, "first") == [0, 2, 4]
    assert select_layers(6, 3, "last") == [2, 5]
    r = select_layers(48, 8, "random", seed=3)
    assert len(r) == 6 and all(g * 8 <= i < (g + 1) * 8 for g, i in enumerate(r))
    assert select_layers(6, 2, explicit=[1, 2, 5]) == [1, 2, 5]
    with pytest.raises(ValueError, match="not in group"):
        select_layers(6, 2, explicit=[0, 1, 4])
    with pytest.raises(ValueError, match="does not divide"):
        select_layers(6, 4)


def _checkpoint_of(model, args):
    return {"cfg": {"model": args}, "model": model.state_dict(), "extra_state": {}, "optimizer_history": []}


def _args_for(extra):
    from deepnmt_fairseq.analysis.param_counts import build_model as _b  # noqa: F401
    from deepnmt_fairseq.models.deep_transformer import DeepTransformerModel
    from fairseq.models import ARCH_CONFIG_REGISTRY

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    DeepTransformerModel.add_args(parser)
    args = parser.parse_args(extra)
    args.arch = "deepnmt_transformer"
    ARCH_CONFIG_REGISTRY["deepnmt_transformer"](args)
    return args


@pytest.mark.parametrize("extra, enc_h, dec_h", [
    (["--encoder-layers", "4", "--decoder-layers", "2", "--rpr-max-relative-position", "2"], 2, 2),
    (["--deep-memory", "transparent", "--encoder-layers", "6", "--decoder-layers", "2"], 3, 1),
    (["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2"], 2, 1),
])
def test_extracted_student_equals_manually_assembled_model(extra, enc_h, dec_h):
    flags = TINY + extra
    teacher = build_model("deepnmt_transformer", flags, seed=1).eval()
    state = _checkpoint_of(teacher, _args_for(flags))
    # weight remapping only: these teachers are not GP-trained (the procedure's refusal: test_gpkd_procedure.py)
    student_state = extract(state, enc_h, dec_h, "random", seed=4, allow_group_size_mismatch=True)
    info = student_state["extra_state"]["gpkd_student"]
    s_args = student_state["cfg"]["model"]
    # rebuild from the student's config, load the extracted weights
    extracted = build_model("deepnmt_transformer", TINY + _flags_from(s_args), seed=9).eval()
    extracted.load_state_dict(student_state["model"])
    # manual assembly: a fresh student with the teacher's chosen layers copied over
    manual = build_model("deepnmt_transformer", TINY + _flags_from(s_args), seed=5).eval()
    sd = {k: v for k, v in teacher.state_dict().items() if ".layers." not in k and "layer_mix" not in k}
    manual.load_state_dict(sd, strict=False)
    for new, old in enumerate(info["encoder_layers"] or []):
        manual.encoder.layers[new].load_state_dict(teacher.encoder.layers[old].state_dict())
    for new, old in enumerate(info["decoder_layers"] or range(len(teacher.decoder.layers))):
        manual.decoder.layers[new].load_state_dict(teacher.decoder.layers[old].state_dict())
    if getattr(teacher.encoder.memory, "layer_mix", None) is not None:
        rows = [0] + [(g + 1) * enc_h for g in range(len(info["encoder_layers"]))]
        manual.encoder.memory.layer_mix.weight.data.copy_(teacher.encoder.memory.layer_mix.weight.data[rows])
    src, lens, tgt = random_batch(teacher)
    with torch.no_grad():
        a, _ = extracted(src, lens, tgt)
        b, _ = manual(src, lens, tgt)
    assert torch.allclose(a, b, atol=1e-6)
    assert len(extracted.encoder.layers) == len(teacher.encoder.layers) // enc_h


def _flags_from(args):
    keys = ["encoder_layers", "decoder_layers", "deep_memory", "msc_block_layers", "rpr_max_relative_position"]
    out = []
    for k in keys:
        v = getattr(args, k, None)
        if v not in (None, "", 0, "top"):
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


def test_remap_state_renumbers_layers():
    sd = {"encoder.layers.0.w": 0, "encoder.layers.1.w": 1, "encoder.layers.2.w": 2, "encoder.layers.3.w": 3,
          "encoder.embed_tokens.weight": "E", "decoder.layers.0.w": "d"}
    out = remap_state(sd, [1, 3], None)
    assert out == {"encoder.layers.0.w": 1, "encoder.layers.1.w": 3, "encoder.embed_tokens.weight": "E",
                   "decoder.layers.0.w": "d"}


def test_model_trained_with_ssl_loads_without_ssl():
    ssl = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1",
                                                      "--ssl-rate", "0.4"])
    plain = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1"])
    plain.load_state_dict(ssl.state_dict())  # strict: no unexpected ssl_active
    assert torch.equal(plain.encoder.layers[0].fc1.weight, ssl.encoder.layers[0].fc1.weight)
