"""The deep encoder-decoder shared by MSC, transparent attention, CAD and GPKD.

fairseq glue only: subclasses of fairseq's Transformer encoder, decoder and
layers that override builder hooks (``build_encoder_layer``,
``build_self_attention``, ``build_encoder_attention``) and the residual hook
(``residual_connection``).  The mechanisms live in ``deepnmt_fairseq.modules``.

Data flow::

    tokens -> embeddings (C^0) -> encoder layers, in blocks (each layer may read
    the context state, may be permuted (GP) or have sub-layers skipped (SSL))
    -> one *memory* per decoder layer -> decoder layers (each attends to its
    memory, may drop its cross-attention (CAD)) -> output projection

The encoder builds every memory once and stores them in ``encoder_out`` under
``deepnmt_memory`` (a single ``(M, T', B, d)`` tensor, one slice per decoder
layer) and ``deepnmt_memory_padding_mask`` ``(B, T')``; ``reorder_encoder_out``
reorders them like fairseq's own keys, so beam search needs nothing else.

* ``top``:          no extra memory, every decoder layer reads ``encoder_out``.
* ``transparent``:  memory j = LN(sum_i s_ij h^i) (Bapna et al. 2018, Eq. 2;
                    the final encoder LayerNorm is applied to the mix in pre-norm
                    models, where layer outputs are not normalised).
* ``msc``:          memory n = [B_e^n ; C^n] along time (Wei et al. 2020, Eq. 7,
                    13), where B_e^n is block n's output passed through the
                    encoder's final LayerNorm (pre-norm) and C^n = Q(C^{n-1}, B_e^n)
                    (Eq. 9); without context cell, memory n = B_e^n.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.modules import transformer_layer
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

from ..modules.context_cell import ContextCell
from ..modules.cross_attention_drop import drop_probabilities, sample_keep
from ..modules.group_permutation import check_group_size, layer_order
from ..modules.layer_mix import LayerMix
from ..modules.sublayer_skip import SublayerSkip
from .context_attention import ContextFusionAttention
from .relative_attention import RelativeContextFusionAttention, RelativeMultiheadAttention
from .options import DeepTransformerOptions

logger = logging.getLogger(__name__)

MODEL_NAME = "deepnmt_transformer"
MEMORY_KEY = "deepnmt_memory"
MEMORY_MASK_KEY = "deepnmt_memory_padding_mask"


def _wrap_layer(layer: nn.Module, cfg) -> nn.Module:
    """fairseq's activation checkpointing / FSDP wrapping of one layer."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def graph_tie(*modules: Optional[nn.Module]) -> Optional[Tensor]:
    """A zero that depends on every parameter of ``modules``.

    Added to the output when a stochastic choice (LayerDrop, cross-attention
    drop) skips a module in training: the skipped parameters stay in the
    autograd graph with an exact zero gradient, so DistributedDataParallel does
    not fail on unused parameters, whatever the DDP backend.  It reads one
    element per parameter, so it costs next to nothing.
    """
    tie = None
    for m in modules:
        if m is None:
            continue
        for p in m.parameters():
            if p.requires_grad:
                t = p.view(-1)[0]
                tie = t if tie is None else tie + t
    return None if tie is None else tie * 0.0


def _layerdrop_coins(p: float, n: int, training: bool) -> List[bool]:
    """fairseq LayerDrop (Fan et al. 2020): which layers are dropped this pass."""
    if not training or p <= 0:
        return [False] * n
    return (torch.rand(n) < p).tolist()


class BranchScaleMixin:
    """Residual hook: x_{l+1} = s * F(x_l) + x_l for the sub-layers of one call.

    ``branch_scales`` lists one multiplier per residual connection of the layer
    (None = 1).  A skipped branch (s = 0) is multiplied by zero rather than cut
    off, so its parameters stay in the autograd graph (no DDP unused-parameter
    failure; their gradient is exactly zero).
    """

    _branch_scales: Optional[List[Optional[float]]] = None
    _branch_index: int = 0
    _residual: bool = True  # False: "Baseline - residuals" (Bapna et al. 2018 Table 1)

    def residual_connection(self, x, residual):
        scales = self._branch_scales
        if scales is not None:
            s = scales[self._branch_index]
            self._branch_index += 1
            if s == 0.0:  # skipped: zero (not NaN, even if the branch overflowed in fp16)
                x = torch.nan_to_num(x * 0.0, nan=0.0, posinf=0.0, neginf=0.0)
            elif s is not None and s != 1.0:
                x = x * s
        return residual + x if self._residual else x


