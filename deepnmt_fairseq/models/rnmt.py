"""RNMT+ (Chen et al. 2018, Sec. 4.1) with transparent attention (Bapna et al. 2018).

``--arch rnmt_plus`` and its named architectures (Bapna et al. Tables 3-4).

Data flow::

    src tokens -> embeddings (dropout) = h^0
      -> N bidirectional LSTM layers: forward and backward outputs concatenated (2H),
         fed to the next layer; dropout on each layer's output; residual from layer
         ``--residual-start`` (3) up: h^i = h^{i-1} + dropout(BiLSTM_i(h^{i-1}))
      -> baseline: projection of h^N (2H -> d)          "A projection layer is added to
         transparent: projection of z = sum_i s_i h^i     the encoder final output" (Chen);
                      (Bapna Eq. 1-2, M = 1)             "we apply a projection to the weighted
                                                         combination" (Bapna Sec. 2.4)
    prev tokens -> embeddings (dropout)
      -> decoder layer 1 (LSTM, input [y_t; ctx_{t-1}]) -> its state is the query of the
         multi-head additive attention over the projected encoder output -> ctx_t
      -> decoder layers 2..L (input [x^{l-1}_t; ctx_t]), dropout, residual from layer 3 up
      -> softmax over W [x^L_t; ctx_t]   ("we also feed it to the softmax", Chen)

Every LSTM is :class:`~deepnmt_fairseq.modules.layer_norm_lstm.LayerNormLSTMCell`
(per-gate LayerNorm, no output non-linearity).

Choices where Chen et al. / Bapna et al. are silent (each is a flag; the defaults are
those of the authors' released RNMT+ configuration, lingvo
``tasks/mt/params/wmt14_en_de.py: WmtEnDeRNMT`` with ``base_config.SetupRNMTParams``):

* dropout 0.3 on the embeddings, on every LSTM layer's output and on the attention
  probabilities (Chen: "We apply dropout to both embedding layers and each LSTM layer
  output before it is added to the next layer's input. Attention dropout is also
  applied."; lingvo En-De: ``residual_dropout_prob=atten_dropout_prob=0.3``).  Bapna et
  al. give no dropout for their 512 models: we keep 0.3.
* label smoothing 0.1 (Chen: uncertainty 0.1), a criterion flag of the registry rows.
* 4 attention heads (lingvo ``num_heads=4``), U(-0.04, 0.04) initialisation.
* zero initial decoder state (GNMT/lingvo ``MTDecoderV1``: the decoder does not start
  from the encoder's final state); the first decoder layer gets the previous attention
  context as input (input feeding; zero at t = 1), its raw state is the query.
* "Residual connections are added to the third layer and above": layers are counted
  from 1 with the attention layer as decoder layer 1 (``--residual-start 3``).
* Transparent attention mixes the embeddings too (Bapna: "embeddings be layer 0",
  N+1 weights).  The embeddings have E units, the BiLSTM outputs 2H: h^0 is the
  embedding duplicated [e; e] when E = H (a "bidirectional layer 0" whose two
  directions both output the input; no parameters, so the transparent model has the
  baseline's parameter count, as in Tables 3-4), else a bias-free projection E -> 2H.
  W is :class:`~deepnmt_fairseq.modules.layer_mix.LayerMix` with dropout on W
  (``--transparent-dropout``, the Transformer's default), held by
  ``encoder.memory.layer_mix`` like the Transformer's, so ``--log-mixing-weights`` and
  checkpoints use the same key.
* ``--no-encoder-residual`` removes every encoder residual ("we completely remove the
  residual connections from their encoders", Bapna Sec. 2.3); the decoder keeps its own.

With these choices the named architectures have the parameter counts of Bapna et al.
Tables 3-4 (32k vocabulary, separate source/target embeddings): 128/165/191/216M for
the 512 models with 6/12/16/20 encoder layers and 379M for the 1024 one (see
``deepnmt-param-counts``).
"""


from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)
from fairseq.modules import FairseqDropout
from torch import Tensor

