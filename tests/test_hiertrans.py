"""HIERTRANS (MSC Appendix A, Table 6's hierarchical baseline; deepnmt_fairseq/models/hiertrans.py):
sentences, the sentence-level encoder's independence, the document level, what the decoder reads, and
the parameter count at the paper's shape.  The fairseq contracts (incremental decoding, beam search in
a padded batch, train -> resume -> generate -> interactive -> validate) run in tests/test_exactness.py
and tests/test_matrix.py; the CNN/DailyMail fixture end to end in tests/test_summarization.py."""

from __future__ import annotations

import pytest
import torch

from fairseq_helpers import TINY, build_model

# a dummy dictionary has symbols w0, w1, ... at indices 4, 5, ...: w1 ('.') and w2 ('!') end sentences
ENDS = ["--sentence-end-symbols", "w1 w2"]
DOT, BANG = 5, 6
FLAGS = TINY + ["--encoder-layers", "2", "--document-layers", "2", "--decoder-layers", "2", "--dropout", "0",
                "--attention-dropout", "0"] + ENDS


def _model(**kw):
    return build_model("hiertrans", FLAGS, vocab=40, **kw).eval()


def test_sentences_ends_and_positions_by_hand():
    from deepnmt_fairseq.models.hiertrans import segment

    pad, eos = 1, 2
    ends = torch.tensor([eos, DOT, BANG])
    src = torch.tensor([[pad, pad, 10, 11, DOT, 12, BANG, eos],  # left padding (fairseq's source)
                        [10, DOT, 11, 12, 13, eos, pad, pad],  # right padding
                        [pad, pad, pad, pad, 10, 11, 12, 13]])  # no end symbol, no EOS: one sentence
    sid, is_end, pos = segment(src, pad, ends)
    assert sid.tolist() == [[-1, -1, 0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 1, 1, -1, -1], [-1, -1, -1, -1, 0, 0, 0, 0]]
    assert is_end.long().tolist() == [[0, 0, 0, 0, 1, 0, 1, 1], [0, 1, 0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]]
    assert pos.tolist() == [[0, 0, 0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3, 0, 0], [0, 0, 0, 0, 0, 1, 2, 3]]


def test_dictionary_symbols_end_sentences_and_unknown_ones_are_ignored():
    m = build_model("hiertrans", TINY + ["--sentence-end-symbols", "w1 w2 nonexistent"], vocab=40)
    assert m.encoder.sentence_end_ids.tolist() == [2, DOT, BANG]  # EOS always; unknown symbols dropped


def test_each_sentence_is_encoded_on_its_own():
    """Sentence-level states of [c d .] and of the EOS sentence are the same inside a longer document
    (block mask + positions counted from the sentence start) and alone; the document level mixes them."""
    m = _model()
    eos = m.encoder.dictionary.eos()
    long = torch.tensor([[10, 11, DOT, 20, 21, 22, DOT, eos]])
    short = torch.tensor([[20, 21, 22, DOT, eos]])
    with torch.no_grad():
        a = m.encoder(long, torch.tensor([8]))
        b = m.encoder(short, torch.tensor([5]))
    ta, tb = a["encoder_out"][0], b["encoder_out"][0]
    assert ta.shape[0] == 8 + 3 and tb.shape[0] == 5 + 2  # T tokens then S sentences
    assert torch.allclose(ta[3:8], tb[0:5], atol=1e-5)  # sentence-level: independent of sentence 1
    assert not torch.allclose(ta[8 + 1], tb[5 + 0], atol=1e-3)  # document-level state of [20 21 22 .] differs
    # changing a word of the first sentence leaves the second's token states, not its document state
    other = long.clone()
    other[0, 0] = 30
    with torch.no_grad():
        c = m.encoder(other, torch.tensor([8]))["encoder_out"][0]
    assert torch.allclose(c[3:8], ta[3:8], atol=1e-6)
    assert not torch.allclose(c[8 + 1], ta[8 + 1], atol=1e-4)


