"""Self-attention with relative position representations (fairseq glue).

A ``MultiheadAttention`` (same projections, names and incremental-state layout:
``prev_key``/``prev_value`` of shape (B, H, S, d_h), so fairseq's beam reordering
works unchanged) whose forward adds the relative-position terms of
:mod:`deepnmt_fairseq.modules.relative_position`.  Used for encoder and decoder
self-attention when ``--rpr-max-relative-position k`` > 0.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import MultiheadAttention
from torch import Tensor

from ..modules.relative_position import RelativePositionEmbeddings, relative_buckets
from .context_attention import ContextFusionAttention, additive_mask


class RelativeMultiheadAttention(MultiheadAttention):
    def __init__(self, embed_dim: int, num_heads: int, max_relative_position: int,
                 relative_values: bool = False, **kwargs):
        kwargs["self_attention"] = True
        super().__init__(embed_dim, num_heads, **kwargs)
        self.relative = RelativePositionEmbeddings(self.head_dim, max_relative_position, relative_values)

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
        """query ``(T, B, C)``; self-attention only (key/value are ignored)."""
        tgt_len, bsz, embed_dim = query.size()
        heads, dh = self.num_heads, self.head_dim

        def split(x):  # (T, B, C) -> (B*H, T, d_h)
            return x.contiguous().view(-1, bsz * heads, dh).transpose(0, 1)

        q = split(self.q_proj(query) * self.scaling)
        k = split(self.k_proj(query))
        v = split(self.v_proj(query))
        offset = 0
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                prev_k = saved["prev_key"].view(bsz * heads, -1, dh)
                prev_v = saved["prev_value"].view(bsz * heads, -1, dh)
                offset = prev_k.size(1)
                k = torch.cat([prev_k, k], dim=1)
                v = torch.cat([prev_v, v], dim=1)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz, src_len=k.size(1), static_kv=False,
            )
            saved["prev_key"] = k.view(bsz, heads, -1, dh)
            saved["prev_value"] = v.view(bsz, heads, -1, dh)
            saved["prev_key_padding_mask"] = key_padding_mask
            incremental_state = self._set_input_buffer(incremental_state, saved)
        src_len = k.size(1)
        buckets = relative_buckets(tgt_len, src_len, self.relative.max_distance, offset, device=q.device)

        bias = self.relative.key_logits(q, buckets)  # (B*H, T, S)
        if attn_mask is not None:
            bias = bias + additive_mask(attn_mask, bias.dtype).unsqueeze(0)
        if key_padding_mask is not None:
            bias = bias.view(bsz, heads, tgt_len, src_len).masked_fill(
                key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf")
            ).view(bsz * heads, tgt_len, src_len)
        if not (need_weights or need_head_weights or before_softmax) and self.relative.values is None:
            # fused kernel; q is already scaled, so undo SDPA's own 1/sqrt(d_h)
            out = F.scaled_dot_product_attention(
                q.view(bsz, heads, tgt_len, dh), k.view(bsz, heads, src_len, dh), v.view(bsz, heads, src_len, dh),
                attn_mask=bias.view(bsz, heads, tgt_len, src_len),
                dropout_p=self.dropout_module.p if self.training else 0.0, scale=1.0,
            )
            out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
            return self.out_proj(out), None
        logits = torch.bmm(q, k.transpose(1, 2)) + bias
        if before_softmax:
            return logits, v
        probs = utils.softmax(logits, dim=-1).type_as(logits)
        dropped = self.dropout_module(probs)
        out = torch.bmm(dropped, v)
        if self.relative.values is not None:
            out = out + self.relative.value_term(dropped, buckets)
        out = self.out_proj(out.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim))
        weights = None
        if need_weights or need_head_weights:
            weights = probs.view(bsz, heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights



class RelativeContextFusionAttention(ContextFusionAttention):
    """MSC Eq. 12 whose ATTN_h is relative self-attention (ATTN_c over the context is not:
    the context states are per position, not a sequence the query reads relative to itself)."""

    def __init__(self, embed_dim: int, num_heads: int, max_relative_position: int,
                 relative_values: bool = False, **kwargs):
        if relative_values:
            raise ValueError("--rpr-values is not supported in MSC encoder layers (--deep-memory msc)")
        super().__init__(embed_dim, num_heads, **kwargs)
        self.relative = RelativePositionEmbeddings(self.head_dim, max_relative_position, False)

    def relative_logits(self, q_h: Tensor, src_len: int, offset: int) -> Tensor:
        bsz, heads, tgt_len, dh = q_h.shape
        buckets = relative_buckets(tgt_len, src_len, self.relative.max_distance, offset, device=q_h.device)
        return self.relative.key_logits(q_h.reshape(bsz * heads, tgt_len, dh), buckets).view(
            bsz, heads, tgt_len, src_len)
