"""MSC fused attention: ATTN_h and ATTN_c combined by the gate (Wei et al. 2020).

:class:`ContextFusionAttention` *is* fairseq's ``MultiheadAttention`` (its own
projections are ATTN_h, so parameter names and caches stay those of a plain
layer) plus a second attention ATTN_c over the context state C and a
:class:`~deepnmt_fairseq.modules.gated_fusion.GatedFusion`.  It replaces

* the encoder self-attention (Eq. 12): ATTN_h(H, H, H) fused with
  ATTN_c(H, C^{n-1}, C^{n-1}).  C^{n-1} is handed over by the encoder layer for
  the duration of one call (:meth:`set_context`);
* the decoder cross-attention (Eq. 13): ATTN_h(O_d, B_e^n, B_e^n) fused with
  ATTN_c(O_d, C^n, C^n).  The encoder stores the decoder layer's memory as the
  time-concatenation [B_e^n; C^n] (and the padding mask twice), so fairseq's
  decoder layer passes both through its normal ``encoder_out`` argument and the
  static key/value cache of each attention is filled once per sentence.

Normalisation (pre-norm reading, chosen to reproduce Table 2's parameter counts,
see docs/parameter-counts.md): the context is layer-normalised before ATTN_c in
every layer (``context_norm``); in the encoder ATTN_c also has its own query
LayerNorm (``context_query_norm``) and the gate pre-activation is normalised.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import LayerNorm, MultiheadAttention
from torch import Tensor

from ..modules.gated_fusion import GatedFusion


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

    def set_context(self, context: Optional[Tensor], padding_mask: Optional[Tensor]) -> None:
        """Encoder use: C^{n-1} ``(T, B, d)`` and its padding mask for the next call."""
        self._context = None if context is None else (context, padding_mask)

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
        if self.self_attention:
            if self._context is None:
                raise RuntimeError("ContextFusionAttention: the encoder layer did not set C^{n-1}")
            context, context_mask = self._context
            block_key, block_mask = key, key_padding_mask
        elif key is None:  # cached static keys/values (incremental decoding)
            block_key = context = block_mask = context_mask = None
        else:  # memory = [B_e^n ; C^n] along time
            block_key, context = key.chunk(2, dim=0)
            block_mask = context_mask = None
            if key_padding_mask is not None:
                block_mask, context_mask = key_padding_mask.chunk(2, dim=1)
        a_h, weights = super().forward(
            query,
            block_key,
            block_key,
            key_padding_mask=block_mask,
            incremental_state=incremental_state,
            need_weights=need_weights,
            static_kv=static_kv,
            attn_mask=attn_mask,
            need_head_weights=need_head_weights,
        )
        q_c = query if self.context_query_norm is None else self.context_query_norm(query)
        c = None if context is None else self.context_norm(context)
        a_c, ctx_weights = self.context_attn(
            q_c,
            c,
            c,
            key_padding_mask=context_mask,
            incremental_state=incremental_state,
            need_weights=self.record_context_attn,
            static_kv=static_kv,
        )
        if self.record_context_attn:
            self.last_context_attn = ctx_weights
        return self.fusion(a_h, a_c), weights