def test_sentence_vectors_are_the_end_tokens_states_and_the_decoder_reads_both_levels():
    m = _model()
    eos = m.encoder.dictionary.eos()
    src = torch.tensor([[10, 11, DOT, 20, BANG, eos], [1, 1, 1, 12, 13, eos]])
    sid, is_end, _ = m.encoder.segment(src)
    tokens = torch.randn(6, 2, 16)
    vec, pad = m.encoder.sentence_vectors(tokens, is_end)
    assert vec.shape == (3, 2, 16) and pad.tolist() == [[False, False, False], [False, True, True]]
    assert torch.equal(vec[:, 0], tokens[[2, 4, 5], 0]) and torch.equal(vec[0, 1], tokens[5, 1])
    assert vec[1:, 1].abs().sum() == 0
    enc = m.encoder(src, torch.tensor([6, 3]))
    mask = enc["encoder_padding_mask"][0]
    assert mask.tolist() == [[False] * 6 + [False] * 3, [True] * 3 + [False] * 3 + [False, True, True]]
    tgt = torch.tensor([[eos, 10, 11], [eos, 12, 13]])
    with torch.no_grad():
        out = m.decoder(tgt, encoder_out=enc)[0]
        for part in (slice(0, 6), slice(6, 9)):  # perturbing either level changes the prediction
            enc2 = {**enc, "encoder_out": [enc["encoder_out"][0].clone()]}
            enc2["encoder_out"][0][part, 0] += 1.0
            assert not torch.allclose(m.decoder(tgt, encoder_out=enc2)[0][0], out[0], atol=1e-4)


def test_every_parameter_trains():
    m = build_model("hiertrans", FLAGS, vocab=40).train()
    eos = m.encoder.dictionary.eos()
    src = torch.tensor([[10, 11, DOT, 20, BANG, eos], [1, 1, 1, 12, 13, eos]])
    tgt = torch.tensor([[eos, 10, 11], [eos, 12, 13]])
    out, _ = m(src, torch.tensor([6, 3]), tgt)
    out.log_softmax(-1).mean().backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing


def test_parameter_count_at_the_papers_shape():
    """hiertrans_cnndm_36l: 18 + 18 encoder layers and a 6-layer decoder, emb 512, FFN 1024, 8 heads, shared
    32k vocabulary (docs/parameter-counts.md): 111,013,888, counted by hand."""
    from deepnmt_fairseq.analysis.param_counts import count_parameters

    m = build_model("hiertrans_cnndm_36l", [], vocab=32000)
    assert (m.encoder.num_layers, len(m.encoder.document_layers), m.decoder.num_layers) == (18, 18, 6)
    d, f = 512, 1024
    attn, ffn, ln = 4 * (d * d + d), d * f + f + f * d + d, 2 * d
    enc_layer, dec_layer = attn + ffn + 2 * ln, 2 * attn + ffn + 3 * ln
    by_hand = 36 * enc_layer + 2 * ln + 6 * dec_layer + ln + 32000 * d
    assert count_parameters(m) == by_hand == 111_013_888


def test_describe_for_show():
    from argparse import Namespace

    from deepnmt_fairseq.models.hiertrans import HierTransModel, hiertrans_cnndm_36l

    a = Namespace()
    hiertrans_cnndm_36l(a)
    line = HierTransModel.describe(a)
    assert "18-layer sentence-level + 18-layer document-level" in line and "6-layer decoder" in line


@pytest.mark.parametrize("flag", ["--encoder-learned-pos", None])
def test_positions_inside_sentences_for_learned_and_sinusoidal_tables(flag):
    m = build_model("hiertrans", FLAGS + ([flag] if flag else []), vocab=40).eval()
    eos = m.encoder.dictionary.eos()
    a = torch.tensor([[10, DOT, 11, eos]])
    pos = m.encoder.segment(a)[2]
    assert pos.tolist() == [[0, 1, 0, 1]]
    emb = m.encoder._positions(a, pos)
    assert torch.equal(emb[0, 0], emb[0, 2]) and torch.equal(emb[0, 1], emb[0, 3])


def test_code_adapted_from_fairseq_matches_the_installed_original():
    """Fails when the installed fairseq's forward_embedding changes: re-read it and port the change."""
    import hashlib
    import importlib
    import inspect

    from deepnmt_fairseq.models.hiertrans import ADAPTED_FROM

    for ours, (path, qualname, version, digest) in ADAPTED_FROM.items():
        obj = importlib.import_module(path[:-3].replace("/", "."))
        for part in qualname.split("."):
            obj = getattr(obj, part)
        assert hashlib.sha256(inspect.getsource(obj).encode()).hexdigest() == digest, (ours, version)


def test_export_to_ctranslate2_refuses_it_by_name():
    """HierTransModel is a fairseq TransformerModel: without the refusal the exporter would write a plain
    Transformer (no sentence mask, no document encoder) and change the model silently."""
    from deepnmt_fairseq.deploy.export import refusals

    (why,) = refusals(_model())
    assert "HIERTRANS" in why and "--arch hiertrans" in why
