"""MSC contextual collaboration cell Q(C^{n-1}, B_e^n) (Wei et al. 2020, Eq. 9).

C^0 is the embedded source, and after encoder block n the context state is
updated position-wise: C^n = Q(C^{n-1}, B_e^n).  Q is one GRU cell shared by all
blocks (hidden state C^{n-1}, input B_e^n), applied to the T*B rows at once, so
there is no Python loop over time.  The Table 5 ablation replaces Q by an FFN;
the paper gives no formula for it, we use Q(c, x) = W_2 ReLU(W_1 [c; x] + b_1) + b_2
with the layer's FFN width (our reading).
"""

from __future__ import annotations

import torch
import torch.nn as nn

CONTEXT_CELLS = ("gru", "ffn")


class ContextCell(nn.Module):
    """Position-wise context update of MSC Eq. 9.

    Args:
        dim: model width d.
        kind: ``"gru"`` (the paper) or ``"ffn"`` (Table 5 ablation).
        ffn_dim: hidden width of the FFN variant.
    """

    def __init__(self, dim: int, kind: str = "gru", ffn_dim: int | None = None):
        super().__init__()
        if kind not in CONTEXT_CELLS:
            raise ValueError(f"unknown context cell {kind!r}; choose one of {CONTEXT_CELLS}")
        self.kind = kind
        if kind == "gru":
            self.cell = nn.GRUCell(dim, dim)
        else:
            hidden = ffn_dim or 2 * dim
            self.cell = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def forward(self, context: torch.Tensor, block_out: torch.Tensor) -> torch.Tensor:
        """context C^{n-1}, block_out B_e^n: ``(T, B, d)`` -> C^n ``(T, B, d)``."""
        shape = context.shape
        c = context.reshape(-1, shape[-1])
        x = block_out.reshape(-1, shape[-1])
        if self.kind == "gru":
            out = self.cell(x, c)
        else:
            out = self.cell(torch.cat([c, x], dim=-1))
        return out.view(shape)