from ..memories import TopMemory, TransparentMemory
from ..modules.additive_attention import MultiHeadAdditiveAttention
from ..modules.layer_norm_lstm import DEFAULT_INIT_RANGE, LayerNormLSTMCell
from .options import DeepTransformerOptions, set_defaults as _set, set_option_defaults

MODEL_NAME = "rnmt_plus"
DEFAULT_MAX_POSITIONS = 100000  # fairseq lstm.py: RNNs have no position limit
RNMT_MEMORY_CHOICES = ChoiceEnum(["top", "transparent"])


def _transformer_default(name: str):
    """One source for defaults shared with the deep Transformer (e.g. dropout on W)."""
    return next(f.default for f in fields(DeepTransformerOptions) if f.name == name)


@dataclass
class RNMTPlusOptions(FairseqDataclass):
    """Options of ``--arch rnmt_plus``; the defaults are Chen et al.'s RNMT+ (1024 units)."""

    encoder_embed_dim: int = field(default=1024, metadata={"help": "source embedding width E"})
    encoder_hidden_size: int = field(
        default=1024, metadata={"help": "LSTM units per direction H of each bidirectional encoder layer "
                                        "(the layer outputs 2H, forward and backward concatenated)"})
    encoder_layers: int = field(default=6, metadata={"help": "bidirectional encoder layers N"})
    decoder_embed_dim: int = field(default=1024, metadata={"help": "target embedding width"})
    decoder_hidden_size: int = field(
        default=1024, metadata={"help": "LSTM units of each decoder layer; also the width d of the projected "
                                        "encoder output the attention reads"})
    decoder_layers: int = field(default=8, metadata={"help": "unidirectional decoder layers (Chen et al.: 8)"})
    attention_heads: int = field(default=4, metadata={"help": "heads of the multi-head additive attention"})
    dropout: float = field(
        default=0.3, metadata={"help": "dropout on the embeddings and on every LSTM layer's output "
                                       "(Chen et al. Sec. 4.1; 0.3 = the authors' En-De configuration)"})
    attention_dropout: float = field(default=0.3, metadata={"help": "dropout on the attention probabilities"})
    residual_start: int = field(
        default=3, metadata={"help": "first layer (1-based) with a residual connection, in encoder and "
                                     "decoder (Chen et al.: 'added to the third layer and above')"})
    no_encoder_residual: bool = field(
        default=False, metadata={"help": "remove every encoder residual connection (Bapna et al. 2018 "
                                         "Tables 3-4, 'Baseline - residuals')"})
    deep_memory: RNMT_MEMORY_CHOICES = field(
        default="top", metadata={"help": "what the attention reads: 'top' = the projected last encoder layer "
                                         "(Chen et al.); 'transparent' = the projected softmax mix of the "
                                         "embeddings and all encoder layers (Bapna et al. 2018, Eq. 1-2, M = 1)"})
    transparent_dropout: float = field(
        default=_transformer_default("transparent_dropout"),
        metadata={"help": "dropout on the transparent-attention weights W before the softmax (Eq. 1; "
                          "the paper gives no value)"})
    no_lstm_layer_norm: bool = field(
        default=False, metadata={"help": "LSTM cells without per-gate LayerNorm (ablation / speed baseline)"})
    lstm_output_tanh: bool = field(
        default=False, metadata={"help": "h = o * tanh(c) (classic LSTM) instead of RNMT+'s h = o * c "
                                         "('no non-linearity is applied to the LSTM output')"})
    rnmt_init_range: float = field(
        default=DEFAULT_INIT_RANGE, metadata={"help": "weights and embeddings start from U(-r, r) "
                                                      "(the authors' implementation: 0.04)"})
    max_source_positions: int = field(default=DEFAULT_MAX_POSITIONS, metadata={"help": "max source length"})
    max_target_positions: int = field(default=DEFAULT_MAX_POSITIONS, metadata={"help": "max target length"})


