"""Collapse-reducing training losses (deep-decoder paper, Sec. 3.4), plain PyTorch.

* **DDR** (decoder dropout regularization): the decoder runs twice on the same
  encoder output, with independent dropout and cross-attention-drop coins, and
  J_DDR = 1/2 (KL(P1 || P2) + KL(P2 || P1)) per target token.
* **ALD** (anti-LM-degradation): gamma ~ U[0, p_ALD) per sentence; X+ has a
  fraction gamma of its tokens replaced by UNK, X- a fraction 1 - gamma;
  G(X, Y) = mean of the top decoder layer's output over the non-pad target
  positions, and

      J_ALD = -log( exp(cos(G, G+)/tau) / sum_{* in {+,-}} exp(cos(G, G*)/tau) ).

  Our reading of "replace ... in the ratio": exactly round(ratio * n) of the n
  replaceable tokens (never EOS, BOS or padding), chosen uniformly by one random
  ranking per sentence that both X+ and X- use, so the UNK positions of X+ are a
  subset of those of X- (X- has strictly less of the source).
* **L2** on encoder weights (MSC Table 2 row 6): lambda * sum ||W||^2 over the
  encoder's weight *matrices*; biases, LayerNorm parameters and the (shared)
  embeddings are excluded.  It is a loss term, separate from the optimizer's
  weight decay.
"""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def bidirectional_kl(lprobs1: Tensor, lprobs2: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Per-position 1/2 (KL(P1||P2) + KL(P2||P1)) from log-probabilities ``(..., V)``.

    Returns ``(...)`` (zero where ``mask`` is False).
    """
    lp1, lp2 = lprobs1.float(), lprobs2.float()
    kl = 0.5 * ((lp1.exp() - lp2.exp()) * (lp1 - lp2)).sum(-1)
    if mask is not None:
        kl = kl.masked_fill(~mask, 0.0)
    return kl


def masked_mean(features: Tensor, mask: Tensor) -> Tensor:
    """Average over time: features ``(B, T, C)``, mask ``(B, T)`` -> ``(B, C)``."""
    m = mask.unsqueeze(-1).to(features.dtype)
    return (features * m).sum(1) / m.sum(1).clamp(min=1.0)


def unk_corrupt(tokens: Tensor, ratios: Tuple[Tensor, ...], unk: int, replaceable: Tensor) -> Tuple[Tensor, ...]:
    """UNK-replace ``round(ratio * n)`` of the ``n`` replaceable tokens of each sentence.

    tokens, replaceable: ``(B, T)``; each ratio ``(B,)``.  One random ranking per
    sentence (torch's RNG) serves every ratio, so larger ratios replace supersets.
    """
    scores = torch.rand(tokens.shape, device=tokens.device)
    scores = scores.masked_fill(~replaceable, 2.0)  # never chosen
    rank = scores.argsort(dim=1).argsort(dim=1)  # 0 = first to be replaced
    n = replaceable.sum(1)
    out = []
    for r in ratios:
        k = torch.round(r.to(torch.float64) * n).to(n.dtype)
        pick = (rank < k.unsqueeze(1)) & replaceable
        out.append(tokens.masked_fill(pick, unk))
    return tuple(out)


def ald_loss(g: Tensor, g_pos: Tensor, g_neg: Tensor, tau: float) -> Tensor:
    """J_ALD per sentence ``(B,)`` from pooled representations ``(B, C)``."""
    s_pos = F.cosine_similarity(g.float(), g_pos.float(), dim=-1) / tau
    s_neg = F.cosine_similarity(g.float(), g_neg.float(), dim=-1) / tau
    return torch.logsumexp(torch.stack([s_pos, s_neg], -1), -1) - s_pos


def weight_matrices(module: torch.nn.Module, exclude: Iterable[torch.nn.Parameter] = ()) -> list:
    """The module's parameters with >= 2 dims (weight matrices), minus ``exclude``."""
    skip = {id(p) for p in exclude}
    return [p for p in module.parameters() if p.dim() >= 2 and id(p) not in skip]


def l2_penalty(params: Iterable[Tensor]) -> Tensor:
    total = None
    for p in params:
        term = p.float().pow(2).sum()
        total = term if total is None else total + term
    return total if total is not None else torch.zeros(())
