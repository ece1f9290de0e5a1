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

The encoder builds every memory once with its memory module (``build_memory``, the
extension point; one module per method in :mod:`deepnmt_fairseq.memories`: top,
transparent, MSC, DLCL) and stores them in ``encoder_out`` under ``deepnmt_memory`` (a single
``(M, T', B, d)`` tensor, one slice per decoder layer) and
``deepnmt_memory_padding_mask`` ``(B, T')``; ``reorder_encoder_out`` reorders them like
fairseq's own keys, so beam search needs nothing else.

Code adapted from fairseq 0.12.3 carries a ``copied from`` marker (:data:`ADAPTED_FROM`);
``tests/test_memories.py`` fails when the installed fairseq's original changes.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
import torch.nn as nn
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq.modules import transformer_layer
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from torch import Tensor

from ..memories import MEMORY_KEY, MEMORY_MASK_KEY, EncoderMemory, decoder_memories, memory_class, reorder
from ..memories.base import upgrade_memory_keys
from ..memories.msc import encoder_layers_of
from ..modules.cross_attention_drop import drop_probabilities, layers_without_cross_attention, sample_keep
from ..modules.group_permutation import check_group_size, layer_order
from ..modules.sublayer_skip import BranchScales, SublayerSkip, scale_branch
from .context_attention import ContextFusionAttention
from .relative_attention import RelativeContextFusionAttention, RelativeMultiheadAttention
from .options import DeepTransformerOptions, set_defaults, set_option_defaults
from .residual_weights import (ENCODER_SLOTS, build_residual_weight, check_residual_scaling, init_deepnorm,
                               profile_admin)

logger = logging.getLogger(__name__)

MODEL_NAME = "deepnmt_transformer"

#: Methods adapted from fairseq rather than inherited: ours -> (fairseq file, qualified name,
#: version, sha256 of the original's source).  ``tests/test_memories.py`` checks the hashes.
ADAPTED_FROM = {
    "DeepTransformerEncoder.forward_scriptable": (
        "fairseq/models/transformer/transformer_encoder.py", "TransformerEncoderBase.forward_scriptable",
        "0.12.3", "d14f4646ff38666d03b216d34af2af266f7966d14863c9c44d0b5eb299d5f369"),
    "DeepTransformerDecoder.extract_features_scriptable": (
        "fairseq/models/transformer/transformer_decoder.py", "TransformerDecoderBase.extract_features_scriptable",
        "0.12.3", "a58c59d945aeb348d3c5f553a944998ce6845705a9575109f9d91e8a35b2ebec"),
}


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
    """Residual hook: x_{l+1} = w * x_l + s * F(x_l) for the sub-layers of one call.

    fairseq's layers call ``residual_connection(x, residual)`` once per sub-layer and
    give the hook no per-call argument, so the layer's ``forward`` takes the call's
    multipliers explicitly (``branch_scales``, one per residual connection, None = 1)
    and holds them, as a :class:`BranchScales` iterator, only for the duration of
    that call (:meth:`_branches`), together with the sub-layer *slots* of the call
    (which of the layer's sub-layers each residual connection belongs to).  ``s`` is the
    skipping sub-layer's scale (SSL), ``w`` the shortcut weight of DeepNorm / Admin
    (:mod:`~deepnmt_fairseq.modules.residual_scaling`; absent = 1).
    """

    _scales: Optional[BranchScales] = None
    _slots: Optional[Iterator[int]] = None
    _residual: bool = True  # False: "Baseline - residuals" (Bapna et al. 2018 Table 1)
    # the layer's ``residual_weight`` (a submodule or None) is set in its __init__: a class-level
    # default would shadow nn.Module's lookup of the registered submodule

    @contextmanager
    def _branches(self, scales: Optional[List[Optional[float]]], slots: Sequence[int]):
        self._scales = BranchScales(scales) if scales is not None else None
        self._slots = iter(slots) if self.residual_weight is not None else None
        try:
            yield
        finally:
            self._scales = None
            self._slots = None

    def residual_connection(self, x, residual):
        if self._scales is not None:
            x = scale_branch(x, self._scales.next())
        if not self._residual:
            return x
        if self._slots is not None:
            return self.residual_weight(residual, x, next(self._slots))
        return residual + x


class DeepEncoderLayer(BranchScaleMixin, transformer_layer.TransformerEncoderLayerBase):
    """Encoder layer; with ``context=True`` its self-attention is MSC's fused Eq. 12."""

    def __init__(self, cfg, opts: DeepTransformerOptions, context: bool = False):
        self._opts = opts
        self._context = context
        super().__init__(cfg)
        self._residual = not opts.no_encoder_residual
        self.residual_weight = build_residual_weight(opts, cfg, "encoder", 2, cfg.encoder.embed_dim)

    def build_self_attention(self, embed_dim, cfg):
        rpr = self._opts.rpr_max_relative_position
        kwargs = dict(dropout=cfg.attention_dropout, self_attention=True, q_noise=self.quant_noise,
                      qn_block_size=self.quant_noise_block_size)
        if rpr > 0:
            kwargs.update(max_relative_position=rpr, relative_values=self._opts.rpr_values)
        if self._context:
            # Eq. 12 as written by default; --msc-count-fitting-norms adds the two LayerNorms
            # that reproduce Table 2's parameter counts (docs/parameter-counts.md)
            fit = bool(self._opts.msc_count_fitting_norms)
            cls = RelativeContextFusionAttention if rpr > 0 else ContextFusionAttention
            return cls(embed_dim, cfg.encoder.attention_heads, fusion=self._opts.msc_fusion,
                       context_query_norm=fit, gate_norm=fit, **kwargs)
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
        try:
            with self._branches(branch_scales, ENCODER_SLOTS):
                return super().forward(x, encoder_padding_mask, attn_mask)
        finally:
            if self._context:
                self.self_attn.set_context(None, None)


class DeepDecoderLayer(BranchScaleMixin, transformer_layer.TransformerDecoderLayerBase):
    """Decoder layer; with ``context=True`` its cross-attention is MSC's fused Eq. 13."""

    def __init__(self, cfg, no_encoder_attn: bool, opts: DeepTransformerOptions, context: bool = False):
        self._opts = opts
        self._context = context and not no_encoder_attn
        super().__init__(cfg, no_encoder_attn)
        self.residual_weight = build_residual_weight(opts, cfg, "decoder", 2 if no_encoder_attn else 3,
                                                     cfg.decoder.embed_dim)

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
        cross = self.encoder_attn is not None and encoder_out is not None
        if branch_scales is not None:
            branch_scales = [branch_scales[0]] + ([None] if cross else []) + [branch_scales[1]]
        # residual-weight slots: self-attention, cross-attention (rows of a layer built with it), FFN
        slots = (0, 1, 2) if cross else ((0, 2) if self.encoder_attn is not None else (0, 1))
        with self._branches(branch_scales, slots):
            return super().forward(
                x, encoder_out, encoder_padding_mask, incremental_state,
                prev_self_attn_state=prev_self_attn_state, prev_attn_state=prev_attn_state,
                self_attn_mask=self_attn_mask, self_attn_padding_mask=self_attn_padding_mask,
                need_attn=need_attn, need_head_weights=need_head_weights,
            )


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
    """fairseq's Transformer encoder whose layers may be permuted (GP), skipped (SSL,
    LayerDrop) and read a context state, and whose memory module decides what the
    decoder attends to (:meth:`build_memory`)."""

    def __init__(self, cfg, dictionary, embed_tokens):
        self.opts = DeepTransformerOptions.from_args(cfg)
        n_layers, n_dec = cfg.encoder.layers, cfg.decoder.layers
        if self.opts.gp_group_size > 1:
            check_group_size(n_layers, self.opts.gp_group_size, "--gp-group-size")
        # the layers are built inside fairseq's __init__ and must know whether they read a context
        memory_cls = memory_class(self.opts)
        memory_cls.check(self.opts, n_layers, n_dec)
        self._layers_read_context = memory_cls.encoder_layers_read_context(self.opts)
        super().__init__(cfg, dictionary, embed_tokens)
        self.memory = self.build_memory(cfg, embed_tokens.embedding_dim)
        self.init_skip(n_layers, self.opts.ssl_rate > 0)
        init_deepnorm(self, cfg, "encoder")

    def build_memory(self, cfg, embed_dim: int) -> EncoderMemory:
        """Extension point: the module that turns the layers' outputs into the decoder's memories."""
        return memory_class(self.opts).build(self.opts, cfg.encoder.layers, cfg.decoder.layers, embed_dim,
                                             cfg.encoder.ffn_embed_dim)

    def build_encoder_layer(self, cfg):
        return _wrap_layer(DeepEncoderLayer(cfg, self.opts, context=self._layers_read_context), cfg)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None,
                           return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None):
        """fairseq's encoder dict plus the per-decoder-layer memories.

        Copied from fairseq 0.12.3 ``fairseq/models/transformer/transformer_encoder.py``
        (``TransformerEncoderBase.forward_scriptable``, see :data:`ADAPTED_FROM`), with the
        layer loop changed: layer order (GP), branch scales (SSL), LayerDrop, memory module.
        """
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # T x B x C
        pad = padding_mask if has_pads else None
        final_norm = self.layer_norm if self.layer_norm is not None else _identity

        states: List[Tensor] = [x] if return_all_hiddens else []
        run = self.memory.start(x, padding_mask, pad, final_norm)
        order = layer_order(self.num_layers, self.opts.gp_group_size, self.training)
        scales = self.draw_branch_scales()
        dropped = _layerdrop_coins(self.encoder_layerdrop, self.num_layers, self.training)

        for pos, idx in enumerate(order):
            x, kwargs = run.layer_input(pos, x)
            if dropped[pos]:
                tie = graph_tie(self.layers[idx])
                if tie is not None:
                    x = x + tie
            else:
                if scales is not None:
                    kwargs["branch_scales"] = scales[2 * pos: 2 * pos + 2]
                x = self.layers[idx](x, encoder_padding_mask=pad, **kwargs)
            run.observe(pos, x)
            if return_all_hiddens:
                states.append(x)

        out = {
            "encoder_out": [final_norm(run.output(x))],
            "encoder_padding_mask": [padding_mask],
            "encoder_embedding": [encoder_embedding],
            "encoder_states": states,
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
        }
        memories = run.finish()
        if memories is not None:
            out[MEMORY_KEY], out[MEMORY_MASK_KEY] = [memories[0]], [memories[1]]
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        reorder(encoder_out, out, new_order)
        return out

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints written before the memory modules: ``encoder.layer_mix.*`` and
        ``encoder.context_cell.*`` now live under ``encoder.memory.``."""
        upgrade_memory_keys(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)


def _identity(x: Tensor) -> Tensor:
    return x





class DeepTransformerDecoder(_SkipScheduleMixin, TransformerDecoderBase):
    """fairseq's Transformer decoder whose layer n attends to memory n, may drop its
    cross-attention (CAD), be permuted (GP) or skipped (SSL, LayerDrop)."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        self.opts = DeepTransformerOptions.from_args(cfg)
        n = cfg.decoder.layers
        self.cad_reading = str(self.opts.cad_reading)
        self.cad_probs = drop_probabilities(n, self.opts.cad_drop_depth, self.opts.cad_drop_ratio, self.cad_reading)
        self._no_cross = layers_without_cross_attention(self.cad_probs, self.cad_reading)
        if self.opts.gp_decoder_group_size > 1:
            check_group_size(n, self.opts.gp_decoder_group_size, "--gp-decoder-group-size")
        self._layers_read_context = memory_class(self.opts).decoder_layers_read_context(self.opts)
        self._built = 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.init_skip(n, self.opts.ssl_rate > 0 and self.opts.ssl_decoder)
        init_deepnorm(self, cfg, "decoder")

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        idx, self._built = self._built, self._built + 1
        no_attn = no_encoder_attn or (idx < len(self._no_cross) and self._no_cross[idx])
        layer = DeepDecoderLayer(cfg, no_attn, self.opts, context=self._layers_read_context)
        return _wrap_layer(layer, cfg)

    def buffered_future_mask(self, tensor):
        """The causal mask as bool (True = masked), the dtype of the padding mask that
        fairseq's attention passes to torch (a float mask beside a bool one makes torch
        warn "mismatched key_padding_mask and attn_mask" on every step)."""
        dim = tensor.size(0)
        mask = self._future_mask
        if mask.dtype != torch.bool or mask.device != tensor.device or mask.size(0) < dim:
            mask = torch.ones(dim, dim, dtype=torch.bool, device=tensor.device).triu(1)
            self._future_mask = mask
        return mask[:dim, :dim]

    def embed(self, prev_output_tokens, incremental_state=None) -> Tensor:
        """Token + position embedding of the decoder input, ``(T, B, d)``.

        Copied from fairseq 0.12.3 (the embedding part of
        ``TransformerDecoderBase.extract_features_scriptable``, see :data:`ADAPTED_FROM`).
        """
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

    def extract_features_scriptable(self, prev_output_tokens, encoder_out, incremental_state=None,
                                    full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                                    alignment_heads: Optional[int] = None):
        """fairseq's decoder features, each layer attending to its own memory.

        Copied from fairseq 0.12.3 ``fairseq/models/transformer/transformer_decoder.py``
        (``TransformerDecoderBase.extract_features_scriptable``, see :data:`ADAPTED_FROM`),
        with the layer loop changed: per-layer memories, layer order (GP), cross-attention
        drop (CAD), branch scales (SSL), LayerDrop.
        """
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

        memories, memory_mask = decoder_memories(encoder_out, self.num_layers)
        order = layer_order(self.num_layers, self.opts.gp_decoder_group_size, self.training)
        keep_cross = sample_keep(self.cad_probs, self.training, self.cad_reading)
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
        deep_base_architecture(args)
        model = super().build_model(args, task)
        if model.encoder.opts.admin:
            # Admin's profile happened (True) or is still to come on the first training batch
            model.register_buffer("admin_profiled", torch.tensor(False))
        return model

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        check_residual_scaling(cfg)
        return DeepTransformerEncoder(cfg, src_dict, embed_tokens)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "admin_profiled"
        if hasattr(self, "admin_profiled") and key not in state_dict:
            # weights of a model trained without the flag (e.g. --finetune-from-model): profile on
            # the first batch unless they carry Admin's profiled omegas
            state_dict[key] = torch.tensor(any(k.endswith("omega_init") for k in state_dict))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def profile_admin(self, src_tokens, src_lengths, prev_output_tokens) -> Dict[str, List[float]]:
        """Admin's profiling pass over one batch (:func:`.residual_weights.profile_admin`)."""
        return profile_admin(self, src_tokens, src_lengths, prev_output_tokens)

    def _profile_admin_once(self, src_tokens, src_lengths, prev_output_tokens) -> None:
        if self.training and hasattr(self, "admin_profiled") and not bool(self.admin_profiled):
            self.profile_admin(src_tokens, src_lengths, prev_output_tokens)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, extra_passes: Optional[Dict[str, Any]] = None):
        """fairseq's forward; with ``extra_passes`` the collapse-reducing passes (see
        :meth:`forward_passes`), so that a DDP wrapper sees them as one forward."""
        self._profile_admin_once(src_tokens, src_lengths, prev_output_tokens)
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
        self._profile_admin_once(src_tokens, src_lengths, prev_output_tokens)
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
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return DeepTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def deep_base_architecture(args):
    """Transformer base, pre-norm by default (Wang et al. 2019a, the papers' baseline);
    ``--post-norm`` (implied by ``--deepnorm`` / ``--admin``) switches both stacks to post-norm.
    The plugin's own options take their defaults from :class:`DeepTransformerOptions` (written
    once, there); the named architectures (:mod:`.architectures`) set theirs and call this."""
    set_option_defaults(args)
    set_defaults(args, encoder_normalize_before=not args.post_norm, decoder_normalize_before=not args.post_norm)
    if args.deep_memory == "msc" and getattr(args, "encoder_layers", None) is None:
        args.encoder_layers = encoder_layers_of(args.msc_block_layers, getattr(args, "decoder_layers", None) or 6)
    base_architecture(args)
