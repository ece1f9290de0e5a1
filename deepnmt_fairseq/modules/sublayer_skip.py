"""Skipping sub-layer (Li et al. 2021, Eq. 3-6) and the Table 4 baselines.

Sub-layers are numbered l = 1..2L over a stack of L layers (self-attention and
FFN of each layer).  In training the branch of sub-layer l is omitted with
probability

    p_l = l / (2L) * phi                                    (Eq. 5)

so that x_{l+1} = M * F(LN(x_l)) + x_l with M ~ Bernoulli(1 - p_l) (Eq. 3-4).  At
inference the branch is scaled by the survival rate (Eq. 6):

    x_{l+1} = (1 - p_l) * F(LN(x_l)) + x_l.

Coin granularity: one coin per sub-layer per forward pass (the whole batch
shares it), as the paper samples sub-networks ("each configuration of sub-layer
omission represents a sub-network").  The coins come from torch's global RNG,
which fairseq re-seeds on every update, so resuming and multi-GPU runs draw the
same coins.

``mode="layer"`` is *Stochastic Layers* (Pham et al. 2019): one coin per layer
for both its sub-layers, with p_l = l / L * p growing linearly with depth, and
the same inference rescaling.
"""

from __future__ import annotations

from typing import List, Optional

import torch

SKIP_MODES = ("sublayer", "layer")


SUBLAYER_KINDS = ("both", "attn", "ffn")


def skip_probabilities(num_layers: int, rate: float, mode: str = "sublayer", kinds: str = "both") -> List[float]:
    """Omission probability of each of the 2L sub-layers, in stack order.

    ``kinds`` restricts skipping to the attention (``"attn"``, Table 5 "Skip SAN") or
    FFN (``"ffn"``, "Skip FFN") sub-layers; the others get p = 0 and every sub-layer
    keeps its position l in the 2L numbering of Eq. 5.
    """
    if kinds not in SUBLAYER_KINDS:
        raise ValueError(f"unknown sub-layer kind {kinds!r}; choose one of {SUBLAYER_KINDS}")
    probs = _skip_probabilities(num_layers, rate, mode)
    if kinds == "attn":
        probs = [p if l % 2 == 0 else 0.0 for l, p in enumerate(probs)]
    elif kinds == "ffn":
        probs = [p if l % 2 == 1 else 0.0 for l, p in enumerate(probs)]
    return probs


def _skip_probabilities(num_layers: int, rate: float, mode: str) -> List[float]:
    if mode not in SKIP_MODES:
        raise ValueError(f"unknown skip mode {mode!r}; choose one of {SKIP_MODES}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"skip rate must be in [0, 1], got {rate}")
    if mode == "sublayer":
        return [l / (2 * num_layers) * rate for l in range(1, 2 * num_layers + 1)]
    per_layer = [l / num_layers * rate for l in range(1, num_layers + 1)]
    return [p for p in per_layer for _ in range(2)]


class SublayerSkip:
    """Draws the branch scales of a stack's 2L sub-layers for one forward pass."""

    def __init__(self, num_layers: int, rate: float, mode: str = "sublayer", kinds: str = "both"):
        self.num_layers = num_layers
        self.mode = mode
        self.probs = skip_probabilities(num_layers, rate, mode, kinds)
        self.active = True  # switched by the two-stage schedule

    def scales(self, training: bool, device=None) -> Optional[List[float]]:
        """2L branch multipliers: {0,1} in training, 1 - p_l at inference."""
        if not self.active or not any(self.probs):
            return None
        if not training:
            return [1.0 - p for p in self.probs]
        if self.mode == "sublayer":
            u = torch.rand(len(self.probs)).tolist()
        else:  # one coin for both sub-layers of a layer
            u = [v for v in torch.rand(self.num_layers).tolist() for _ in range(2)]
        return [1.0 if ui > p or p == 0.0 else 0.0 for ui, p in zip(u, self.probs)]


def scale_branch(x: torch.Tensor, scale: Optional[float]) -> torch.Tensor:
    """s * F(x) for one residual branch; s = 0 gives an exact zero (not NaN, even if the
    branch overflowed in fp16) that keeps the branch's parameters in the autograd graph,
    so DDP sees them used (their gradient is exactly zero)."""
    if scale is None or scale == 1.0:
        return x
    if scale == 0.0:
        return torch.nan_to_num(x * 0.0, nan=0.0, posinf=0.0, neginf=0.0)
    return x * scale


class BranchScales:
    """The multipliers of one layer call's residual branches, consumed in call order.

    A layer's residual hook is called once per sub-layer (self-attention, [cross-attention,]
    FFN); :meth:`next` returns the next multiplier (None = leave the branch alone).
    """

    def __init__(self, scales: List[Optional[float]]):
        self._scales = iter(scales)

    def next(self) -> Optional[float]:
        return next(self._scales)