def _embedding(dictionary, dim: int, init_range: float) -> nn.Embedding:
    m = nn.Embedding(len(dictionary), dim, padding_idx=dictionary.pad())
    nn.init.uniform_(m.weight, -init_range, init_range)
    nn.init.zeros_(m.weight[dictionary.pad()])
    return m


def _linear(inp: int, out: int, init_range: float, bias: bool = True) -> nn.Linear:
    m = nn.Linear(inp, out, bias=bias)
    nn.init.uniform_(m.weight, -init_range, init_range)
    if bias:
        nn.init.zeros_(m.bias)
    return m


def _check_residual_start(args) -> None:
    if args.residual_start < 2:
        raise ValueError(f"--residual-start must be >= 2 (got {args.residual_start}): the first layer of "
                         f"encoder and decoder changes the width (embeddings -> LSTM states)")


class BiLSTMLayer(nn.Module):
    """One bidirectional encoder layer: ``h_out = [h; dropout(fwd(h) ; bwd(h))]`` plus
    ``h`` when ``residual``.  Its output is h^i of Bapna et al. (``--log-grad-ratio``
    hooks this module's output)."""

    def __init__(self, input_size: int, hidden_size: int, residual: bool, dropout: float, **cell_kwargs):
        super().__init__()
        if residual and input_size != 2 * hidden_size:
            raise ValueError(f"residual encoder layer needs input width {2 * hidden_size}, got {input_size}")
        self.fwd = LayerNormLSTMCell(input_size, hidden_size, **cell_kwargs)
        self.bwd = LayerNormLSTMCell(input_size, hidden_size, **cell_kwargs)
        self.residual = residual
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)

    def forward(self, x: Tensor, mask: Optional[Tensor]) -> Tensor:
        """x ``(T, B, in)``, mask ``(T, B)`` True at tokens (None: no padding) -> ``(T, B, 2H)``."""
        out_f, _ = self.fwd.run(self.fwd.input_projection(x), mask)
        out_b, _ = self.bwd.run(self.bwd.input_projection(x), mask, reverse=True)
        y = self.dropout_module(torch.cat([out_f, out_b], dim=-1))
        return x + y if self.residual else y


