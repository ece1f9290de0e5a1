"""HIERTRANS: the hierarchical Transformer summarizer, MSC's own Table 6 baseline (Wei et al. 2020,
Appendix A).

The paper's whole description: "the hierarchical transformer summarization model (HIERTRANS), which
involves both a sentence-level and a document-level transformer encoders, as well as a standard
transformer decoder. Note the settings for both encoders are the same (each of them have L = 18,
emb=512, ffn=1024, head=8)"; Table 6 calls it "HIERTRANS (36 L)", "36L" being "short for 36-layer
encoder".  It cites no paper for the model.  Where the paragraph is silent we chose (our readings):

* **Sentences.**  The source is one document (the article, as ``scripts/prepare_data.py cnndm``
  writes it: tokenized, lowercased, BPE, no sentence markers).  A sentence ends at a token in
  ``--sentence-end-symbols`` (default ``. ! ?``, whole tokens of the dictionary; See et al.'s
  processing adds a period to every line without one, so every paragraph ends in one) and at the
  document's last token (EOS).  The end token belongs to its sentence.
* **Sentence-level encoder** (``--encoder-layers``): fairseq's Transformer encoder over the
  document's tokens with self-attention restricted to each token's own sentence (a block-diagonal
  mask), so every sentence is encoded on its own, with positions counted from the start of its
  sentence (HIBERT, Zhang et al. 2019b, which Table 6 cites, encodes sentences this way).  The mask
  costs what a document-length attention costs; the result equals encoding each sentence separately.
* **Sentence vectors.**  A sentence's vector is the sentence encoder's (final-LayerNorm) output at
  its last token: the end punctuation or EOS, as HIBERT takes a sentence's representation at its
  end-of-sentence token.
* **Document-level encoder** (``--document-layers``, the same layer settings): fairseq Transformer
  encoder layers over the sequence of sentence vectors plus sinusoidal sentence-position
  embeddings, then a final LayerNorm (pre-norm, like the plugin's CNN/DailyMail models).
* **What the decoder attends to.**  "A standard transformer decoder" has one encoder-decoder
  attention; it attends to the concatenation, along time, of the sentence encoder's token states
  (T) and the document encoder's sentence states (S), with their padding masks: the decoder is
  unchanged and reads both levels.  (Attending only to S sentence vectors would leave an abstractive
  decoder no word-level source; adding each sentence's document state to its tokens would be the
  other common choice.)
* **Depths at the paper's shape**: 18 sentence-level + 18 document-level layers ("36 L"), emb 512,
  FFN 1024, 8 heads, and the 6-layer decoder of Table 6's TRANSFORMER and MSC models (the text gives
  the decoder no depth): ``--arch hiertrans_cnndm_36l``.

fairseq contracts: the encoder output keeps fairseq's keys (``encoder_out``, ``encoder_padding_mask``
of length T + S), so :meth:`reorder_encoder_out`, incremental decoding and beam search are fairseq's
own; ``tests/test_exactness.py`` and ``tests/test_matrix.py`` check them.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn as nn
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerEncoderBase, TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq.modules import LayerNorm, SinusoidalPositionalEmbedding, transformer_layer
from torch import Tensor

from .options import HierTransOptions, set_defaults as _set, set_option_defaults

MODEL_NAME = "hiertrans"

#: Methods adapted from fairseq rather than inherited (as deep_transformer.ADAPTED_FROM): ours -> (fairseq
#: file, qualified name, version, sha256 of the original's source); tests/test_hiertrans.py checks the hash.
ADAPTED_FROM = {
    "HierTransEncoder.forward_embedding": (
        "fairseq/models/transformer/transformer_encoder.py", "TransformerEncoderBase.forward_embedding",
        "0.12.3", "66206302027e840d6824ff339ff03976fc3601132530329335a378ed2eb547d7"),
}


def segment(src_tokens: Tensor, padding_idx: int, end_ids: Tensor):
    """Sentences of each document in ``src_tokens`` (B, T), padded on either side.

    Returns ``(sentence_id, is_end, position)``, each (B, T): the 0-based sentence of every token
    (-1 for padding), whether the token ends its sentence (an end symbol, or the document's last
    token), and its position inside its sentence (0-based; 0 for padding)."""
    pad = src_tokens.eq(padding_idx)
    real = ~pad
    is_end = torch.isin(src_tokens, end_ids) & real
    count = real.long().cumsum(1)  # non-pad tokens up to and including t
    last = count.argmax(1)  # first position reaching the total: the document's last token
    is_end[torch.arange(src_tokens.size(0), device=src_tokens.device), last] = True
    ends = is_end.long()
    sentence_id = (ends.cumsum(1) - ends).masked_fill(pad, -1)
    index = count - 1  # index of t among the document's tokens
    prev_end = torch.cat([torch.ones_like(is_end[:, :1]), is_end[:, :-1] | pad[:, :-1]], 1)
    first = real & prev_end
    start = torch.where(first, index, torch.full_like(index, -1)).cummax(1).values
    position = (index - start).masked_fill(pad, 0)
    return sentence_id, is_end, position


class SentenceLayer(transformer_layer.TransformerEncoderLayerBase):
    """fairseq's encoder layer whose self-attention is confined to the block mask its encoder sets
    before each forward pass (fairseq's encoder loop passes no ``attn_mask``).  Padding forms a
    block of its own in that mask, so the key padding mask is not needed beside it (a float mask
    next to a bool one makes torch warn on every call; a bool block mask would give padding rows
    no key at all, i.e. NaN)."""

    block_mask: Optional[Tensor] = None

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is None and self.block_mask is not None:
            attn_mask, encoder_padding_mask = self.block_mask, None
        return super().forward(x, encoder_padding_mask, attn_mask=attn_mask)


class HierTransEncoder(TransformerEncoderBase):
    """Sentence-level encoder (fairseq's Transformer encoder, attention within sentences) followed
    by a document-level encoder over the sentence vectors; see the module docstring."""

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        self.opts = HierTransOptions.from_args(cfg)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        symbols = self.opts.sentence_end_symbols.split()
        ids = sorted({dictionary.index(s) for s in symbols if dictionary.index(s) != dictionary.unk()}
                     | {dictionary.eos()})
        self.register_buffer("sentence_end_ids", torch.tensor(ids, dtype=torch.long), persistent=False)
        self.document_layers = nn.ModuleList(
            [transformer_layer.TransformerEncoderLayerBase(cfg) for _ in range(self.opts.document_layers)])
        self.document_layer_norm = LayerNorm(cfg.encoder.embed_dim) if cfg.encoder.normalize_before else None
        self.num_heads = cfg.encoder.attention_heads

    def build_encoder_layer(self, cfg):
        from .deep_transformer import _wrap_layer

        return _wrap_layer(SentenceLayer(cfg, return_fc=self.return_fc), cfg)

    # ---- the sentence-level encoder
    def segment(self, src_tokens: Tensor):
        return segment(src_tokens, self.padding_idx, self.sentence_end_ids)

    def _positions(self, src_tokens: Tensor, position: Tensor) -> Tensor:
        """Position embeddings counted from the start of each token's sentence."""
        positions = (position + self.padding_idx + 1).masked_fill(src_tokens.eq(self.padding_idx), self.padding_idx)
        emb = self.embed_positions
        if isinstance(emb, SinusoidalPositionalEmbedding):
            table = emb.weights
            needed = int(positions.max()) + 1
            if table.size(0) < needed:
                table = SinusoidalPositionalEmbedding.get_embedding(needed, emb.embedding_dim, self.padding_idx)
            return table.to(device=src_tokens.device, dtype=self.embed_tokens.weight.dtype)[positions]
        # learned (fairseq's LearnedPositionalEmbedding, an nn.Embedding): its table at our positions
        return nn.Embedding.forward(emb, positions)

    def forward_embedding(self, src_tokens, token_embedding: Optional[Tensor] = None):
        """fairseq's token embedding, with positions inside each sentence instead of the document.

        Copied from fairseq 0.12.3 (``TransformerEncoderBase.forward_embedding``, see
        :data:`ADAPTED_FROM`) with the position lookup changed."""
        if token_embedding is None:
            token_embedding = self.embed_tokens(src_tokens)
        x = embed = self.embed_scale * token_embedding
        if self.embed_positions is not None:
            x = embed + self._positions(src_tokens, self.segment(src_tokens)[2])
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        return x, embed

    def _within_sentences(self, sentence_id: Tensor, dtype) -> None:
        """Each token attends only to its own sentence: a (B * heads, T, T) mask, 1 = masked (the
        layer turns it into -1e8 logits; padding is masked by the key padding mask as usual).  Set
        on every sentence layer before the pass and left there until the next one, so that
        ``--checkpoint-activations`` recomputes a layer in the backward pass with the same mask."""
        mask = sentence_id.unsqueeze(2).ne(sentence_id.unsqueeze(1)).to(dtype)
        mask = mask.repeat_interleave(self.num_heads, dim=0)
        for layer in self.layers:
            layer.block_mask = mask

    # ---- the document-level encoder
    def sentence_vectors(self, tokens: Tensor, is_end: Tensor):
        """(S, B, C) sentence vectors (the token states at sentence ends) and their (B, S) padding."""
        counts = is_end.sum(1)
        s = int(counts.max())
        b_idx, t_idx = is_end.nonzero(as_tuple=True)
        s_idx = (is_end.long().cumsum(1) - 1)[b_idx, t_idx]
        out = tokens.new_zeros(s, tokens.size(1), tokens.size(2))
        out = out.index_put((s_idx, b_idx), tokens[t_idx, b_idx])
        pad = torch.arange(s, device=tokens.device).unsqueeze(0) >= counts.unsqueeze(1)
        return out, pad

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[Tensor] = None):
        sentence_id, is_end, _ = self.segment(src_tokens)
        self._within_sentences(sentence_id, self.embed_tokens.weight.dtype)
        out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        tokens = out["encoder_out"][0]  # (T, B, C), through the final LayerNorm
        token_pad = src_tokens.eq(self.padding_idx)
        x, sentence_pad = self.sentence_vectors(tokens, is_end)
        s = x.size(0)
        pe = SinusoidalPositionalEmbedding.get_embedding(s + self.padding_idx + 1, x.size(2), self.padding_idx)
        x = x + pe[self.padding_idx + 1:].to(x).unsqueeze(1)
        x = self.dropout_module(x)
        x = x * (1 - sentence_pad.t().unsqueeze(-1).type_as(x))
        has_pads = bool(sentence_pad.any())
        for layer in self.document_layers:
            x = layer(x, encoder_padding_mask=sentence_pad if has_pads else None)
        if self.document_layer_norm is not None:
            x = self.document_layer_norm(x)
        out["encoder_out"] = [torch.cat([tokens, x], 0)]
        out["encoder_padding_mask"] = [torch.cat([token_pad, sentence_pad], 1)]
        return out

    def forward_torchscript(self, net_input):
        return self.forward(net_input["src_tokens"], net_input["src_lengths"])


@register_model(MODEL_NAME)
class HierTransModel(TransformerModel):
    """fairseq's Transformer with :class:`HierTransEncoder` and fairseq's standard decoder.

    Options: fairseq's Transformer flags plus :class:`~deepnmt_fairseq.models.options.HierTransOptions`
    (``--document-layers``, ``--sentence-end-symbols``)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, HierTransOptions(), delete_default=True)

    @classmethod
    def build_model(cls, args, task):
        hiertrans_base_architecture(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return HierTransEncoder(cfg, src_dict, embed_tokens)

    @staticmethod
    def describe(args) -> str:
        """One line for ``deepnmt-repro show`` (after the named architecture's defaults)."""
        norm = "pre-norm" if args.encoder_normalize_before else "post-norm"
        return (f"HIERTRANS: {args.encoder_layers}-layer sentence-level + {args.document_layers}-layer "
                f"document-level encoder, {args.decoder_layers}-layer decoder, d {args.encoder_embed_dim}, "
                f"FFN {args.encoder_ffn_embed_dim}, {args.encoder_attention_heads} heads, dropout {args.dropout:g}, "
                f"{norm}; sentences end at {args.sentence_end_symbols!r} and EOS; the decoder attends to token "
                f"and sentence states")


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def hiertrans_base_architecture(args):
    """Transformer base shapes (fairseq's ``base_architecture``), pre-norm, 6 document layers by
    default (:class:`HierTransOptions`)."""
    set_option_defaults(args, HierTransOptions)
    _set(args, encoder_normalize_before=True, decoder_normalize_before=True)
    base_architecture(args)


#: name -> (table row, paper parameter count); registered in models.architectures.PAPER_ROWS
HIERTRANS_ROWS = {"hiertrans_cnndm_36l": ("Table 6 (HIERTRANS (36 L): 18-layer sentence + 18-layer document "
                                          "encoder, 6-layer decoder)", None)}


@register_model_architecture(MODEL_NAME, "hiertrans_cnndm_36l")
def hiertrans_cnndm_36l(args):
    """MSC Appendix A: "each of them have L = 18, emb=512, ffn=1024, head=8"; the 6-layer decoder and
    the 768 positions of the appendix's CNN/DailyMail setting (our reading for the decoder depth)."""
    _set(args, encoder_layers=18, document_layers=18, decoder_layers=6,
         encoder_embed_dim=512, encoder_ffn_embed_dim=1024, encoder_attention_heads=8,
         decoder_embed_dim=512, decoder_ffn_embed_dim=1024, decoder_attention_heads=8,
         share_all_embeddings=True, dropout=0.1, max_source_positions=768, max_target_positions=768)
    hiertrans_base_architecture(args)


__all__: List[str] = ["HierTransEncoder", "HierTransModel", "segment", "MODEL_NAME", "HIERTRANS_ROWS"]
