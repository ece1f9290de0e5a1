"""Multi-head additive attention (RNMT+, Chen et al. 2018, Sec. 4.1).

Chen et al.: "Multi-head additive attention is used instead of the single-head
attention in the GNMT model."  Each of the K heads is Bahdanau et al.'s (2015)
additive attention on its d/K slice of projected keys and query:

    e_{k,t} = v_k . tanh(Ks_{k,t} + Qq_k),    alpha_k = softmax_t(e_k)  (padding masked)
    ctx     = concat_k sum_t alpha_{k,t} s_{k,t}

Where the paper is silent we follow the authors' implementation (lingvo
``MultiHeadedAttention`` with ``AdditiveAttention`` inside, as set up by
``base_config.SetupRNMTParams``): the source vectors themselves are the values
(``use_source_vec_as_attention_value``, no value or output projection), keys and
query are projected (``enable_query_proj``), and dropout is applied to the
attention probabilities ("Attention dropout is also applied").  The key
projection depends only on the encoder output, so the decoder computes it once
per sentence (:meth:`project_keys`) and caches it for incremental decoding.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .layer_norm_lstm import DEFAULT_INIT_RANGE


class MultiHeadAdditiveAttention(nn.Module):
    def __init__(self, query_dim: int, source_dim: int, num_heads: int, dropout: float = 0.0,
                 init_range: float = DEFAULT_INIT_RANGE):
        super().__init__()
        if num_heads < 1 or source_dim % num_heads:
            raise ValueError(f"--attention-heads ({num_heads}) must divide the encoder output width "
                             f"({source_dim})")
        self.num_heads, self.head_dim, self.dropout = num_heads, source_dim // num_heads, dropout
        self.key_proj = nn.Linear(source_dim, source_dim, bias=False)
        self.query_proj = nn.Linear(query_dim, source_dim, bias=True)
        self.v = nn.Parameter(torch.empty(num_heads, self.head_dim))
        for w in (self.key_proj.weight, self.query_proj.weight, self.v):
            nn.init.uniform_(w, -init_range, init_range)
        nn.init.zeros_(self.query_proj.bias)

    def project_keys(self, source: Tensor) -> Tensor:
        """``(T, B, d)`` -> projected keys ``(T, B, d)``."""
        return self.key_proj(source)

    def forward(self, query: Tensor, keys: Tensor, values: Tensor,
                padding_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """query ``(B, dq)``, keys/values ``(T, B, d)``, padding_mask ``(B, T)`` (True = pad).

        Returns the context ``(B, d)`` and the probabilities ``(B, heads, T)``.
        """
        t, b, _ = keys.shape
        h, dh = self.num_heads, self.head_dim
        q = self.query_proj(query).view(1, b, h, dh)
        scores = (torch.tanh(keys.view(t, b, h, dh) + q) * self.v).sum(-1)  # (T, B, H)
        if padding_mask is not None:
            scores = scores.masked_fill(padding_mask.t().unsqueeze(-1), float("-inf"))
        probs = torch.softmax(scores.float(), dim=0).to(scores.dtype)
        probs = F.dropout(probs, p=self.dropout, training=self.training)
        ctx = (probs.unsqueeze(-1) * values.view(t, b, h, dh)).sum(0)  # (B, H, dh)
        return ctx.reshape(b, h * dh), probs.permute(1, 2, 0)