class RNMTPlusEncoder(FairseqEncoder):
    """Bidirectional LSTM stack; ``encoder_out`` is fairseq's Transformer dict, its
    ``encoder_out`` the projected top layer (or transparent mix), ``(T, B, d)``."""

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        _check_residual_start(args)
        self.padding_idx = dictionary.pad()
        self.embed_tokens = embed_tokens
        self.max_source_positions = args.max_source_positions
        self.dropout_module = FairseqDropout(args.dropout, module_name=type(self).__name__)
        emb, hid, n = args.encoder_embed_dim, args.encoder_hidden_size, args.encoder_layers
        if n < 1:
            raise ValueError("--encoder-layers must be >= 1")
        cell = dict(layer_norm=not args.no_lstm_layer_norm, output_tanh=args.lstm_output_tanh,
                    init_range=args.rnmt_init_range)
        self.layers = nn.ModuleList([
            BiLSTMLayer(emb if i == 0 else 2 * hid, hid,
                        residual=(i + 1 >= args.residual_start and not args.no_encoder_residual),
                        dropout=args.dropout, **cell)
            for i in range(n)
        ])
        self.num_layers = n
        self.output_units = 2 * hid
        # "A projection layer is added to the encoder final output" (Chen et al.)
        self.output_projection = _linear(2 * hid, args.decoder_hidden_size, args.rnmt_init_range)
        self.deep_memory = args.deep_memory  # named in --log-mixing-weights' error (deep_translation)
        self.transparent = args.deep_memory == "transparent"
        self.embed_to_mix = None
        if self.transparent:
            self.memory = TransparentMemory(n, 1, args.transparent_dropout)
            if emb != hid and emb != 2 * hid:
                self.embed_to_mix = _linear(emb, 2 * hid, args.rnmt_init_range, bias=False)
        else:
            self.memory = TopMemory()

    def layer0(self, x: Tensor) -> Tensor:
        """h^0 of transparent attention in the layers' width 2H (module docstring)."""
        if self.embed_to_mix is not None:
            return self.embed_to_mix(x)
        return x if x.size(-1) == self.output_units else torch.cat([x, x], dim=-1)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False):
        padding_mask = src_tokens.eq(self.padding_idx)  # (B, T)
        has_pads = bool(padding_mask.any())
        x = self.dropout_module(self.embed_tokens(src_tokens)).transpose(0, 1)  # (T, B, E)
        mask = (~padding_mask).t() if has_pads else None
        if mask is not None:
            x = x * mask.unsqueeze(-1).to(x.dtype)
        run = self.memory.start(self.layer0(x) if self.transparent else x, padding_mask, None,
                                self.output_projection)
        states: List[Tensor] = [x] if return_all_hiddens else []
        for pos, layer in enumerate(self.layers):
            x = layer(x, mask)
            run.observe(pos, x)
            if return_all_hiddens:
                states.append(x)
        memories = run.finish()  # transparent: projection(mix) (1, T, B, d); top: None
        out = memories[0][0] if memories is not None else self.output_projection(x)
        return {
            "encoder_out": [out],
            "encoder_padding_mask": [padding_mask],
            "encoder_embedding": [],
            "encoder_states": states,
            "src_tokens": [],
            "src_lengths": [(~padding_mask).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
        }

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        def sel(key, dim):
            return [t.index_select(dim, new_order) for t in encoder_out.get(key, [])]

        return {
            "encoder_out": sel("encoder_out", 1),
            "encoder_padding_mask": sel("encoder_padding_mask", 0),
            "encoder_embedding": sel("encoder_embedding", 0),
            "encoder_states": sel("encoder_states", 1),
            "src_tokens": sel("src_tokens", 0),
            "src_lengths": sel("src_lengths", 0),
        }

    def max_positions(self):
        return self.max_source_positions


class RNMTPlusDecoder(FairseqIncrementalDecoder):
    """Unidirectional LSTM stack; layer 1's state queries the attention, whose context
    goes to every layer and to the softmax (Chen et al. Sec. 4.1).

    Incremental state (``cached_state``): every layer's ``h``/``c`` ``(L, B, H)``, the
    last attention context ``(B, d)`` (input feeding) and the projected attention keys
    ``(T', B, d)``; :meth:`reorder_incremental_state` reorders all four.
    """

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        _check_residual_start(args)
        self.embed_tokens = embed_tokens
        self.max_target_positions = args.max_target_positions
        self.dropout_module = FairseqDropout(args.dropout, module_name=type(self).__name__)
        emb, hid, d = args.decoder_embed_dim, args.decoder_hidden_size, args.decoder_hidden_size
        if args.decoder_layers < 1:
            raise ValueError("--decoder-layers must be >= 1")
        self.hidden_size, self.context_size, self.num_layers = hid, d, args.decoder_layers
        self.residual_start = args.residual_start
        cell = dict(layer_norm=not args.no_lstm_layer_norm, output_tanh=args.lstm_output_tanh,
                    init_range=args.rnmt_init_range)
        self.layers = nn.ModuleList([
            LayerNormLSTMCell((emb if i == 0 else hid) + d, hid, **cell) for i in range(args.decoder_layers)
        ])
        self.attention = MultiHeadAdditiveAttention(hid, d, args.attention_heads, args.attention_dropout,
                                                    init_range=args.rnmt_init_range)
        self.fc_out = _linear(hid + d, len(dictionary), args.rnmt_init_range)
        self.need_attn = True

    # ------------------------------------------------------------------ state
    def _initial_state(self, encoder_out, bsz: int, like: Tensor):
        memory = encoder_out["encoder_out"][0]
        z = like.new_zeros(self.num_layers, bsz, self.hidden_size)
        return {"h": z, "c": z.clone(), "ctx": like.new_zeros(bsz, self.context_size),
                "keys": self.attention.project_keys(memory)}

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        cached = self.get_incremental_state(incremental_state, "cached_state")
        if cached is None:
            return
        dims = {"h": 1, "c": 1, "ctx": 0, "keys": 1}
        new = {k: v.index_select(dims[k], new_order) for k, v in cached.items() if v is not None}
        self.set_incremental_state(incremental_state, "cached_state", new)

    # ---------------------------------------------------------------- forward
    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, features_only: bool = False,
                src_lengths=None, **kwargs):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        if encoder_out is None:
            raise ValueError("rnmt_plus decoder needs the encoder output (no decoder-only use)")
        cached = None
        if incremental_state is not None:
            cached = self.get_incremental_state(incremental_state, "cached_state")
            if cached is not None:
                prev_output_tokens = prev_output_tokens[:, -1:]
        bsz, steps = prev_output_tokens.shape
        x = self.dropout_module(self.embed_tokens(prev_output_tokens)).transpose(0, 1)  # (T, B, E)
        if cached is None:
            cached = self._initial_state(encoder_out, bsz, x)
        memory = encoder_out["encoder_out"][0]
        mem_mask = encoder_out["encoder_padding_mask"][0] if len(encoder_out["encoder_padding_mask"]) else None
        if mem_mask is not None and not bool(mem_mask.any()):
            mem_mask = None
        keys = cached["keys"]
        hs, cs = list(cached["h"].unbind(0)), list(cached["c"].unbind(0))

        # layer 1 with the attention, step by step (input feeding)
        first = self.layers[0]
        emb_w = nn.functional.linear(x, first.weight_ih[:, : x.size(-1)], first.bias)  # (T, B, 4H)
        ctx_w = first.weight_ih[:, x.size(-1):]
        h, c, ctx = hs[0], cs[0], cached["ctx"]
        outs, ctxs, probs = [], [], []
        for t in range(steps):
            h, c = first.step(emb_w[t] + nn.functional.linear(ctx, ctx_w), (h, c))
            ctx, p = self.attention(h, keys, memory, mem_mask)
            outs.append(h)
            ctxs.append(ctx)
            probs.append(p)
        hs[0], cs[0] = h, c
        layer_in = self.dropout_module(torch.stack(outs, 0))  # (T, B, H)
        context = torch.stack(ctxs, 0)  # (T, B, d)

        # layers 2..L over the whole (partial) sequence
        for i in range(1, self.num_layers):
            cell = self.layers[i]
            y, (hs[i], cs[i]) = cell.run(cell.input_projection(torch.cat([layer_in, context], -1)),
                                         state=(hs[i], cs[i]))
            y = self.dropout_module(y)
            layer_in = layer_in + y if i + 1 >= self.residual_start else y

        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "cached_state", {
                "h": torch.stack(hs, 0), "c": torch.stack(cs, 0), "ctx": ctx, "keys": keys})
        features = torch.cat([layer_in, context], -1).transpose(0, 1)  # (B, T, H + d)
        attn = torch.stack(probs, 1).mean(2) if self.need_attn or not self.training else None  # (B, T, T')
        return features, {"attn": [attn], "inner_states": [layer_in]}

    def output_layer(self, features):
        return self.fc_out(features)

    def max_positions(self):
        return self.max_target_positions

    def make_generation_fast_(self, need_attn=False, **kwargs):
        self.need_attn = need_attn


