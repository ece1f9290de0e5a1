"""The memory hook, the single source of the options' defaults, the copied fairseq code."""

import hashlib
import importlib
import inspect
import warnings
from argparse import Namespace
from dataclasses import MISSING, fields

import pytest
import torch

from fairseq_helpers import TINY, build_model, random_batch

from deepnmt_fairseq.memories import MEMORIES, EncoderMemory, MemoryPass, TopMemory
from deepnmt_fairseq.memories.msc import block_sizes, encoder_layers_of
from deepnmt_fairseq.models import deep_transformer
from deepnmt_fairseq.models.deep_transformer import deep_base_architecture
from deepnmt_fairseq.models.options import MEMORY_CHOICES, DeepTransformerOptions


# ------------------------------------------------------------------ the hook
def test_every_deep_memory_choice_has_one_memory_module():
    assert sorted(c.value for c in MEMORY_CHOICES) == sorted(MEMORIES)
    for kind, cls in MEMORIES.items():
        model = build_model("deepnmt_transformer", TINY + ["--deep-memory", kind, "--encoder-layers", "2",
                                                            "--decoder-layers", "2"])
        assert type(model.encoder.memory) is cls


class _SecondLayerMemory(EncoderMemory):
    """A memory a user might add: every decoder layer reads encoder layer 1 (not the top)."""

    def start(self, x0, padding_mask, layer_mask, final_norm):
        outer = self

        class Pass(MemoryPass):
            def observe(self, pos, x):
                if pos == 0:
                    self.first = x

            def finish(self):
                outer.seen = self.first
                return torch.stack([self.first] * 2), self.padding_mask

        return Pass(padding_mask, layer_mask, final_norm)


def test_build_memory_is_the_extension_point(monkeypatch):
    """Overriding ``build_memory`` alone changes what the decoder attends to."""
    monkeypatch.setattr(deep_transformer.DeepTransformerEncoder, "build_memory",
                        lambda self, cfg, dim: _SecondLayerMemory())
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "3", "--decoder-layers", "2"]).eval()
    src, lens, tgt = random_batch(model)
    with torch.no_grad():
        enc = model.encoder(src, lens)
        mem = enc["deepnmt_memory"][0]
        assert mem.shape[0] == 2 and torch.equal(mem[0], model.encoder.memory.seen)
        assert not torch.equal(mem[0], enc["encoder_out"][0])
        out, _ = model(src, lens, tgt)
    monkeypatch.undo()
    top = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "3", "--decoder-layers", "2"]).eval()
    assert type(top.encoder.memory) is TopMemory
    with torch.no_grad():
        assert not torch.allclose(top(src, lens, tgt)[0], out)


@pytest.mark.parametrize("kind, extra, legacy", [
    ("transparent", [], "encoder.layer_mix.weight"),
    ("msc", ["--msc-block-layers", "1"], "encoder.context_cell.cell.weight_ih"),
])
def test_checkpoints_from_before_the_memory_modules_still_load(kind, extra, legacy):
    flags = TINY + ["--deep-memory", kind, "--encoder-layers", "2", "--decoder-layers", "2", *extra]
    model = build_model("deepnmt_transformer", flags, seed=1)
    state = {k.replace("encoder.memory.", "encoder."): v.clone() for k, v in model.state_dict().items()}
    assert legacy in state
    fresh = build_model("deepnmt_transformer", flags, seed=2)
    fresh.load_state_dict(state)  # fairseq's load: upgrade_state_dict_named renames the keys
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_msc_block_layers_parsed_in_one_place():
    assert encoder_layers_of("3", 6) == 18 and encoder_layers_of("1,3,2", 3) == 6
    assert encoder_layers_of(None, 6) is None
    assert block_sizes("2", 6, 3) == [2, 2, 2] and block_sizes(None, 6, 3) == [2, 2, 2]
    with pytest.raises(ValueError, match="--msc-block-layers must be integers"):
        encoder_layers_of("a,b", 2)
    args = Namespace(deep_memory="msc", msc_block_layers="1,3,2", decoder_layers=3)
    deep_base_architecture(args)
    assert args.encoder_layers == 6


# ------------------------------------------------------------------ defaults written once
def test_base_architecture_takes_every_default_from_the_options_dataclass():
    args = Namespace()
    deep_base_architecture(args)
    for f in fields(DeepTransformerOptions):
        if f.name.startswith("_") or f.default is MISSING:
            continue
        assert getattr(args, f.name) == f.default, f.name
    assert args.encoder_normalize_before and args.decoder_normalize_before
    post = Namespace(post_norm=True, ssl_rate=0.4)
    deep_base_architecture(post)
    assert not post.encoder_normalize_before and post.ssl_rate == 0.4  # a given value wins


def test_architectures_module_repeats_no_option_default():
    """A new option is added in one place: the dataclass (no list of defaults elsewhere)."""
    src = inspect.getsource(deep_base_architecture)
    for f in fields(DeepTransformerOptions):
        assert f"{f.name}=" not in src, f.name


