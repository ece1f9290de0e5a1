"""CAD and the collapse-reducing criterion (DDR, ALD, encoder L2) against direct references."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from deepnmt_fairseq.criterions.collapse_reducing import CollapseReducingCriterion
from deepnmt_fairseq.modules.collapse_losses import (
    ald_loss,
    bidirectional_kl,
    masked_mean,
    unk_corrupt,
)
from fairseq_helpers import build_model, random_batch, TINY



# ----------------------------------------------------------------- loss pieces
def test_bidirectional_kl_reference_and_symmetry():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, 7).log_softmax(-1), torch.randn(3, 4, 7).log_softmax(-1)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, -1] = False
    ref = 0.5 * (F.kl_div(b, a, log_target=True, reduction="none").sum(-1)
                 + F.kl_div(a, b, log_target=True, reduction="none").sum(-1))
    got = bidirectional_kl(a, b, mask)
    assert torch.allclose(got[mask], ref[mask], atol=1e-6)
    assert got[0, -1] == 0
    assert torch.allclose(got, bidirectional_kl(b, a, mask))
    assert bidirectional_kl(a, a).abs().max() < 1e-7


def test_ald_loss_reference():
    torch.manual_seed(0)
    g, gp, gn = torch.randn(5, 8), torch.randn(5, 8), torch.randn(5, 8)
    tau = 0.1
    cp = F.cosine_similarity(g, gp) / tau
    cn = F.cosine_similarity(g, gn) / tau
    ref = -torch.log(torch.exp(cp) / (torch.exp(cp) + torch.exp(cn)))
    assert torch.allclose(ald_loss(g, gp, gn, tau), ref, atol=1e-5)
    # positive identical to the anchor and negative orthogonal -> small loss
    e1, e2 = torch.eye(8)[:1], torch.eye(8)[1:2]
    assert ald_loss(e1, e1, e2, tau).item() < 1e-3


def test_unk_corruption_fractions_and_protected_tokens():
    torch.manual_seed(0)
    pad, eos, unk = 1, 2, 3
    tokens = torch.tensor([[pad, pad, 10, 11, 12, 13, eos], [20, 21, 22, 23, 24, 25, eos]])
    replaceable = tokens.ne(pad) & tokens.ne(eos)
    gamma = torch.tensor([0.25, 0.4])
    x_pos, x_neg = unk_corrupt(tokens, (gamma, 1 - gamma), unk, replaceable)
    n = replaceable.sum(1)
    assert (x_pos.eq(unk).sum(1) == torch.round(gamma * n)).all()  # 1 of 4, 2 of 6
    assert (x_neg.eq(unk).sum(1) == torch.round((1 - gamma) * n)).all()  # 3 of 4, 4 of 6
    for x in (x_pos, x_neg):
        assert torch.equal(x[~replaceable], tokens[~replaceable])  # EOS and padding untouched
    assert (x_neg.eq(unk) | ~x_pos.eq(unk)).all()  # X+'s UNKs are a subset of X-'s


def test_masked_mean():
    f = torch.arange(12.0).view(1, 4, 3)
    m = torch.tensor([[True, True, False, False]])
    assert torch.allclose(masked_mean(f, m), f[0, :2].mean(0, keepdim=True))


# ----------------------------------------------------------------- CAD in the model
def test_cad_full_drop_layers_have_no_cross_attention():
    model = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "4", "--cad-drop-depth", "3",
                                                        "--cad-drop-ratio", "1.0"])
    assert [layer.encoder_attn is None for layer in model.decoder.layers] == [True, True, True, False]
    assert not any("layers.0.encoder_attn" in n for n, _ in model.named_parameters())


def test_cad_never_drops_at_eval_and_drops_in_training():
    model = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "3", "--cad-drop-depth", "2",
                                                        "--cad-drop-ratio", "0.5", "--dropout", "0",
                                                        "--attention-dropout", "0"])
    src, lens, tgt = random_batch(model)
    calls = []
    for i, layer in enumerate(model.decoder.layers):
        layer.encoder_attn.register_forward_hook(lambda *a, i=i: calls.append(i))
    model.eval()
    with torch.no_grad():
        for _ in range(20):
            model(src, lens, tgt)
    assert calls.count(0) == calls.count(1) == calls.count(2) == 20
    calls.clear()
    model.train()
    torch.manual_seed(0)
    outs = set()
    for _ in range(40):
        out, _ = model(src, lens, tgt)
        outs.add(round(out.sum().item(), 3))
    assert 5 < calls.count(0) < 35 and 5 < calls.count(1) < 35 and calls.count(2) == 40
    assert len(outs) > 1  # different structures give different outputs


# ----------------------------------------------------------------- CAD's two readings
def test_cad_drop_probabilities_of_both_readings():
    from deepnmt_fairseq.modules.cross_attention_drop import drop_probabilities, layers_without_cross_attention

    # consistent (default): layers above the drop depth always keep their cross-attention
    assert drop_probabilities(5, 3, 0.5) == [0.5, 0.5, 0.5, 0.0, 0.0]
    assert drop_probabilities(5, 3, 0.5, "consistent") == drop_probabilities(5, 3, 0.5)
    assert drop_probabilities(4, 0, 0.0) == [0.0] * 4  # CAD off
    assert layers_without_cross_attention([1.0, 1.0, 0.0]) == [True, True, False]
    # literal (Sec. 3.3): "p_net^l = p_net, 1 <= l <= L_dr ... p_net^l = 1.0 for layers l > L_dr"
    assert drop_probabilities(5, 3, 0.5, "literal") == [0.5, 0.5, 0.5, 1.0, 1.0]
    assert drop_probabilities(5, 5, 0.25, "literal") == [0.25] * 5
    assert layers_without_cross_attention([1.0, 0.5, 1.0], "literal") == [False, False, False]
    for depth, ratio in ((0, 0.0), (0, 0.5), (4, 1.0), (2, 1.0)):  # no cross-attention would ever be trained
        with pytest.raises(ValueError, match="literal"):
            drop_probabilities(4, depth, ratio, "literal")
    with pytest.raises(ValueError, match="--cad-reading"):
        drop_probabilities(4, 2, 0.5, "letter")


def test_cad_coins_of_both_readings():
    from deepnmt_fairseq.modules.cross_attention_drop import sample_keep

    for reading, probs in (("consistent", [0.5, 0.5, 0.0, 0.0]), ("literal", [0.5, 0.5, 1.0, 1.0])):
        torch.manual_seed(0)
        kept = [sample_keep(probs, True, reading) for _ in range(400)]
        for layer, p in enumerate(probs):
            rate = sum(k[layer] for k in kept) / len(kept)
            if p in (0.0, 1.0):
                assert rate == 1.0 - p  # never / always dropped in training
            else:
                assert 0.42 < rate < 0.58
        # the same global RNG draws: one coin per layer per pass, in both readings
        torch.manual_seed(1)
        u = torch.rand(len(probs)).tolist()
        torch.manual_seed(1)
        assert sample_keep(probs, True, reading) == [ui >= p for ui, p in zip(u, probs)]
    # inference: the literal reading uses every cross-attention, p^l = 1 included
    assert sample_keep([0.5, 1.0, 1.0], False, "literal") == [True, True, True]
    assert sample_keep([1.0, 0.5, 0.0], False, "consistent") == [False, True, True]


def test_cad_literal_reading_in_the_model():
    """--cad-reading literal: all layers built with cross-attention; in training the layers above
    the drop depth never use it and those below do half the time; at inference all use it."""
    model = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "4", "--cad-drop-depth", "2",
                                                        "--cad-drop-ratio", "0.5", "--cad-reading", "literal",
                                                        "--dropout", "0", "--attention-dropout", "0"])
    assert model.decoder.cad_probs == [0.5, 0.5, 1.0, 1.0]
    assert all(layer.encoder_attn is not None for layer in model.decoder.layers)
    src, lens, tgt = random_batch(model)
    calls = []
    for i, layer in enumerate(model.decoder.layers):
        layer.encoder_attn.register_forward_hook(lambda *a, i=i: calls.append(i))
    model.eval()
    with torch.no_grad():
        for _ in range(5):
            model(src, lens, tgt)
    assert [calls.count(i) for i in range(4)] == [5, 5, 5, 5]
    calls.clear()
    model.train()
    torch.manual_seed(0)
    for _ in range(40):
        out, _ = model(src, lens, tgt)
    out.sum().backward()  # the never-used cross-attentions stay in the graph with a zero gradient
    assert 5 < calls.count(0) < 35 and 5 < calls.count(1) < 35 and calls.count(2) == calls.count(3) == 0
    grad = model.decoder.layers[3].encoder_attn.k_proj.weight.grad
    assert grad is not None and grad.abs().max() == 0
    # p_net < 1 at full depth: every layer keeps its cross-attention, used at inference
    full = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "3", "--cad-drop-depth", "3",
                                                       "--cad-drop-ratio", "0.25", "--cad-reading", "literal"])
    assert full.decoder.cad_probs == [0.25] * 3
    # p_net = 1.0 under the letter is p^l = 1 in every layer: refused (the default reading builds
    # layers 1..L_dr without cross-attention and keeps the others')
    with pytest.raises(ValueError, match="none would ever be trained"):
        build_model("deepnmt_transformer", TINY + ["--decoder-layers", "4", "--cad-drop-depth", "3",
                                                    "--cad-drop-ratio", "1.0", "--cad-reading", "literal"])
    with pytest.raises(ValueError, match="none would ever be trained"):
        build_model("deepnmt_transformer", TINY + ["--decoder-layers", "4", "--cad-drop-depth", "0",
                                                    "--cad-drop-ratio", "0.5", "--cad-reading", "literal"])


# ----------------------------------------------------------------- the criterion
def _criterion(model, **kw):
    d = model.encoder.dictionary
    task = SimpleNamespace(source_dictionary=d, target_dictionary=d)
    args = dict(sentence_avg=False, label_smoothing=0.1, ddr_alpha=1.0, ald_alpha=0.5, ald_p=0.3, ald_tau=0.1,
                encoder_l2=0.0)
    args.update(kw)
    return CollapseReducingCriterion(task, **args)


def _sample(model):
    src, lens, tgt = random_batch(model, bsz=3, src_len=7, tgt_len=6)
    target = torch.cat([tgt[:, 1:], torch.full((3, 1), model.decoder.dictionary.eos())], 1)
    return {"net_input": {"src_tokens": src, "src_lengths": lens, "prev_output_tokens": tgt},
            "target": target, "ntokens": int(target.ne(1).sum()), "id": torch.arange(3)}


def test_ddr_is_zero_without_randomness_and_matches_reference():
    model = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "2", "--dropout", "0",
                                                        "--attention-dropout", "0"])
    crit = _criterion(model, ald_alpha=0.0)
    sample = _sample(model)
    model.train()
    _, _, log = crit(model, sample)
    assert abs(float(log["ddr_loss"])) < 1e-6  # two identical passes

    model = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "2", "--dropout", "0.3"])
    crit = _criterion(model, ald_alpha=0.0)
    model.train()
    torch.manual_seed(3)
    loss, sample_size, log = crit(model, sample)
    # reference: replay the same RNG stream by hand
    torch.manual_seed(3)
    net = sample["net_input"]
    enc = model.encoder(net["src_tokens"], net["src_lengths"])
    o1 = model.decoder(net["prev_output_tokens"], encoder_out=enc)
    o2 = model.decoder(net["prev_output_tokens"], encoder_out=enc)
    lp1, lp2 = o1[0].log_softmax(-1), o2[0].log_softmax(-1)
    mask = sample["target"].ne(1)
    kl = 0.5 * ((lp1.exp() - lp2.exp()) * (lp1 - lp2)).sum(-1)[mask].sum()
    assert float(log["ddr_loss"]) > 1e-4
    assert torch.allclose(log["ddr_loss"], kl.detach(), rtol=1e-5)
    ce1, _ = crit.compute_loss(model, o1, sample)
    ce2, _ = crit.compute_loss(model, o2, sample)
    assert torch.allclose(loss, (ce1 + ce2) / 2 + kl, rtol=1e-5)


def test_ald_matches_reference_and_reaches_the_encoder():
    model = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "2", "--dropout", "0",
                                                        "--attention-dropout", "0"])
    crit = _criterion(model, ddr_alpha=0.0)
    sample = _sample(model)
    model.train()
    torch.manual_seed(5)
    loss, sample_size, log = crit(model, sample)
    torch.manual_seed(5)
    net = sample["net_input"]
    mask = sample["target"].ne(1)

    def pooled(src):
        enc = model.encoder(src, net["src_lengths"])
        feats, _ = model.decoder(net["prev_output_tokens"], encoder_out=enc, features_only=True)
        return feats, masked_mean(feats, mask)

    feats, g = pooled(net["src_tokens"])
    gamma = torch.rand(3) * 0.3
    src = net["src_tokens"]
    replaceable = src.ne(1) & src.ne(2) & src.ne(0)
    x_pos, x_neg = unk_corrupt(src, (gamma, 1 - gamma), 3, replaceable)
    ref = ald_loss(g, pooled(x_pos)[1], pooled(x_neg)[1], 0.1).mean()
    assert torch.allclose(log["ald_loss"] / 3, ref.detach(), rtol=1e-5)
    ce, _ = crit.compute_loss(model, (model.decoder.output_layer(feats), None), sample)
    assert torch.allclose(loss, ce + 0.5 * ref * sample_size, rtol=1e-5)

    # gradients reach the encoder through ALD alone (CE switched off)
    model.zero_grad()
    crit.compute_loss = lambda *a, **k: (torch.zeros(()), torch.zeros(()))
    ald_only, _, _ = crit(model, sample)
    ald_only.backward()
    enc_grad = model.encoder.layers[0].fc1.weight.grad
    assert enc_grad is not None and enc_grad.abs().sum() > 0


def test_extra_passes_only_in_training():
    model = build_model("deepnmt_transformer", TINY + ["--decoder-layers", "2"])
    crit = _criterion(model, encoder_l2=1e-3)
    sample = _sample(model)
    calls = []
    model.encoder.register_forward_hook(lambda *a: calls.append("enc"))
    model.decoder.register_forward_hook(lambda *a: calls.append("dec"))
    model.eval()
    with torch.no_grad():
        _, _, log = crit(model, sample)
    assert calls == ["enc", "dec"] and "ddr_loss" not in log and "ald_loss" not in log
    calls.clear()
    model.train()
    _, _, log = crit(model, sample)
    assert calls.count("enc") == 3 and calls.count("dec") == 4  # +1 decoder (DDR), +2 enc/dec (ALD)
    assert "encoder_l2" in log


def test_encoder_l2_term_counts_weight_matrices_only():
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "1"])
    crit = _criterion(model)
    ref = sum(p.pow(2).sum() for n, p in model.encoder.named_parameters()
              if p.dim() >= 2 and "embed_tokens" not in n)
    assert torch.allclose(crit.encoder_l2_term(model), ref)


def test_bad_criterion_settings():
    model = build_model("deepnmt_transformer", TINY)
    with pytest.raises(ValueError, match="--ald-p"):
        _criterion(model, ald_p=0.6)
    with pytest.raises(ValueError, match="--ald-tau"):
        _criterion(model, ald_tau=0.0)
