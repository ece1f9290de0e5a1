"""The deep backbone in-process: memories, incremental decoding, beam search, configs."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_helpers import build_model, incremental_decode, random_batch, TINY_DROPOUT as TINY


CONFIGS = {
    "prenorm": ["--encoder-layers", "4", "--decoder-layers", "2"],
    "postnorm": ["--encoder-layers", "3", "--decoder-layers", "2", "--post-norm"],
    "transparent": ["--deep-memory", "transparent", "--encoder-layers", "4", "--decoder-layers", "3"],
    "transparent-postnorm": ["--deep-memory", "transparent", "--encoder-layers", "3", "--decoder-layers", "2",
                             "--post-norm"],
    "msc-gate": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "3"],
    "msc-uneven-blocks": ["--deep-memory", "msc", "--msc-block-layers", "1,3,2", "--decoder-layers", "3"],
    "msc-add": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2", "--msc-fusion", "add"],
    "msc-ffn-cell": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                     "--msc-context-cell", "ffn"],
    "msc-no-enc-ctx": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                       "--msc-no-encoder-context"],
    "msc-no-ctx": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                   "--msc-context-cell", "none"],
    "msc-postnorm": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                     "--post-norm"],
    "cad-half": ["--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth", "2", "--cad-drop-ratio", "0.5"],
    "cad-full": ["--encoder-layers", "2", "--decoder-layers", "3", "--cad-drop-depth", "2", "--cad-drop-ratio", "1.0"],
    "msc-cad": ["--deep-memory", "msc", "--msc-block-layers", "1", "--decoder-layers", "3", "--cad-drop-depth", "1",
                "--cad-drop-ratio", "1.0"],
    "transparent-cad": ["--deep-memory", "transparent", "--encoder-layers", "2", "--decoder-layers", "3",
                        "--cad-drop-depth", "2", "--cad-drop-ratio", "0.5"],
    "ssl-gp-rpr": ["--encoder-layers", "4", "--decoder-layers", "2", "--ssl-rate", "0.4", "--ssl-decoder",
                   "--gp-group-size", "2", "--gp-decoder-group-size", "2", "--rpr-max-relative-position", "2"],
    "stochastic-layers-layerdrop": ["--encoder-layers", "3", "--decoder-layers", "2", "--ssl-rate", "0.3",
                                    "--ssl-mode", "layer", "--encoder-layerdrop", "0.2", "--decoder-layerdrop", "0.2"],
    "dlcl": ["--deep-memory", "dlcl", "--encoder-layers", "4", "--decoder-layers", "2"],
    "msc-rpr-ssl": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2",
                    "--rpr-max-relative-position", "2", "--ssl-rate", "0.4", "--gp-group-size", "2"],
}


def _model(name, extra=(), seed=0):
    return build_model("deepnmt_transformer", TINY + CONFIGS[name] + list(extra), seed=seed)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_incremental_decoding_equals_full_forward(name):
    model = _model(name).eval()
    src, lens, tgt = random_batch(model, bsz=3, src_len=7, tgt_len=6)
    with torch.no_grad():
        full, _ = model(src, lens, tgt)
        inc = incremental_decode(model, src, lens, tgt)
    assert (full - inc).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["prenorm", "dlcl", "transparent", "msc-gate", "msc-add", "cad-half", "transparent-cad",
                                  "stochastic-layers-layerdrop", "ssl-gp-rpr", "msc-rpr-ssl"])
def test_training_step_reaches_every_parameter(name):
    """Every parameter is in the graph of every step, whatever the coins (DDP-safe)."""
    model = _model(name).train()
    src, lens, tgt = random_batch(model)
    for seed in range(6):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        out, _ = model(src, lens, tgt)
        out.float().log_softmax(-1).mean().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, (seed, missing)


def _generate(model, src, lens, beam=4):
    gen = SequenceGenerator([model], model.decoder.dictionary, beam_size=beam, max_len_b=8)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lens}}
    with torch.no_grad():
        hyps = gen.generate([model], sample)
    return [h[0]["tokens"].tolist() for h in hyps]


@pytest.mark.parametrize("name", ["prenorm", "dlcl", "transparent", "msc-gate", "msc-no-enc-ctx"])
def test_beam_search_alone_equals_in_batch(name):
    model = _model(name, seed=3).eval().double()
    d = model.encoder.dictionary
    src, lens, _ = random_batch(model, bsz=4, src_len=9, tgt_len=3, seed=5)
    src[1, :4] = d.pad()  # sentences of different lengths (left padding)
    lens[1] = 5
    src[3, :2] = d.pad()
    lens[3] = 7
    batch = _generate(model, src, lens)
    for i in range(4):
        alone_src = src[i: i + 1, src.size(1) - lens[i]:]
        assert _generate(model, alone_src, lens[i: i + 1]) == [batch[i]], f"sentence {i}"


@pytest.mark.parametrize("name", ["transparent", "msc-gate", "msc-no-ctx"])
def test_reorder_encoder_out_reorders_memories(name):
    model = _model(name).eval()
    src, lens, _ = random_batch(model, bsz=3)
    enc = model.encoder(src, lens)
    order = torch.tensor([2, 0, 0, 1])
    re = model.encoder.reorder_encoder_out(enc, order)
    assert torch.equal(re["deepnmt_memory"][0], enc["deepnmt_memory"][0][:, :, order])
    assert torch.equal(re["deepnmt_memory_padding_mask"][0], enc["deepnmt_memory_padding_mask"][0][order])
    with torch.no_grad():  # and the decoder gives the reordered outputs
        tgt = torch.full((3, 2), model.decoder.dictionary.eos())
        a = model.decoder(tgt[order], encoder_out=re)[0]
        b = model.decoder(tgt, encoder_out=enc)[0][order]
    assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("name", ["transparent", "msc-gate"])
def test_reorder_within_sentences_passes_memories_on_uncopied(name):
    """Beam search reorders at every step; an order that keeps each row's sentence selects
    equal rows, so the memories are passed on as they are (no copy) and still equal the copy."""
    model = _model(name).eval()
    src, lens, _ = random_batch(model, bsz=3)
    enc = model.encoder(src, lens)
    beam = 4
    expand = torch.arange(3).repeat_interleave(beam)  # the beam expansion: copies
    a = model.encoder.reorder_encoder_out(enc, expand)
    full = enc["deepnmt_memory"][0][:, :, expand]
    assert torch.equal(a["deepnmt_memory"][0], full)
    g = torch.Generator().manual_seed(0)
    within = torch.cat([s * beam + torch.randint(0, beam, (beam,), generator=g) for s in range(3)])
    b = model.encoder.reorder_encoder_out(a, within)
    assert b["deepnmt_memory"][0] is a["deepnmt_memory"][0]  # not copied ...
    assert torch.equal(b["deepnmt_memory"][0], full[:, :, within])  # ... and equal to the copy
    assert torch.equal(b["deepnmt_memory_padding_mask"][0], a["deepnmt_memory_padding_mask"][0][within])
    across = torch.cat([within[beam:], within[:beam]])  # same size, sentences moved: must copy
    c = model.encoder.reorder_encoder_out(b, across)
    assert torch.equal(c["deepnmt_memory"][0], full[:, :, within][:, :, across])
    assert torch.equal(c["deepnmt_memory_padding_mask"][0], a["deepnmt_memory_padding_mask"][0][within][across])
    shrink = torch.arange(beam, 3 * beam)  # the first sentence finished
    d = model.encoder.reorder_encoder_out(c, shrink)
    assert torch.equal(d["deepnmt_memory"][0], full[:, :, within][:, :, across][:, :, shrink])
    e = model.encoder.reorder_encoder_out(d, torch.arange(2 * beam).flip(0).view(2, beam).flip(0).reshape(-1))
    assert e["deepnmt_memory"][0] is d["deepnmt_memory"][0]  # within sentences again after the shrink


def test_memories_computed_without_return_all_hiddens():
    model = _model("msc-gate").eval()
    src, lens, _ = random_batch(model)
    enc = model.encoder(src, lens, return_all_hiddens=False)  # what fairseq-generate does
    assert enc["deepnmt_memory"][0].shape[0] == 3 and enc["encoder_states"] == []


def test_msc_memory_is_block_output_and_context_chain():
    """memory n = [LN(B_e^n); C^n], C^0 = embedded source, C^n = GRU(C^{n-1}, B_e^n)."""
    model = _model("msc-uneven-blocks").eval()
    src, lens, _ = random_batch(model)
    with torch.no_grad():
        enc = model.encoder(src, lens, return_all_hiddens=True)
        states = enc["encoder_states"]  # embeddings + one per layer
        T = src.size(1)
        mem = enc["deepnmt_memory"][0]
        ends = [1, 4, 6]  # blocks of 1, 3, 2 layers
        c = states[0]
        for n, end in enumerate(ends):
            block = model.encoder.layer_norm(states[end])
            assert torch.allclose(mem[n, :T], block, atol=1e-6)
            c = model.encoder.memory.context_cell(c, block)
            assert torch.allclose(mem[n, T:], c, atol=1e-6)


def test_msc_decoder_layer_n_attends_block_n():
    model = _model("msc-gate").eval()
    src, lens, tgt = random_batch(model)
    seen = {}
    for n, layer in enumerate(model.decoder.layers):
        layer.encoder_attn.register_forward_hook(
            lambda mod, args, kwargs, out, n=n: seen.__setitem__(n, kwargs.get("key", args[1] if len(args) > 1 else None)),
            with_kwargs=True,
        )
    with torch.no_grad():
        enc = model.encoder(src, lens)
        model.decoder(tgt, encoder_out=enc)
    mem = enc["deepnmt_memory"][0]
    for n in range(3):
        assert torch.equal(seen[n], mem[n])
    assert not torch.allclose(mem[0], mem[2])


def test_transparent_memory_is_normalised_softmax_mix():
    model = _model("transparent").eval()
    with torch.no_grad():
        model.encoder.memory.layer_mix.weight.normal_()
    src, lens, _ = random_batch(model)
    with torch.no_grad():
        enc = model.encoder(src, lens, return_all_hiddens=True)
        states = torch.stack(enc["encoder_states"])
        s = torch.softmax(model.encoder.memory.layer_mix.weight, 0)
        for j in range(3):
            z = model.encoder.layer_norm((s[:, j, None, None, None] * states).sum(0))
            assert torch.allclose(enc["deepnmt_memory"][0][j], z, atol=1e-5)


def test_activation_checkpointing_gives_same_gradients():
    grads = []
    for ckpt in ([], ["--checkpoint-activations"]):
        model = _model("msc-gate", ckpt, seed=1).train()
        src, lens, tgt = random_batch(model)
        torch.manual_seed(7)
        out, _ = model(src, lens, tgt)
        out.float().log_softmax(-1).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-6), n


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--deep-memory", "msc", "--msc-block-layers", "2,2", "--decoder-layers", "3"], "--msc-block-layers"),
        (["--deep-memory", "msc", "--msc-block-layers", "2", "--encoder-layers", "5", "--decoder-layers", "3"],
         "--encoder-layers"),
        (["--deep-memory", "msc", "--encoder-layers", "5", "--decoder-layers", "3"], "multiple"),
        (["--deep-memory", "transparent", "--encoder-layers", "0", "--decoder-layers", "2"], "--encoder-layers >= 1"),
        (["--encoder-layers", "5", "--gp-group-size", "2"], "--gp-group-size"),
        (["--deep-memory", "msc", "--msc-block-layers", "3", "--decoder-layers", "2", "--gp-group-size", "2"],
         "--gp-group-size"),
        (["--decoder-layers", "3", "--cad-drop-depth", "4", "--cad-drop-ratio", "0.5"], "--cad-drop-depth"),
        (["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2", "--gp-decoder-group-size", "2"],
         "--gp-decoder-group-size"),
    ],
)
def test_bad_configs_fail_at_build_naming_the_flag(extra, message):
    with pytest.raises(ValueError, match=message):
        build_model("deepnmt_transformer", TINY + extra)


@pytest.mark.parametrize("arch, paper", [("prenorm_iwslt_6l", 10.5), ("msc_iwslt_6l", 15.6), ("msc_iwslt_36l", 43.3),
                                         ("msc_iwslt_54l", 60.0), ("msc_iwslt_72l", 76.6)])
def test_msc_table2_parameter_counts(arch, paper):
    """Full-size IWSLT small models, joint vocabulary of 10,150, counted without training.

    With ``--msc-count-fitting-norms`` every row rounds to the paper's 0.1M.  The literal
    Eq. 12 (default) has 2 LayerNorms (4d = 1,024 parameters) fewer per MSC encoder layer:
    rows 4 and 6 then round to 59.9M / 76.5M, one last digit below the paper."""
    from deepnmt_fairseq.analysis.param_counts import build_model as build, count_parameters

    fit = count_parameters(build(arch, 10150, ["--msc-count-fitting-norms"]))
    assert round(fit / 1e6, 1) == paper
    literal = count_parameters(build(arch, 10150))
    msc_layers = 0 if arch.startswith("prenorm") else int(arch.split("_")[-1].rstrip("l"))
    assert fit - literal == msc_layers * 4 * 256
    assert abs(literal / 1e6 - paper) < 0.1


def test_named_architectures_set_defaults_but_flags_win():
    model = build_model("msc_iwslt_36l", ["--dropout", "0.2"], vocab=30)
    assert len(model.encoder.layers) == 36 and len(model.decoder.layers) == 6
    assert model.encoder.memory.blocks == [6] * 6
    assert model.encoder.dropout_module.p == 0.2
    assert model.encoder.layer_norm is not None  # pre-norm
    post = build_model("postnorm_iwslt_6l", [], vocab=30)
    assert post.encoder.layer_norm is None


def test_encoder_without_residuals():
    """Bapna et al. Table 1 'Baseline - residuals': encoder layer outputs are the branches alone."""
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "1", "--decoder-layers", "1", "--post-norm",
                                                        "--no-encoder-residual", "--dropout", "0",
                                                        "--attention-dropout", "0"]).eval()
    layer = model.encoder.layers[0]
    x = torch.randn(5, 2, 16)
    with torch.no_grad():
        a, _ = layer.self_attn(x, x, x, key_padding_mask=None, need_weights=False)
        h = layer.self_attn_layer_norm(a)  # no "+ x"
        f = layer.fc2(torch.relu(layer.fc1(h)))
        ref = layer.final_layer_norm(f)  # no "+ h"
        assert torch.allclose(layer(x, None), ref, atol=1e-5)
    assert model.decoder.layers[0]._residual  # decoder keeps its residuals


@pytest.mark.parametrize("ours, fairseqs", [
    (["--post-norm"], []),
    ([], ["--encoder-normalize-before", "--decoder-normalize-before"]),
])
def test_plain_stacks_are_fairseqs_transformer(ours, fairseqs):
    """With no plugin option, the plugin's post-norm and pre-norm stacks are fairseq's own
    ``transformer`` (same parameters, same initialisation from the same seed, same outputs): the
    post-norm baseline of the evidence study is fairseq's, not a variant of it."""
    shape = ["--encoder-layers", "3", "--decoder-layers", "2", "--share-all-embeddings"]
    mine = build_model("deepnmt_transformer", TINY + shape + ours, seed=4).eval()
    theirs = build_model("transformer", TINY + shape + fairseqs, seed=4).eval()
    a, b = mine.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    src, lens, tgt = random_batch(mine)
    with torch.no_grad():
        assert torch.equal(mine(src, lens, tgt)[0], theirs(src, lens, tgt)[0])