class DeepEncoderLayer(BranchScaleMixin, transformer_layer.TransformerEncoderLayerBase):
    """Encoder layer; with ``context=True`` its self-attention is MSC's fused Eq. 12."""

    def __init__(self, cfg, opts: DeepTransformerOptions, context: bool = False):
        self._opts = opts
        self._context = context
        super().__init__(cfg)
        self._residual = not opts.no_encoder_residual

    def build_self_attention(self, embed_dim, cfg):
        rpr = self._opts.rpr_max_relative_position
        kwargs = dict(dropout=cfg.attention_dropout, self_attention=True, q_noise=self.quant_noise,
                      qn_block_size=self.quant_noise_block_size)
        if rpr > 0:
            kwargs.update(max_relative_position=rpr, relative_values=self._opts.rpr_values)
        if self._context:
            cls = RelativeContextFusionAttention if rpr > 0 else ContextFusionAttention
            return cls(embed_dim, cfg.encoder.attention_heads, fusion=self._opts.msc_fusion,
                       context_query_norm=True, gate_norm=True, **kwargs)
        if rpr > 0:
            return RelativeMultiheadAttention(embed_dim, cfg.encoder.attention_heads, **kwargs)
        return super().build_self_attention(embed_dim, cfg)

    def forward(
        self,
        x,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        context: Optional[Tensor] = None,
        context_padding_mask: Optional[Tensor] = None,
        branch_scales: Optional[List[Optional[float]]] = None,
    ):
        """x: ``(T, B, d)``; context: C^{n-1} ``(T, B, d)`` for MSC layers."""
        if self._context:
            self.self_attn.set_context(context, context_padding_mask)
        self._branch_scales, self._branch_index = branch_scales, 0
        try:
            return super().forward(x, encoder_padding_mask, attn_mask)
        finally:
            self._branch_scales = None
            if self._context:
                self.self_attn.set_context(None, None)


class DeepDecoderLayer(BranchScaleMixin, transformer_layer.TransformerDecoderLayerBase):
    """Decoder layer; with ``context=True`` its cross-attention is MSC's fused Eq. 13."""

    def __init__(self, cfg, no_encoder_attn: bool, opts: DeepTransformerOptions, context: bool = False):
        self._opts = opts
        self._context = context and not no_encoder_attn
        super().__init__(cfg, no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        rpr = self._opts.rpr_max_relative_position
        if rpr > 0:
            if cfg.cross_self_attention or add_bias_kv or add_zero_attn:
                raise ValueError("--rpr-max-relative-position cannot be combined with --cross-self-attention")
            return RelativeMultiheadAttention(
                embed_dim, cfg.decoder.attention_heads, max_relative_position=rpr,
                relative_values=self._opts.rpr_values, dropout=cfg.attention_dropout,
                q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            )
        return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)

    def build_encoder_attention(self, embed_dim, cfg):
        if self._context:
            return ContextFusionAttention(
                embed_dim,
                cfg.decoder.attention_heads,
                fusion=self._opts.msc_fusion,
                kdim=cfg.encoder.embed_dim,
                vdim=cfg.encoder.embed_dim,
                dropout=cfg.attention_dropout,
                encoder_decoder_attention=True,
                q_noise=self.quant_noise,
                qn_block_size=self.quant_noise_block_size,
            )
        return super().build_encoder_attention(embed_dim, cfg)

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                prev_self_attn_state=None, prev_attn_state=None, self_attn_mask=None,
                self_attn_padding_mask=None, need_attn=False, need_head_weights=False,
                branch_scales: Optional[List[Optional[float]]] = None):
        """``branch_scales`` = (self-attention, FFN) multipliers; cross-attention is never scaled."""
        if branch_scales is not None:
            cross = self.encoder_attn is not None and encoder_out is not None
            branch_scales = [branch_scales[0]] + ([None] if cross else []) + [branch_scales[1]]
        self._branch_scales, self._branch_index = branch_scales, 0
        try:
            return super().forward(
                x, encoder_out, encoder_padding_mask, incremental_state,
                prev_self_attn_state=prev_self_attn_state, prev_attn_state=prev_attn_state,
                self_attn_mask=self_attn_mask, self_attn_padding_mask=self_attn_padding_mask,
                need_attn=need_attn, need_head_weights=need_head_weights,
            )
        finally:
            self._branch_scales = None


