"""Relative position representations (Shaw et al. 2018), as GPKD uses them.

Self-attention logits get a term for the clipped relative distance j - i:

    e_ij = q_i . (k_j + a^K_{clip(j - i, k)}) / sqrt(d_h)
    z_i  = sum_j alpha_ij (v_j + a^V_{clip(j - i, k)})       (values optional)

with 2k + 1 learned vectors of the head size per layer, shared by all heads
(Shaw et al., Sec. 3), alongside the absolute sinusoidal positions.  Both terms
are computed through the 2k + 1 buckets, never through a (T, S, d_h) tensor:
q . a^K is one (T x d_h) @ (d_h x (2k+1)) product gathered by bucket, and the
value term scatters the attention probabilities into buckets first.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor


def relative_buckets(q_len: int, k_len: int, max_distance: int, q_offset: int = 0, device=None) -> Tensor:
    """``(q_len, k_len)`` bucket of clip(j - i) + k, with query i at position q_offset + i."""
    q = torch.arange(q_offset, q_offset + q_len, device=device).unsqueeze(1)
    k = torch.arange(k_len, device=device).unsqueeze(0)
    return (k - q).clamp(-max_distance, max_distance) + max_distance


class RelativePositionEmbeddings(nn.Module):
    def __init__(self, head_dim: int, max_distance: int, values: bool = False):
        super().__init__()
        if max_distance < 1:
            raise ValueError(f"relative positions need a clipping distance k >= 1, got {max_distance}")
        self.max_distance = max_distance
        self.keys = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim))
        self.values = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim)) if values else None
        nn.init.normal_(self.keys, std=head_dim ** -0.5)
        if self.values is not None:
            nn.init.normal_(self.values, std=head_dim ** -0.5)

    def key_logits(self, q: Tensor, buckets: Tensor) -> Tensor:
        """q ``(N, T, d_h)`` (already scaled), buckets ``(T, S)`` -> ``(N, T, S)``."""
        per_bucket = torch.matmul(q, self.keys.to(q.dtype).t())  # (N, T, 2k+1)
        return per_bucket.gather(2, buckets.unsqueeze(0).expand(q.size(0), -1, -1))

    def value_term(self, probs: Tensor, buckets: Tensor) -> Tensor:
        """probs ``(N, T, S)`` -> ``(N, T, d_h)``: sum_j alpha_ij a^V_{bucket(i, j)}."""
        n, t, _ = probs.shape
        mass = probs.new_zeros(n, t, self.keys.size(0))
        mass.scatter_add_(2, buckets.unsqueeze(0).expand(n, -1, -1), probs)
        return torch.matmul(mass, self.values.to(probs.dtype))
