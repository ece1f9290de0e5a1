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

**The literal reading, as an option (``--cad-reading literal``).**  For users who
reproduce the letter of Sec. 3.3: "we adopted a same fixed p_net for layers
1 <= l <= L_dr (i.e. p_net^l = p_net, 1 <= l <= L_dr), while set p_net^l = 1.0 for
layers l > L_dr", and "During the inference stage, both attentions are used":

    p^l = p_net  for 1 <= l <= L_dr,      p^l = 1.0  for l > L_dr,

every layer is built with its cross-attention, training drops layer l's with
probability p^l (so layers above L_dr never use it in training), and inference
uses every layer's cross-attention, whatever p^l was.  A layer with p^l = 1 thus
meets its (untrained, randomly initialised) cross-attention for the first time at
inference - which is what the words say.  A configuration in which every layer
has p^l = 1 is refused: no cross-attention would ever be trained.  Under the
letter that is L_dr = 0 and also p_net = 1.0 at *any* drop depth (p^l = 1 below
L_dr and above it), so the literal reading cannot run Fig. 2's p_net = 1.0 line
at all - one more sign that the consistent reading is what the authors ran.  The default reading is ``consistent`` (above).

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

#: ``--cad-reading`` values: the default reading (consistent with Sec. 4.3) and the letter of Sec. 3.3
READINGS = ("consistent", "literal")


def _check_reading(reading: str) -> None:
    if reading not in READINGS:
        raise ValueError(f"--cad-reading must be one of {', '.join(READINGS)}, got {reading!r}")


def drop_probabilities(num_layers: int, drop_depth: int, drop_ratio: float,
                       reading: str = "consistent") -> List[float]:
    """p^l for decoder layers l = 1..L: above L_dr 0 (``consistent``, our reading) or 1.0
    (``literal``, Sec. 3.3's words); see the module docstring."""
    _check_reading(reading)
    if not 0 <= drop_depth <= num_layers:
        raise ValueError(
            f"--cad-drop-depth must be between 0 and the decoder depth {num_layers}, got {drop_depth}"
        )
    if not 0.0 <= drop_ratio <= 1.0:
        raise ValueError(f"--cad-drop-ratio must be in [0, 1], got {drop_ratio}")
    above = 1.0 if reading == "literal" else 0.0
    probs = [drop_ratio if l <= drop_depth else above for l in range(1, num_layers + 1)]
    if reading == "literal" and num_layers > 0 and all(p >= 1.0 for p in probs):
        raise ValueError(
            f"--cad-reading literal with --cad-drop-depth {drop_depth} and --cad-drop-ratio {drop_ratio:g} on "
            f"{num_layers} decoder layers drops every layer's cross-attention in every update (p^l = 1.0 above the "
            "drop depth): none would ever be trained. Give a drop depth >= 1 and a ratio < 1")
    return probs


def layers_without_cross_attention(probs: List[float], reading: str = "consistent") -> List[bool]:
    """Layers built without cross-attention: under ``consistent`` those with p^l = 1 (never
    trained, not used at inference); under ``literal`` none ("During the inference stage, both
    attentions are used")."""
    _check_reading(reading)
    if reading == "literal":
        return [False] * len(probs)
    return [p >= 1.0 for p in probs]


def sample_keep(probs: List[float], training: bool, reading: str = "consistent") -> List[bool]:
    """Whether each layer uses its cross-attention in this forward pass (training: a coin
    U^l ~ U[0, 1] per layer, dropped when U^l < p^l; inference: every layer that has one)."""
    _check_reading(reading)
    if not training:
        return [True] * len(probs) if reading == "literal" else [p < 1.0 for p in probs]
    if not any(0.0 < p < 1.0 for p in probs):
        return [p < 1.0 for p in probs]
    u = torch.rand(len(probs)).tolist()
    return [ui >= p for ui, p in zip(u, probs)]
