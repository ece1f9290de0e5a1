"""RNMT+ (Chen et al. 2018) with transparent attention (Bapna et al. 2018): fairseq's contracts.

Tiny models on the CPU: incremental decoding == full forward, beam search in a padded
batch == alone, gradients reach every parameter, transparent weights, no-residual
baseline, per-gate LayerNorm, parameter counts of Tables 3-4, and one end-to-end run
through fairseq's CLIs with ``--user-dir``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_helpers import USER_DIR, build_model, hypotheses, incremental_decode, random_batch, run_cli

# width 8 per direction (layers output 16), 4 encoder layers (residuals on layers 3-4), 4 decoder layers
TINY_RNMT = ["--encoder-embed-dim", "8", "--encoder-hidden-size", "8", "--encoder-layers", "4",
             "--decoder-embed-dim", "8", "--decoder-hidden-size", "8", "--decoder-layers", "4",
             "--attention-heads", "2", "--dropout", "0.1", "--attention-dropout", "0.1"]

VARIANTS = {
    "baseline": [],
    "transparent": ["--deep-memory", "transparent"],
    "transparent-emb-proj": ["--deep-memory", "transparent", "--encoder-embed-dim", "6"],
    "noresidual": ["--no-encoder-residual"],
    "no-layernorm-tanh": ["--no-lstm-layer-norm", "--lstm-output-tanh"],
}


def _model(name, seed=0, extra=()):
    model = build_model("rnmt_plus", TINY_RNMT + VARIANTS[name] + list(extra), seed=seed)
    with torch.no_grad():  # a trained model has a non-uniform mix: perturb the zero-initialised W
        for n, p in model.named_parameters():
            if "layer_mix" in n:
                p.normal_()
    return model


# ---------------------------------------------------------------- incremental == full
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_incremental_decoding_equals_full_forward(name):
    model = _model(name).eval()
    src, lens, tgt = random_batch(model, bsz=3, src_len=7, tgt_len=9)
    with torch.no_grad():
        full, extra = model(src, lens, tgt)
        inc = incremental_decode(model, src, lens, tgt)
    assert full.shape == inc.shape == (3, 9, len(model.decoder.dictionary))
    assert (full - inc).abs().max().item() <= 1e-5
    assert extra["attn"][0].shape == (3, 9, 7)


# ---------------------------------------------------------------- batch invariance / beam reorder
def _beam(model, src, lens, beam=4):
    gen = SequenceGenerator([model], model.decoder.dictionary, beam_size=beam, max_len_b=10)
    with torch.no_grad():
        hyps = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lens}})
    return [(h[0]["tokens"].tolist(), float(h[0]["score"])) for h in hyps]


def _left_padded(d, lengths, width, seed=5):
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), width), d.pad())
    for i, n in enumerate(lengths):  # left padding, as fairseq's translation task
        src[i, width - n:] = torch.randint(d.nspecial, len(d), (n,), generator=g)
        src[i, -1] = d.eos()
    return src, torch.tensor(lengths)


@pytest.mark.parametrize("name", ["baseline", "transparent"])
def test_beam_search_alone_equals_in_padded_batch(name):
    model = _model(name, seed=3).eval().double()
    lengths = [9, 5, 7, 3]
    src, lens = _left_padded(model.encoder.dictionary, lengths, 9)
    batch = _beam(model, src, lens)
    for i, n in enumerate(lengths):
        (alone,) = _beam(model, src[i: i + 1, 9 - n:], lens[i: i + 1])
        assert alone[0] == batch[i][0], f"sentence {i}: {alone[0]} vs {batch[i][0]}"
        # fairseq's SequenceGenerator keeps scores in float32 whatever the model's dtype
        assert abs(alone[1] - batch[i][1]) <= 8 * torch.finfo(torch.float32).eps * max(1.0, abs(batch[i][1]))


def test_reorder_incremental_state_reorders_every_cached_tensor():
    model = _model("transparent").eval()
    src, lens, tgt = random_batch(model, bsz=3, src_len=6, tgt_len=3)
    state = {}
    with torch.no_grad():
        enc = model.encoder(src, lens)
        model.decoder(tgt, encoder_out=enc, incremental_state=state)
    before = model.decoder.get_incremental_state(state, "cached_state")
    order = torch.tensor([2, 0, 2])
    model.decoder.reorder_incremental_state(state, order)
    after = model.decoder.get_incremental_state(state, "cached_state")
    assert set(before) == set(after) == {"h", "c", "ctx", "keys"}
    for key, dim in (("h", 1), ("c", 1), ("ctx", 0), ("keys", 1)):
        assert torch.equal(after[key], before[key].index_select(dim, order)), key
    re_enc = model.encoder.reorder_encoder_out(enc, order)
    assert torch.equal(re_enc["encoder_out"][0], enc["encoder_out"][0][:, order])
    assert torch.equal(re_enc["encoder_padding_mask"][0], enc["encoder_padding_mask"][0][order])


def test_padding_does_not_leak_into_the_bidirectional_encoder():
    model = _model("baseline").eval().double()
    d = model.encoder.dictionary
    src, lens = _left_padded(d, [6, 4], 6)
    with torch.no_grad():
        batch = model.encoder(src, lens)["encoder_out"][0]  # (T, B, d)
        alone = model.encoder(src[1:, 2:], lens[1:])["encoder_out"][0]
    assert torch.allclose(batch[2:, 1], alone[:, 0], atol=1e-12)


# ---------------------------------------------------------------- structure
@pytest.mark.parametrize("name", ["baseline", "transparent", "transparent-emb-proj", "noresidual"])
def test_every_parameter_gets_a_gradient(name):
    model = _model(name).train()
    src, lens, tgt = random_batch(model, bsz=3, src_len=7, tgt_len=5)
    out, _ = model(src, lens, tgt)
    out.float().logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_transparent_mix_is_a_softmax_over_embeddings_and_every_encoder_layer():
    model = _model("transparent").eval()
    mix = model.encoder.memory.layer_mix
    assert tuple(mix.weight.shape) == (4 + 1, 1)  # N + 1 inputs, M = 1 attention module (Bapna Sec. 2.4)
    s = mix.mixing_weights()
    assert torch.allclose(s.sum(0), torch.ones(1)) and (s > 0).all()
    # encoder_out = projection(sum_i s_i h^i), h^0 = [e; e] (E = H)
    src, lens, _ = random_batch(model, bsz=2, src_len=5, tgt_len=2)
    with torch.no_grad():
        out = model.encoder(src, lens, return_all_hiddens=True)
        emb, *layers = out["encoder_states"]
        states = [torch.cat([emb, emb], -1)] + layers
        z = sum(s[i, 0] * h for i, h in enumerate(states))
        expected = model.encoder.output_projection(z)
    assert torch.allclose(out["encoder_out"][0], expected, atol=1e-6)
    # dropout on W only in training, drawn from torch's RNG
    mix.train()
    mix.dropout = 0.5
    torch.manual_seed(0)
    a = mix.mixing_weights()
    torch.manual_seed(0)
    assert torch.equal(a, mix.mixing_weights())
    assert not torch.allclose(a, s)


def test_baseline_attends_to_the_projected_top_layer():
    model = _model("baseline").eval()
    src, lens, _ = random_batch(model, bsz=2, src_len=5, tgt_len=2)
    with torch.no_grad():
        out = model.encoder(src, lens, return_all_hiddens=True)
    assert torch.allclose(out["encoder_out"][0], model.encoder.output_projection(out["encoder_states"][-1]))
    assert not hasattr(model.encoder.memory, "layer_mix")


@pytest.mark.parametrize("name,residual", [("baseline", [False, False, True, True]),
                                           ("noresidual", [False, False, False, False])])
def test_encoder_residuals_from_the_third_layer_and_none_without(name, residual):
    model = _model(name).eval()
    assert [layer.residual for layer in model.encoder.layers] == residual
    x = torch.randn(5, 2, 16)
    layer = model.encoder.layers[3]
    with torch.no_grad():
        y = layer(x, None)
        bare = torch.cat([layer.fwd.run(layer.fwd.input_projection(x))[0],
                          layer.bwd.run(layer.bwd.input_projection(x), reverse=True)[0]], -1)
    assert torch.allclose(y, bare + x if residual[3] else bare)
    # the decoder keeps its residuals in both variants
    assert model.decoder.residual_start == 3


def test_per_gate_layer_norm_cell():
    from deepnmt_fairseq.modules.layer_norm_lstm import LayerNormLSTMCell

    torch.manual_seed(0)
    cell = LayerNormLSTMCell(5, 4)
    with torch.no_grad():
        cell.ln_weight.normal_()
        cell.ln_bias.normal_()
    x, h, c = torch.randn(3, 5), torch.randn(3, 4), torch.randn(3, 4)
    h1, c1 = cell(x, (h, c))
    gates = x @ cell.weight_ih.t() + h @ cell.weight_hh.t()
    normed = []
    for k, g in enumerate(gates.chunk(4, 1)):  # each gate normalised on its own
        g = (g - g.mean(1, keepdim=True)) / (g.var(1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        normed.append(g * cell.ln_weight[k] + cell.ln_bias[k])
    i, f, cand, o = normed  # nn.LSTM's gate order
    c_ref = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cand)
    assert torch.allclose(c1, c_ref, atol=1e-6)
    assert torch.allclose(h1, torch.sigmoid(o) * c_ref, atol=1e-6)  # no output non-linearity
    # without LayerNorm and with tanh it is torch's LSTM cell
    plain = LayerNormLSTMCell(5, 4, layer_norm=False, output_tanh=True)
    ref = torch.nn.LSTMCell(5, 4)
    with torch.no_grad():
        ref.weight_ih.copy_(plain.weight_ih)
        ref.weight_hh.copy_(plain.weight_hh)
        ref.bias_ih.normal_()
        ref.bias_hh.zero_()
        plain.bias.copy_(ref.bias_ih)
        ours, theirs = plain(x, (h, c)), ref(x, (h, c))
    assert torch.allclose(ours[0], theirs[0], atol=1e-6) and torch.allclose(ours[1], theirs[1], atol=1e-6)


def test_clear_errors_name_the_flag():
    with pytest.raises(ValueError, match="--residual-start"):
        build_model("rnmt_plus", TINY_RNMT + ["--residual-start", "1"])
    with pytest.raises(ValueError, match="--attention-heads"):
        build_model("rnmt_plus", TINY_RNMT + ["--attention-heads", "3"])


def test_named_architectures_have_the_papers_parameter_counts():
    """Bapna et al. Tables 3-4 at the paper's 32k vocabulary, built on the meta device (shapes only)."""
    from deepnmt_fairseq.analysis.param_counts import build_model as build_arch, count_parameters
    from deepnmt_fairseq.models.architectures import ARCHS, PAPER_ROWS
    from deepnmt_fairseq.models.rnmt import BAPNA_RNMT_PARAMS, RNMT_ARCHS

    assert len(RNMT_ARCHS) == 13
    counts = {}
    for (variant, width, layers), arch in RNMT_ARCHS.items():
        with torch.device("meta"):
            model = build_arch(arch, 32000)
        counts[arch] = count_parameters(model)
        paper = BAPNA_RNMT_PARAMS[(width, layers)]
        assert abs(counts[arch] / 1e6 - paper) / paper < 0.005, (arch, counts[arch])
        assert PAPER_ROWS[arch][2] == paper and ARCHS[("rnmt_plus", variant, width, layers)] == arch
        assert not any(layer.residual for layer in model.encoder.layers) if variant == "nores" else \
            model.encoder.layers[2].residual
    # the transparent mix adds N + 1 weights only ([e; e] enters the mix without a projection)
    for n in (6, 12, 16, 20):
        assert counts[RNMT_ARCHS[("transparent", 512, n)]] - counts[RNMT_ARCHS[("baseline", 512, n)]] == n + 1
        assert counts[RNMT_ARCHS[("nores", 512, n)]] == counts[RNMT_ARCHS[("baseline", 512, n)]]
    # 6.3M per bidirectional 512 layer (Table 3: 128 -> 165 -> 191 -> 216)
    per_layer = (counts[RNMT_ARCHS[("baseline", 512, 20)]] - counts[RNMT_ARCHS[("baseline", 512, 6)]]) / 14
    assert per_layer == 2 * (4 * 512 * (1024 + 512) + 8 * 512)