@register_model(MODEL_NAME)
class RNMTPlusModel(FairseqEncoderDecoderModel):
    """RNMT+ (Chen et al. 2018) with optional transparent attention (Bapna et al. 2018).

    Options: :class:`RNMTPlusOptions`; named architectures at the end of this module.
    """

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, RNMTPlusOptions(), delete_default=True)

    @classmethod
    def build_model(cls, args, task):
        rnmt_plus_architecture(args)
        src, tgt = task.source_dictionary, task.target_dictionary
        encoder = RNMTPlusEncoder(args, src, _embedding(src, args.encoder_embed_dim, args.rnmt_init_range))
        decoder = RNMTPlusDecoder(args, tgt, _embedding(tgt, args.decoder_embed_dim, args.rnmt_init_range))
        return cls(encoder, decoder)

    def max_positions(self):
        return self.encoder.max_positions(), self.decoder.max_positions()

    @staticmethod
    def describe(args) -> str:
        """One line for ``deepnmt-repro show`` (after the named architecture's defaults)."""
        extra = [f"memory {args.deep_memory}"]
        if args.no_encoder_residual:
            extra.append("no encoder residuals")
        if args.no_lstm_layer_norm:
            extra.append("no per-gate LayerNorm")
        return (f"RNMT+ {args.encoder_layers} bi-LSTM + {args.decoder_layers} LSTM layers, "
                f"{args.encoder_hidden_size} units per direction, decoder {args.decoder_hidden_size}, "
                f"emb {args.encoder_embed_dim}/{args.decoder_embed_dim}, {args.attention_heads} attention heads, "
                f"residuals from layer {args.residual_start}, dropout {args.dropout:g} / attention "
                f"{args.attention_dropout:g}, " + ", ".join(extra))


