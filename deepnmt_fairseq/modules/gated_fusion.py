"""MSC feature fusion of two attention results (Wei et al. 2020, Eq. 12-13).

    g = sigma(W_1 a_h + W_2 a_c + b)
    fused = g * a_h + (1 - g) * a_c

a_h is the block attention (self-attention in the encoder, attention over the
encoder block in the decoder), a_c the attention over the context state C.  The
residual is added by the surrounding layer.  ``mode="add"`` is the Table 5
ablation (plain element-wise addition).

``normalize=True`` puts a LayerNorm on the gate pre-activation.  The paper does
not have it (Eq. 12-13 are the plain gate above, the default).  It is one of the
two LayerNorms of ``--msc-count-fitting-norms`` (encoder layers only), the reading
that reproduces Table 2's parameter counts to 0.1M (rows 3-6 need ~1.3k-6k
parameters per encoder layer beyond ATTN_c and the gate, see
``docs/parameter-counts.md``); a normalised pre-activation also keeps the gate
out of saturation when attention outputs grow along a deep pre-norm stack.
"""

from __future__ import annotations

import torch
import torch.nn as nn

FUSION_MODES = ("gate", "add")


class GatedFusion(nn.Module):
    def __init__(self, dim: int, mode: str = "gate", normalize: bool = False):
        super().__init__()
        if mode not in FUSION_MODES:
            raise ValueError(f"unknown fusion {mode!r}; choose one of {FUSION_MODES}")
        self.mode = mode
        if mode == "gate":
            self.w1 = nn.Linear(dim, dim, bias=True)  # carries the bias b
            self.w2 = nn.Linear(dim, dim, bias=False)
            self.norm = nn.LayerNorm(dim) if normalize else None
        # statistics for diagnostics (mean and std of the gate values of the last forward);
        # the std matters for normalised gates, whose mean stays near sigmoid(LN bias)
        self.last_gate_mean: float | None = None
        self.last_gate_std: float | None = None
        self.record_gate = False

    def gate(self, a_h: torch.Tensor, a_c: torch.Tensor) -> torch.Tensor:
        z = self.w1(a_h) + self.w2(a_c)
        if self.norm is not None:
            z = self.norm(z)
        return torch.sigmoid(z)

    def forward(self, a_h: torch.Tensor, a_c: torch.Tensor) -> torch.Tensor:
        """a_h, a_c: ``(T, B, d)`` -> fused ``(T, B, d)``."""
        if self.mode == "add":
            return a_h + a_c
        g = self.gate(a_h, a_c)
        if self.record_gate:
            gf = g.detach().float()
            self.last_gate_mean, self.last_gate_std = float(gf.mean()), float(gf.std())
        # g*a_h + (1-g)*a_c, with one multiplication fewer
        return torch.addcmul(a_c, g, a_h - a_c)