class _SkipScheduleMixin:
    """Two-stage skipping: the SSL schedule switches on after ``ssl_start_update``."""

    skip: Optional[SublayerSkip] = None

    def init_skip(self, num_layers: int, enabled: bool) -> None:
        """Build the SSL schedule; its on/off state is a buffer, so inference knows
        whether the saved weights were trained with skipping (Eq. 6 rescaling)."""
        self.skip = None
        if enabled:
            self.skip = SublayerSkip(num_layers, self.opts.ssl_rate, self.opts.ssl_mode, self.opts.ssl_sublayers)
            self.register_buffer("ssl_active", torch.tensor(self.opts.ssl_start_update <= 0))
            self.skip.active = bool(self.ssl_active)

    def set_num_updates(self, num_updates):
        if self.skip is not None:
            self.ssl_active.fill_(num_updates >= self.opts.ssl_start_update)
            self.skip.active = bool(self.ssl_active)
        # (no chaining: FairseqModel.set_num_updates already visits every submodule)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "ssl_active"
        if self.skip is not None and key not in state_dict:
            # e.g. --finetune-from-model of a model trained without skipping
            state_dict[key] = self.ssl_active.clone()
        elif self.skip is None:
            # a model trained with skipping, loaded without it: the flag has no weight to carry
            state_dict.pop(key, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.skip is not None:
            self.skip.active = bool(self.ssl_active)

    def draw_branch_scales(self) -> Optional[List[float]]:
        return self.skip.scales(self.training) if self.skip is not None else None


class DeepTransformerEncoder(_SkipScheduleMixin, TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens):
        self.opts = DeepTransformerOptions.from_args(cfg)
        n_layers, n_dec = cfg.encoder.layers, cfg.decoder.layers
        self.msc_blocks: Optional[List[int]] = None
        if self.opts.deep_memory == "msc":
            self.msc_blocks = self.opts.block_sizes(n_layers, n_dec)
            if self.opts.gp_group_size > 1 and any(m % self.opts.gp_group_size for m in self.msc_blocks):
                raise ValueError(
                    f"--gp-group-size {self.opts.gp_group_size} must divide every MSC block "
                    f"({self.opts.msc_block_layers or self.msc_blocks}): a permutation may not "
                    f"move a layer to another block, whose context state differs"
                )
        if self.opts.deep_memory == "transparent" and n_layers < 1:
            raise ValueError("--deep-memory transparent needs --encoder-layers >= 1")
        if self.opts.gp_group_size > 1:
            check_group_size(n_layers, self.opts.gp_group_size, "--gp-group-size")
        self._layer_context = self.opts.msc_context and not self.opts.msc_no_encoder_context
        super().__init__(cfg, dictionary, embed_tokens)
        dim = embed_tokens.embedding_dim
        self.num_memories = n_dec
        self.layer_mix = (
            LayerMix(n_layers + 1, n_dec, self.opts.transparent_dropout)
            if self.opts.deep_memory == "transparent" else None
        )
        self.context_cell = (
            ContextCell(dim, self.opts.msc_context_cell, cfg.encoder.ffn_embed_dim)
            if self.opts.msc_context else None
        )
        self.init_skip(n_layers, self.opts.ssl_rate > 0)
        if self.msc_blocks is not None:
            ends = torch.tensor(self.msc_blocks).cumsum(0) - 1
            self._block_end = set(ends.tolist())
            self._block_of = [n for n, m in enumerate(self.msc_blocks) for _ in range(m)]

    def build_encoder_layer(self, cfg):
        return _wrap_layer(DeepEncoderLayer(cfg, self.opts, context=self._layer_context), cfg)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None,
                           return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None):
        """Returns fairseq's encoder dict plus the per-decoder-layer memories."""
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # T x B x C
        pad = padding_mask if has_pads else None

        keep_states = return_all_hiddens or self.layer_mix is not None
        states: List[Tensor] = [x] if keep_states else []
        order = layer_order(self.num_layers, self.opts.gp_group_size, self.training)
        scales = self.draw_branch_scales()
        dropped = _layerdrop_coins(self.encoder_layerdrop, self.num_layers, self.training)
        context = x if self.context_cell is not None else None  # C^0 (Eq. 9)
        block_memories: List[Tensor] = []

        for pos, idx in enumerate(order):
            if dropped[pos]:
                tie = graph_tie(self.layers[idx])
                if tie is not None:
                    x = x + tie
            else:
                kwargs: Dict[str, Any] = {}
                if self._layer_context:
                    kwargs["context"], kwargs["context_padding_mask"] = context, pad
                if scales is not None:
                    kwargs["branch_scales"] = scales[2 * pos: 2 * pos + 2]
                x = self.layers[idx](x, encoder_padding_mask=pad, **kwargs)
            if keep_states:
                states.append(x)
            if self.msc_blocks is not None and pos in self._block_end:
                block = self.layer_norm(x) if self.layer_norm is not None else x  # B_e^n
                if self.context_cell is not None:
                    context = self.context_cell(context, block)  # C^n (Eq. 9)
                    block_memories.append(torch.cat([block, context], dim=0))
                else:
                    block_memories.append(block)

        top = self.layer_norm(x) if self.layer_norm is not None else x
        out = {
            "encoder_out": [top],
            "encoder_padding_mask": [padding_mask],
            "encoder_embedding": [encoder_embedding],
            "encoder_states": states if return_all_hiddens else [],
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
        }
        if self.layer_mix is not None:
            mixed = self.layer_mix(torch.stack(states))
            if self.layer_norm is not None:
                mixed = self.layer_norm(mixed)
            out[MEMORY_KEY], out[MEMORY_MASK_KEY] = [mixed], [padding_mask]
        elif block_memories:
            out[MEMORY_KEY] = [torch.stack(block_memories)]
            mask = padding_mask if self.context_cell is None else torch.cat([padding_mask, padding_mask], 1)
            out[MEMORY_MASK_KEY] = [mask]
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        if len(encoder_out.get(MEMORY_KEY, [])) > 0:
            out[MEMORY_KEY] = [encoder_out[MEMORY_KEY][0].index_select(2, new_order)]
            out[MEMORY_MASK_KEY] = [encoder_out[MEMORY_MASK_KEY][0].index_select(0, new_order)]
        return out


