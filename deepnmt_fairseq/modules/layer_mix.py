"""Transparent attention weights (Bapna et al. 2018, Eq. 1-2).

A learned (N+1) x M matrix W (N encoder layers plus the embedding layer, M
attention modules = decoder layers).  Dropout is applied to W during training
(Eq. 1), then a softmax over the N+1 inputs gives s_{i,j}; attention module j
attends to z^j = sum_i s_{i,j} h^i (Eq. 2).

Initialisation is not given in the paper: we start from W = 0, i.e. a uniform
average of all layers, which gives every encoder layer the same direct gradient
path at step 0 (and makes the dropout on W a no-op until W moves).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerMix(nn.Module):
    def __init__(self, num_inputs: int, num_outputs: int, dropout: float = 0.0):
        super().__init__()
        if num_inputs < 2:
            raise ValueError(
                "transparent attention needs at least one encoder layer besides the "
                f"embeddings (got {num_inputs - 1} encoder layers)"
            )
        if num_outputs < 1:
            raise ValueError("transparent attention needs at least one decoder layer")
        self.weight = nn.Parameter(torch.zeros(num_inputs, num_outputs))
        self.dropout = dropout

    def mixing_weights(self) -> torch.Tensor:
        """s: ``(N+1, M)``, columns sum to one (Eq. 1)."""
        w = F.dropout(self.weight, p=self.dropout, training=self.training)
        return torch.softmax(w.float(), dim=0).to(self.weight.dtype)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """states ``(N+1, T, B, d)`` -> mixes ``(M, T, B, d)`` (Eq. 2)."""
        s = self.mixing_weights().to(states.dtype)
        n, t, b, d = states.shape
        mixed = torch.mm(s.t(), states.reshape(n, t * b * d))
        return mixed.view(-1, t, b, d)
