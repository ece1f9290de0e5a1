"""MSC fused attention: ATTN_h and ATTN_c combined by the gate (Wei et al. 2020).

:class:`ContextFusionAttention` *is* fairseq's ``MultiheadAttention`` (its own
projections are ATTN_h, so parameter names stay those of a plain layer) plus a
second attention ATTN_c over the context state C (``context_attn``, whose
projections it uses) and a :class:`~deepnmt_fairseq.modules.gated_fusion.GatedFusion`.
It replaces

* the encoder self-attention (Eq. 12): ATTN_h(H, H, H) fused with
  ATTN_c(H, C^{n-1}, C^{n-1}).  C^{n-1} is handed over by the encoder layer for
  the duration of one call (:meth:`set_context`);
* the decoder cross-attention (Eq. 13): ATTN_h(O_d, B_e^n, B_e^n) fused with
  ATTN_c(O_d, C^n, C^n).  The encoder stores the decoder layer's memory as the
  time-concatenation [B_e^n; C^n] (and the padding mask twice), so fairseq's
  decoder layer passes both through its normal ``encoder_out`` argument.

Speed: both attentions read keys of the same length (C has one state per
source position), so they run as **one** scaled-dot-product attention with 2H
heads (H for ATTN_h, H for ATTN_c).  In incremental decoding the keys and
values of both (and the normalised context) are computed once per sentence and
cached together in this module's static buffer (shape (B, 2H, S, d_h), the
layout fairseq's beam reordering expects).

Normalisation.  The context is layer-normalised before ATTN_c in every layer
(``context_norm``; pre-norm reading of Eq. 1: attention inputs are normalised, and
C^n, a GRU output or the scaled embeddings, is not).  ATTN_c's query is the
layer's normalised input LN(H), the one ATTN_h reads, and the gate is Eq. 12 as
written, g = sigmoid(W1 ATTN_h + W2 ATTN_c + b).  ``--msc-count-fitting-norms``
(encoder layers only) adds a query LayerNorm of ATTN_c's own
(``context_query_norm``) and a LayerNorm on the gate pre-activation
(``fusion.norm``): not in the paper, they reproduce Table 2's parameter counts to
0.1M (docs/parameter-counts.md).  A checkpoint that carries their weights loads
into a model built without the flag: :meth:`_load_from_state_dict` adds the two
norms first (single process; in a distributed run it stops with an error naming
the flag, because parameters added after the DDP wrapper would not be synchronised).
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules import LayerNorm, MultiheadAttention
from torch import Tensor

from ..modules.gated_fusion import GatedFusion

logger = logging.getLogger(__name__)

#: the option that builds the count-fitting norms, named in errors
COUNT_FITTING_FLAG = "--msc-count-fitting-norms"


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """An attention mask as additive logits: a bool mask (True = masked) becomes -inf/0."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