# ------------------------------------------------------------------ copied fairseq code
@pytest.mark.parametrize("ours", sorted(deep_transformer.ADAPTED_FROM))
def test_code_adapted_from_fairseq_matches_the_installed_original(ours):
    """Fails when the installed fairseq's original changes: re-read it and port the change."""
    path, qualname, version, digest = deep_transformer.ADAPTED_FROM[ours]
    module = importlib.import_module(path[:-3].replace("/", "."))
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    assert hashlib.sha256(inspect.getsource(obj).encode()).hexdigest() == digest, (
        f"{qualname} in the installed fairseq differs from fairseq {version}, which "
        f"{ours} was adapted from")
    cls, meth = ours.split(".")
    assert "Copied from fairseq" in getattr(getattr(deep_transformer, cls), meth).__doc__


# ------------------------------------------------------------------ one mask dtype
@pytest.mark.parametrize("extra", [[], ["--rpr-max-relative-position", "2"], ["--deep-memory", "msc",
                                                                              "--msc-block-layers", "1"]])
def test_no_mismatched_mask_warning_in_training(extra):
    model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "2", *extra])
    model.train()
    src, lens, tgt = random_batch(model, pad_last=True)
    tgt[0, -2:] = model.decoder.dictionary.pad()  # padding in the decoder input: both masks in use
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = model(src, lens, tgt)
        out.sum().backward()
    assert not [w for w in caught if "mismatched" in str(w.message)], [str(w.message) for w in caught]


# ------------------------------------------------------------------ DLCL (Wang et al. 2019a)
def test_dlcl_layer_inputs_are_the_learned_combination_of_normalised_earlier_layers():
    model = build_model("deepnmt_transformer", TINY + ["--deep-memory", "dlcl", "--encoder-layers", "3",
                                                        "--decoder-layers", "1", "--dropout", "0",
                                                        "--attention-dropout", "0"]).eval()
    enc = model.encoder
    with torch.no_grad():
        enc.memory.weight.normal_()
        for ln in enc.memory.layer_norms:
            ln.weight.normal_()
            ln.bias.normal_()
    src, lens, _ = random_batch(model)
    inputs = []
    hooks = [layer.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for layer in enc.layers]
    with torch.no_grad():
        out = enc(src, lens)
        pad = src.eq(enc.padding_idx)
        y = [enc.forward_embedding(src)[0].masked_fill(pad.unsqueeze(-1), 0).transpose(0, 1)]  # y_0
        w = enc.memory.weight
        for l, layer in enumerate(enc.layers):
            x = sum(w[l, k] * y[k] for k in range(l + 1))  # G(y_0..y_l); upper triangle unused
            assert torch.allclose(inputs[l], x, atol=1e-5), l
            y.append(enc.memory.layer_norms[l](layer(x, pad)))
        top = enc.layer_norm(sum(w[3, k] * y[k] for k in range(4)))
    for h in hooks:
        h.remove()
    assert torch.allclose(out["encoder_out"][0], top, atol=1e-5)
    assert "deepnmt_memory" not in out  # the decoder attends to the (combined) top


def test_dlcl_starts_as_a_dense_average_and_refuses_post_norm():
    model = build_model("deepnmt_transformer", TINY + ["--deep-memory", "dlcl", "--encoder-layers", "2",
                                                        "--decoder-layers", "1"])
    assert torch.allclose(model.encoder.memory.weight, torch.tensor([[1, 0, 0], [.5, .5, 0], [1 / 3] * 3]))
    with pytest.raises(ValueError, match="pre-norm form.*--post-norm"):
        build_model("deepnmt_transformer", TINY + ["--deep-memory", "dlcl", "--post-norm"])


def test_counts_table_lists_every_named_architecture():
    """docs/parameter-counts.md's table (`deepnmt-param-counts --markdown`) has a row per named architecture."""
    from pathlib import Path

    from deepnmt_fairseq.models.architectures import PAPER_ROWS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "parameter-counts.md").read_text()
    missing = [name for name in PAPER_ROWS if f"| `{name}` |" not in doc]
    assert not missing, f"regenerate docs/parameter-counts.md's table with deepnmt-param-counts --markdown: {missing}"


def test_learned_layer_weights_are_what_the_model_uses():
    """The weights an analysis reads (study/evaluate.py writes them into the study's records): the
    transparent s of Eq. 1 without dropout (each decoder layer's row sums to 1), DLCL's lower-triangular
    W as trained; memories without learned layer weights give None."""
    tr = build_model("deepnmt_transformer", TINY + ["--deep-memory", "transparent", "--encoder-layers", "3",
                                                    "--decoder-layers", "2"])
    with torch.no_grad():
        tr.encoder.memory.layer_mix.weight.normal_()
    tr.eval()
    s = torch.tensor(tr.encoder.memory.learned_weights()["transparent_s"])
    assert s.shape == (2, 4) and torch.allclose(s, tr.encoder.memory.layer_mix.mixing_weights().t(), atol=1e-4)
    dl = build_model("deepnmt_transformer", TINY + ["--deep-memory", "dlcl", "--encoder-layers", "3",
                                                    "--decoder-layers", "2"])
    with torch.no_grad():
        dl.encoder.memory.weight.add_(torch.randn_like(dl.encoder.memory.weight))
    rows = dl.encoder.memory.learned_weights()["dlcl_w"]
    assert [len(r) for r in rows] == [1, 2, 3, 4]
    assert torch.allclose(torch.tensor(rows[-1]), dl.encoder.memory.weight[-1].detach(), atol=1e-4)
    top = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "2", "--decoder-layers", "2"])
    assert top.encoder.memory.learned_weights() is None
