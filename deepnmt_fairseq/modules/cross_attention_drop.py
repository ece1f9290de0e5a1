"""Cross-attention drop, CAD (deep-decoder paper, Sec. 3.3).

For decoder layer l with drop-net rate p^l, a coin U^l ~ U[0, 1] decides whether
the layer uses only self-attention (cross-attention branch skipped, the residual
passes through) or both attentions.  Inference uses both attentions.

**The paper's ambiguity.**  Sec. 3.3 sets p^l = p_net for 1 <= l <= L_dr and
p^l = 1.0 for l > L_dr, i.e. the layers *above* the drop depth would never see
the source.  But Sec. 4.3 says that a larger drop depth means *more* dropping
(too small a drop depth collapses, too large hurts because "insufficient
cross-attention" remains).  With p^l = 1.0 above L_dr a larger L_dr would mean
*less* dropping.  The two statements only agree if layers above L_dr keep their
cross-attention always (p^l = 0).  We adopt that reading:

    p^l = p_net  for 1 <= l <= L_dr,      p^l = 0  for l > L_dr.

**p_net = 1.0 at inference (a documented reading).**  The paper: "For layer l,
with probability p_net^l, only self-attention is used; with probability
(1 - p_net^l), both of the two attentions are used.  During the inference stage,
both attentions are used" (Sec. 3.3), and Sec. 4.3 compares drop ratios up to
"p_net = 1.0".  At p_net = 1 a layer's cross-attention would never take part in
training, so it would keep its random initialisation; using it only at
inference would add random projections of the source to a decoder trained
without them.  We therefore build layers 1..L_dr without cross-attention (no
parameters) at p_net = 1.0, and they have none at inference either - against
the letter of "both attentions are used", which we read as meant for trained
cross-attentions (p_net < 1).  With 0 < p_net < 1 inference uses the
cross-attention, as the paper says.  The registry's rows at ratio 1.0 (Fig. 2)
say so in their notes, and ``deepnmt-repro table`` marks ``p_net 1†``.

Coin granularity: one coin per layer per forward pass (per batch).  Skipping a
sub-layer for the whole batch saves its computation, which matters for 27-layer
decoders; a per-sentence coin would have to compute the attention for every
sentence and mask it, at full cost.  The coins come from torch's global RNG
(fairseq re-seeds it on every update), are drawn only in training, and the
criterion's second decoder pass (DDR) draws its own.
"""

from __future__ import annotations

from typing import List

import torch


def drop_probabilities(num_layers: int, drop_depth: int, drop_ratio: float) -> List[float]:
    """p^l for decoder layers l = 1..L (our reading, see module docstring)."""
    if not 0 <= drop_depth <= num_layers:
        raise ValueError(
            f"--cad-drop-depth must be between 0 and the decoder depth {num_layers}, got {drop_depth}"
        )
    if not 0.0 <= drop_ratio <= 1.0:
        raise ValueError(f"--cad-drop-ratio must be in [0, 1], got {drop_ratio}")
    return [drop_ratio if l <= drop_depth else 0.0 for l in range(1, num_layers + 1)]


def layers_without_cross_attention(probs: List[float]) -> List[bool]:
    """Layers with p^l = 1 never use cross-attention and are built without it."""
    return [p >= 1.0 for p in probs]


def sample_keep(probs: List[float], training: bool) -> List[bool]:
    """Whether each layer uses its cross-attention in this forward pass."""
    if not training:
        return [p < 1.0 for p in probs]
    if not any(0.0 < p < 1.0 for p in probs):
        return [p < 1.0 for p in probs]
    u = torch.rand(len(probs)).tolist()
    return [ui >= p for ui, p in zip(u, probs)]