class ContextFusionAttention(MultiheadAttention):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        fusion: str = "gate",
        context_query_norm: bool = False,
        gate_norm: bool = False,
        **mha_kwargs,
    ):
        super().__init__(embed_dim, num_heads, **mha_kwargs)
        self.context_attn = MultiheadAttention(
            embed_dim,
            num_heads,
            dropout=mha_kwargs.get("dropout", 0.0),
            encoder_decoder_attention=True,
            q_noise=mha_kwargs.get("q_noise", 0.0),
            qn_block_size=mha_kwargs.get("qn_block_size", 8),
        )
        self.context_norm = LayerNorm(embed_dim)
        self.context_query_norm = LayerNorm(embed_dim) if context_query_norm else None
        self.fusion = GatedFusion(embed_dim, fusion, normalize=gate_norm)
        self._context: Optional[Tuple[Tensor, Optional[Tensor]]] = None
        self.record_context_attn = False
        self.last_context_attn: Optional[Tensor] = None

    # ------------------------------------------------------------------ checkpoints
    def add_count_fitting_norms(self) -> None:
        """Add the ``--msc-count-fitting-norms`` LayerNorms (on this module's device and dtype)."""
        like = self.q_proj.weight
        if self.context_query_norm is None:
            self.context_query_norm = LayerNorm(self.embed_dim).to(device=like.device, dtype=like.dtype)
        if self.fusion.mode == "gate" and self.fusion.norm is None:
            self.fusion.norm = nn.LayerNorm(self.embed_dim).to(device=like.device, dtype=like.dtype)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """The checkpoint's weights decide whether the count-fitting norms exist (see module doc)."""
        has_norms = prefix + "context_query_norm.weight" in state_dict
        own = prefix + "q_proj.weight" in state_dict  # this module's weights are in the checkpoint
        if has_norms and self.context_query_norm is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized() \
                    and torch.distributed.get_world_size() > 1:
                raise ValueError(
                    f"{prefix}context_query_norm.* in the checkpoint: it was trained with the MSC "
                    f"count-fitting LayerNorms; resume it with {COUNT_FITTING_FLAG}"
                )
            if not ContextFusionAttention._upgrade_logged:
                logger.warning("the checkpoint's MSC encoder layers carry the count-fitting LayerNorms "
                               "(ATTN_c query, gate): loading them as if %s were given", COUNT_FITTING_FLAG)
                ContextFusionAttention._upgrade_logged = True
            self.add_count_fitting_norms()
        elif own and strict and self.context_query_norm is not None and not has_norms:
            raise ValueError(
                f"{prefix}: the model has the MSC count-fitting LayerNorms ({COUNT_FITTING_FLAG}) but the "
                f"checkpoint was trained without them (literal Eq. 12); load it without {COUNT_FITTING_FLAG}"
            )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    _upgrade_logged = False

    def set_context(self, context: Optional[Tensor], padding_mask: Optional[Tensor]) -> None:
        """Encoder use: C^{n-1} ``(T, B, d)`` and its padding mask for the next call."""
        self._context = None if context is None else (context, padding_mask)

    # ------------------------------------------------------------------ pieces
    def _heads(self, x: Tensor) -> Tensor:
        """(L, B, d) -> (B, H, L, d_h)"""
        L, B, _ = x.shape
        return x.view(L, B, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _keys_values(self, block: Tensor, context: Tensor):
        """(B, 2H, S, d_h) keys and values of [ATTN_h ; ATTN_c]."""
        c = self.context_norm(context)
        ctx = self.context_attn
        k = torch.cat([self._heads(self.k_proj(block)), self._heads(ctx.k_proj(c))], dim=1)
        v = torch.cat([self._heads(self.v_proj(block)), self._heads(ctx.v_proj(c))], dim=1)
        return k, v

    def relative_logits(self, q_h: Tensor, src_len: int, offset: int) -> Optional[Tensor]:
        """Extra logits of ATTN_h (B, H, T, S); relative positions override this."""
        return None

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """query ``(T, B, d)`` -> (fused ``(T, B, d)``, ATTN_h weights or None)."""
        tgt_len, bsz, _ = query.shape
        heads = self.num_heads
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        if saved is not None and "prev_key" in saved:  # static keys/values cached for this sentence
            k, v = saved["prev_key"], saved["prev_value"]
            mask = saved.get("prev_key_padding_mask")
        else:
            if self.self_attention:
                if self._context is None:
                    raise RuntimeError("ContextFusionAttention: the encoder layer did not set C^{n-1}")
                block, (context, _) = query, self._context
                mask = key_padding_mask
            else:  # memory = [B_e^n ; C^n] along time
                block, context = key.chunk(2, dim=0)
                mask = key_padding_mask.chunk(2, dim=1)[0] if key_padding_mask is not None else None
            k, v = self._keys_values(block, context)
            if saved is not None:
                saved["prev_key"], saved["prev_value"] = k, v
                saved["prev_key_padding_mask"] = mask
                self._set_input_buffer(incremental_state, saved)
        src_len = k.size(2)
        q_c_in = query if self.context_query_norm is None else self.context_query_norm(query)
        q_h = self._heads(self.q_proj(query))
        q = torch.cat([q_h, self._heads(self.context_attn.q_proj(q_c_in))], dim=1)  # (B, 2H, T, d_h)

        bias = None  # additive (B or 1, 2H or 1, T or 1, S)
        if mask is not None:
            bias = additive_mask(mask.bool(), q.dtype).view(bsz, 1, 1, src_len)
        if attn_mask is not None:
            causal = additive_mask(attn_mask, q.dtype)
            bias = causal if bias is None else bias + causal
        rel = self.relative_logits(q_h * self.scaling, src_len, src_len - tgt_len)
        if rel is not None:
            rel = torch.cat([rel, rel.new_zeros(rel.shape)], dim=1)
            bias = rel if bias is None else bias + rel

        dropout = self.dropout_module.p if self.training else 0.0
        want_weights = need_weights or need_head_weights or self.record_context_attn
        if want_weights:  # explicit softmax: the weights are needed (alignment, analysis)
            logits = torch.matmul(q * self.scaling, k.transpose(-1, -2))
            if bias is not None:
                logits = logits + bias
            probs = torch.softmax(logits.float(), dim=-1).to(q.dtype)
            out = torch.matmul(self.dropout_module(probs), v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, 2, -1)  # (T, B, 2, d)
        a_h = self.out_proj(out[:, :, 0])
        a_c = self.context_attn.out_proj(out[:, :, 1])
        weights = None
        if want_weights:
            if self.record_context_attn:
                self.last_context_attn = probs[:, heads:].mean(dim=1).detach()
            if need_weights or need_head_weights:
                weights = probs[:, :heads].transpose(0, 1)  # (H, B, T, S)
                if not need_head_weights:
                    weights = weights.mean(dim=0)
        return self.fusion(a_h, a_c), weights