# ------------------------------------------------------------------------------
# named architectures
@register_model_architecture(MODEL_NAME, MODEL_NAME)
def rnmt_plus_architecture(args):
    """Chen et al.'s RNMT+: 6 bidirectional encoder layers, 8 decoder layers, 1024 units.
    Defaults come from :class:`RNMTPlusOptions` (written once, there)."""
    set_option_defaults(args, RNMTPlusOptions)


#: Bapna et al. 2018 Tables 3-4: parameter counts (millions) of the RNMT+ columns
BAPNA_RNMT_PARAMS = {(512, 6): 128, (512, 12): 165, (512, 16): 191, (512, 20): 216, (1024, 6): 379}
#: name -> (table row, paper parameter count); registered in models.architectures.PAPER_ROWS
RNMT_ROWS = {}
#: (variant, width, encoder layers) -> name, variant in {"baseline", "transparent", "nores"}
RNMT_ARCHS = {}


def _register_rnmt(name: str, variant: str, width: int, layers: int):
    label = {"baseline": "Baseline", "transparent": "Transparent", "nores": "Baseline - residuals"}[variant]
    RNMT_ROWS[name] = (f"Tables 3-4 (RNMT+ {width}, {label}, {layers} encoder layers)",
                       BAPNA_RNMT_PARAMS[(width, layers)])
    RNMT_ARCHS[(variant, width, layers)] = name

    @register_model_architecture(MODEL_NAME, name)
    def fn(args):
        _set(args, encoder_layers=layers, decoder_layers=8,
             encoder_embed_dim=width, encoder_hidden_size=width,
             decoder_embed_dim=width, decoder_hidden_size=width)
        if variant == "transparent":
            _set(args, deep_memory="transparent")
        if variant == "nores":
            _set(args, no_encoder_residual=True)
        rnmt_plus_architecture(args)

    return fn


# every name written out once (grep finds it; deepnmt-repro arch NAME describes it)
_register_rnmt("rnmt_plus_512_6l", "baseline", 512, 6)
_register_rnmt("rnmt_plus_512_transparent_6l", "transparent", 512, 6)
_register_rnmt("rnmt_plus_512_noresidual_6l", "nores", 512, 6)
_register_rnmt("rnmt_plus_512_12l", "baseline", 512, 12)
_register_rnmt("rnmt_plus_512_transparent_12l", "transparent", 512, 12)
_register_rnmt("rnmt_plus_512_noresidual_12l", "nores", 512, 12)
_register_rnmt("rnmt_plus_512_16l", "baseline", 512, 16)
_register_rnmt("rnmt_plus_512_transparent_16l", "transparent", 512, 16)
_register_rnmt("rnmt_plus_512_noresidual_16l", "nores", 512, 16)
_register_rnmt("rnmt_plus_512_20l", "baseline", 512, 20)
_register_rnmt("rnmt_plus_512_transparent_20l", "transparent", 512, 20)
_register_rnmt("rnmt_plus_512_noresidual_20l", "nores", 512, 20)
_register_rnmt("rnmt_plus_1024_6l", "baseline", 1024, 6)