# ---------------------------------------------------------------- checkpoints + CLIs
TRAIN_FLAGS = [*TINY_RNMT, "--deep-memory", "transparent", "--encoder-layers", "3", "--decoder-layers", "3"]


N_UPDATES, SPLIT = 5, 2  # 3 batches per epoch (max-tokens 400): the split is mid-epoch, the rest crosses epochs


def _train_rnmt(data_bin, save, max_update):
    return run_cli(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--task", "deep_translation", "--arch", "rnmt_plus",
        *TRAIN_FLAGS, "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "400", "--max-update", max_update,
        "--save-dir", save, "--no-progress-bar", "--log-format", "json", "--log-interval", "1",
        "--seed", "1", "--cpu", "--num-workers", "0", "--no-epoch-checkpoints",
        "--log-diagnostics-every", "1", "--log-grad-ratio", "--log-mixing-weights",
    )


def _train_lines(res):
    return {int(d["num_updates"]): d for d in
            (json.loads(m) for m in re.findall(r"train_inner\W+(\{.*\})", res.stdout + res.stderr))}


@pytest.mark.slow
def test_end_to_end_train_resume_generate_interactive_validate(data_bin, tmp_path):
    save = tmp_path / "ckpt"
    lines = _train_lines(_train_rnmt(data_bin, save, N_UPDATES))
    assert sorted(lines) == list(range(1, N_UPDATES + 1))
    for line in lines.values():  # r_t (Bapna Sec. 2.3) and s_i (Eq. 1) of the RNMT+ encoder
        assert float(line["grad_ratio"]) > 0 and float(line["grad_norm_h1"]) > 0
        mix = [float(line[f"mix_{i}_1"]) for i in range(4)]
        assert abs(sum(mix) - 1) < 1e-3
    assert lines[1]["epoch"] == 1 and lines[N_UPDATES]["epoch"] == 2

    # resume is exact: stop mid-epoch, restart, same losses and bitwise the same weights
    split = tmp_path / "split"
    first = _train_lines(_train_rnmt(data_bin, split, SPLIT))
    second = _train_lines(_train_rnmt(data_bin, split, N_UPDATES))
    assert sorted(first) == list(range(1, SPLIT + 1)) and sorted(second) == list(range(SPLIT + 1, N_UPDATES + 1))
    keys = ("loss", "nll_loss", "gnorm", "lr", "grad_ratio", "mix_0_1")
    assert {u: [d[k] for k in keys] for u, d in {**first, **second}.items()} == \
        {u: [d[k] for k in keys] for u, d in lines.items()}
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    a = load_checkpoint(str(save / "checkpoint_last.pt"))["model"]
    b = load_checkpoint(str(split / "checkpoint_last.pt"))["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    ckpt = save / "checkpoint_last.pt"
    # weights-only loading (torch >= 2.6 default): the plugin's allow-list covers the checkpoint
    state = load_checkpoint(str(ckpt))
    assert "encoder.memory.layer_mix.weight" in state["model"]

    gen = run_cli("fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", ckpt, "--gen-subset", "test",
                  "--beam", "3", "--max-len-b", "12", "--batch-size", "4", "--cpu",
                  "--required-batch-size-multiple", "1", "--print-alignment")
    hyps = hypotheses(gen.stdout)
    assert len(hyps) == 10
    inter = subprocess.run(
        [str(Path(sys.executable).with_name("fairseq-interactive")), str(data_bin), "--user-dir", USER_DIR,
         "--path", str(ckpt), "--beam", "2", "--max-len-b", "10", "--cpu", "--source-lang", "src",
         "--target-lang", "tgt"],
        input="the cat sees a dog\nred house\n", capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300,
    )
    assert inter.returncode == 0, inter.stderr[-3000:]
    assert len(re.findall(r"^H-\d+\t", inter.stdout, re.M)) == 2
    val = run_cli("fairseq-validate", data_bin, "--user-dir", USER_DIR, "--path", ckpt, "--task", "translation",
                  "--valid-subset", "valid",
                  "--cpu", "--max-tokens", "400", "--criterion", "label_smoothed_cross_entropy",
                  "--label-smoothing", "0.1")
    assert re.search(r"valid on 'valid' subset \| loss [0-9.]+", val.stdout + val.stderr)


def test_deep_translation_diagnostics_find_the_rnmt_encoder():
    """``--log-grad-ratio`` hooks ``encoder.layers``; ``--log-mixing-weights`` reads
    ``encoder.memory.layer_mix`` and refuses the baseline naming the flag."""
    from types import SimpleNamespace

    from deepnmt_fairseq.tasks.deep_translation import DeepTranslationTask, _UpdateState

    task = SimpleNamespace(grad_norm_every=0, want_ratio=True, want_mix=True, want_gates=False)
    DeepTranslationTask.check_diagnostics(task, _model("transparent"))
    with pytest.raises(ValueError, match="--deep-memory top"):
        DeepTranslationTask.check_diagnostics(task, _model("baseline"))
    s = DeepTranslationTask.mixing_weights(_model("transparent"))
    assert s.shape == (5, 1) and abs(float(s.sum()) - 1) < 1e-6
    # r_t hooks: h_1 and h_N are the first and last bidirectional layer outputs
    model = _model("baseline").train()
    state = _UpdateState(0)
    handles = DeepTranslationTask._install_ratio_hooks(model, state)
    src, lens, tgt = random_batch(model, bsz=2, src_len=6, tgt_len=4)
    seen = []

    def keep(_module, _inputs, out):
        out.retain_grad()
        seen.append(out)

    extra = [model.encoder.layers[i].register_forward_hook(keep) for i in (0, -1)]
    out, _ = model(src, lens, tgt)
    out.sum().backward()
    for h in handles + extra:
        h.remove()
    assert len(seen) == 2 and seen[0].shape == (6, 2, 16)
    assert torch.allclose(state.h1_sq, seen[0].grad.pow(2).sum())
    assert torch.allclose(state.hn_sq, seen[1].grad.pow(2).sum())
    assert not torch.allclose(state.h1_sq, state.hn_sq)