class DeepTransformerDecoder(_SkipScheduleMixin, TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.opts = DeepTransformerOptions.from_args(cfg)
        n = cfg.decoder.layers
        self.cad_probs = drop_probabilities(n, self.opts.cad_drop_depth, self.opts.cad_drop_ratio)
        if self.opts.gp_decoder_group_size > 1:
            check_group_size(n, self.opts.gp_decoder_group_size, "--gp-decoder-group-size")
            if self.opts.deep_memory == "msc":
                raise ValueError(
                    "--gp-decoder-group-size cannot be combined with --deep-memory msc: decoder "
                    "layer n is tied to encoder block n (block-scale collaboration, Eq. 7)"
                )
        self._built = 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.init_skip(n, self.opts.ssl_rate > 0 and self.opts.ssl_decoder)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        idx, self._built = self._built, self._built + 1
        no_attn = no_encoder_attn or (idx < len(self.cad_probs) and self.cad_probs[idx] >= 1.0)
        layer = DeepDecoderLayer(cfg, no_attn, self.opts, context=self.opts.msc_context)
        return _wrap_layer(layer, cfg)

    def embed(self, prev_output_tokens, incremental_state=None) -> Tensor:
        """Token + position embedding of the decoder input, ``(T, B, d)``."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens.contiguous())
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x = x + positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x).transpose(0, 1)

    def memories(self, encoder_out: Optional[Dict[str, List[Tensor]]]):
        """(per-layer memory or None, padding mask) for every decoder layer."""
        if encoder_out is None or len(encoder_out.get("encoder_out", [])) == 0:
            return [None] * self.num_layers, None
        if len(encoder_out.get(MEMORY_KEY, [])) > 0:
            stacked = encoder_out[MEMORY_KEY][0]
            if stacked.size(0) != self.num_layers:
                raise ValueError(
                    f"encoder produced {stacked.size(0)} memories for {self.num_layers} decoder layers"
                )
            return list(stacked.unbind(0)), encoder_out[MEMORY_MASK_KEY][0]
        mask = encoder_out["encoder_padding_mask"][0] if len(encoder_out["encoder_padding_mask"]) else None
        return [encoder_out["encoder_out"][0]] * self.num_layers, mask

    def extract_features_scriptable(self, prev_output_tokens, encoder_out, incremental_state=None,
                                    full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                                    alignment_heads: Optional[int] = None):
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        x = self.embed(prev_output_tokens, incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        self_attn_padding_mask = None
        if self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)
        self_attn_mask = (
            self.buffered_future_mask(x) if incremental_state is None and not full_context_alignment else None
        )

        memories, memory_mask = self.memories(encoder_out)
        order = layer_order(self.num_layers, self.opts.gp_decoder_group_size, self.training)
        keep_cross = sample_keep(self.cad_probs, self.training)
        scales = self.draw_branch_scales()
        dropped = _layerdrop_coins(self.decoder_layerdrop, self.num_layers, self.training)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        for pos, idx in enumerate(order):
            if dropped[pos]:
                tie = graph_tie(self.layers[idx])
                x = x if tie is None else x + tie
                inner_states.append(x)
                continue
            memory = memories[idx] if keep_cross[idx] else None
            if memory is None and self.training and self.layers[idx].encoder_attn is not None:
                tie = graph_tie(self.layers[idx].encoder_attn, self.layers[idx].encoder_attn_layer_norm)
                x = x if tie is None else x + tie
            kwargs = {}
            if scales is not None:
                kwargs["branch_scales"] = scales[2 * pos: 2 * pos + 2]
            x, layer_attn, _ = self.layers[idx](
                x, memory, memory_mask if memory is not None else None, incremental_state,
                self_attn_mask=self_attn_mask, self_attn_padding_mask=self_attn_padding_mask,
                need_attn=bool(idx == alignment_layer), need_head_weights=bool(idx == alignment_layer),
                **kwargs,
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if self.training and encoder_out is not None and not any(
            keep_cross[i] and self.layers[i].encoder_attn is not None for i in range(self.num_layers)
        ):  # every cross-attention dropped this pass: keep the encoder in the graph (DDP)
            mem = encoder_out.get(MEMORY_KEY) or encoder_out.get("encoder_out") or []
            if len(mem) > 0:
                x = x + mem[0].sum() * 0.0
        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}


@register_model(MODEL_NAME)
class DeepTransformerModel(TransformerModel):
    """fairseq Transformer whose encoder/decoder carry the deep-model mechanisms.

    Options: :class:`~deepnmt_fairseq.models.options.DeepTransformerOptions`;
    named architectures: :mod:`deepnmt_fairseq.models.architectures`.
    """

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, DeepTransformerOptions(), delete_default=True)

    @classmethod
    def build_model(cls, args, task):
        from .architectures import deep_base_architecture

        deep_base_architecture(args)
        return super().build_model(args, task)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, extra_passes: Optional[Dict[str, Any]] = None):
        """fairseq's forward; with ``extra_passes`` the collapse-reducing passes (see
        :meth:`forward_passes`), so that a DDP wrapper sees them as one forward."""
        if extra_passes is not None:
            return self.forward_passes(src_tokens, src_lengths, prev_output_tokens, **extra_passes)
        return super().forward(src_tokens, src_lengths, prev_output_tokens, return_all_hiddens=return_all_hiddens,
                               features_only=features_only, alignment_layer=alignment_layer,
                               alignment_heads=alignment_heads)

    def forward_passes(self, src_tokens, src_lengths, prev_output_tokens, decoder_passes: int = 1,
                       corrupted_sources=()):
        """Several decoder passes over one encoder output (DDR), plus encoder+decoder
        passes over corrupted sources (ALD), each with its own dropout and CAD coins.

        Returns ``{"passes": [(features (B, T, d), logits, extra), ...],
        "corrupted": [features, ...]}``.
        """
        enc = self.encoder(src_tokens, src_lengths=src_lengths)
        passes = []
        for _ in range(decoder_passes):
            features, extra = self.decoder(prev_output_tokens, encoder_out=enc, features_only=True)
            passes.append((features, self.decoder.output_layer(features), extra))
        corrupted = []
        for src in corrupted_sources:
            enc_c = self.encoder(src, src_lengths=src_lengths)
            corrupted.append(self.decoder(prev_output_tokens, encoder_out=enc_c, features_only=True)[0])
        return {"passes": passes, "corrupted": corrupted}

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return DeepTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return DeepTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)
