"""Up-weighted residuals for deep *post-norm* Transformers: DeepNorm and Admin.

Both keep the post-norm sub-layer x_{i} = LN(x_{i-1} + f_i(x_{i-1})) and put a weight on the
shortcut, so that no single sub-layer's update dominates the sum as the stack gets deep:

* **DeepNorm** (Wang et al. 2022, *DeepNet: Scaling Transformers to 1,000 Layers*,
  arXiv 2203.00555, Sec. 3, Fig. 2):  x_{l+1} = LN(alpha * x_l + G_l(x_l)), with a constant alpha
  per stack, and the sub-layers' FFN, value and output projections Xavier-initialised with gain
  beta (query and key projections with gain 1).  The encoder-decoder constants (the paper's
  table of constants, Sec. 3 "Architecture"; N encoder and M decoder layers) are

      encoder: alpha = 0.81 (N^4 M)^(1/16),   beta = 0.87 (N^4 M)^(-1/16)
      decoder: alpha = (3M)^(1/4),            beta = (12M)^(-1/4)

  and, for a single stack of N layers (encoder-only or decoder-only), alpha = (2N)^(1/4),
  beta = (8N)^(-1/4).  For N = M = 6: encoder alpha 1.42, beta 0.50; decoder 2.06, 0.34.

  *Where the released code differs* (microsoft/torchscale, ``architecture/encoder.py`` /
  ``decoder.py``): it does not re-initialise with gain beta but divides the already initialised
  fc1/fc2/out_proj/v_proj weights by a scale, and the encoder-decoder encoder's scale is
  (N^4 M)^(1/16) / 1.15, a factor 1.15 (N^4 M)^(-1/16) where the paper has 0.87 (N^4 M)^(-1/16)
  (torchscale issue #16).  We follow the paper (Xavier normal with gain beta, 0.87).

* **Admin** (Liu et al. 2020, *Understanding the Difficulty of Training Transformers*, EMNLP
  2020, arXiv 2004.08249, Sec. 5):  x_i = LN(x_{i-1} * omega_i + f_i(x_{i-1})), with omega_i set
  at initialisation from a profiling pass so that

      omega_i^2 = sum_{j<i} Var[f_j(x_{j-1})]

  (the output variances of the earlier sub-layers of the same stack).  *Our reading* is the
  authors' released code (LiyuanLucasLiu/Transformer-Clinic, ``init_type adaptive-profiling``):
  the sum runs over the stack's own sub-layers (encoder and decoder profiled separately), the
  embedding counts as the first term, and it is computed as the forward pass goes:

      omega_1 = 1,   omega_{i+1}^2 = Var[omega_i * x_{i-1}] + Var[f_i(x_{i-1})]

  (x_{i-1} is a LayerNorm output, so Var[omega_i x_{i-1}] ~ omega_i^2 and the recursion is the
  paper's sum).  Variances are over every element of the batch's (T, B, d) tensors, as there.
  omega is a learnable vector of size d per sub-layer, initialised to the profiled scalar, as in
  the released code (``nn.Parameter(torch.ones(embed_dim)).fill_(ratio)``; stored here as a
  profiled buffer plus a learnable offset, see :class:`AdminResidual`).  Where we differ: the profile is measured without dropout (the model in eval mode, no
  structural randomness), so it consumes no random numbers; the released code profiles a
  training forward pass, whose dropout inflates Var[f] by about 1/(1-p).  Used at 60L-12L by Liu
  et al. 2020, *Very Deep Transformers for Neural Machine Translation*, arXiv 2008.07772.

Plain PyTorch; the fairseq glue is the residual hook of ``models/deep_transformer.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, List, Optional

import torch
import torch.nn as nn
from torch import Tensor

#: names of the linear maps DeepNorm initialises with gain beta / gain 1 (Wang et al. 2022, Fig. 2)
DEEPNORM_BETA_LINEARS = ("fc1", "fc2", "v_proj", "out_proj")
DEEPNORM_UNIT_LINEARS = ("q_proj", "k_proj")


@dataclass(frozen=True)
class DeepNormConstants:
    """alpha (residual weight) and beta (init gain) of each stack."""

    encoder_alpha: float
    encoder_beta: float
    decoder_alpha: float
    decoder_beta: float

    def __str__(self) -> str:
        return (f"encoder alpha={self.encoder_alpha:.4f} beta={self.encoder_beta:.4f}, "
                f"decoder alpha={self.decoder_alpha:.4f} beta={self.decoder_beta:.4f}")


def deepnorm_constants(encoder_layers: int, decoder_layers: int) -> DeepNormConstants:
    """The paper's constants for N encoder and M decoder layers (Wang et al. 2022, Sec. 3).

    A stack of depth 0 is absent: the other one gets the single-stack constants
    alpha = (2N)^(1/4), beta = (8N)^(-1/4).
    """
    n, m = int(encoder_layers), int(decoder_layers)
    if n < 0 or m < 0 or n + m == 0:
        raise ValueError(f"DeepNorm needs at least one layer (encoder {n}, decoder {m})")
    if m == 0 or n == 0:
        depth = n or m
        alpha, beta = (2 * depth) ** 0.25, (8 * depth) ** -0.25
        return DeepNormConstants(alpha, beta, alpha, beta)
    depth = (n ** 4 * m) ** (1 / 16)
    return DeepNormConstants(0.81 * depth, 0.87 / depth, (3 * m) ** 0.25, (12 * m) ** -0.25)


def parse_deepnorm_override(text: str, flag: str = "--deepnorm-alpha-beta") -> DeepNormConstants:
    """``"a_enc,b_enc,a_dec,b_dec"`` -> constants, with an error that names the flag."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 4 or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{flag} takes four positive numbers 'enc_alpha,enc_beta,dec_alpha,dec_beta', got {text!r}")
    return DeepNormConstants(*values)


def deepnorm_init_(module: nn.Module, beta: float) -> int:
    """Re-initialise the linear maps of ``module``'s sub-layers as DeepNorm prescribes
    (Wang et al. 2022, Fig. 2: ``xavier_normal_(w, gain=beta)`` for the FFN, value and output
    projections, ``gain=1`` for query and key).  Biases are left as they are.  Returns the number
    of weight matrices re-initialised (0 means the layer has none of these names: a bug).

    By name, so a layer's other linear maps keep their initialisation: with MSC (our reading, the
    DeepNet paper is silent on it) both attentions of the fused attention, ATTN_h and ATTN_c
    (``context_attn``), are β-scaled like a plain attention, and the gate's ``w1``/``w2`` keep
    torch's default init: the gate selects between the two outputs rather than adding a value to the
    residual sum (docs/mechanisms.md, "DeepNorm with MSC")."""
    count = 0
    for name, child in module.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if not isinstance(child, nn.Linear):
            continue
        if leaf in DEEPNORM_BETA_LINEARS:
            nn.init.xavier_normal_(child.weight, gain=beta)
            count += 1
        elif leaf in DEEPNORM_UNIT_LINEARS:
            nn.init.xavier_normal_(child.weight, gain=1.0)
            count += 1
    return count


class ResidualWeight(nn.Module):
    """The shortcut weight of one layer's sub-layers: ``residual * w[slot] + branch``.

    ``slot`` numbers the layer's sub-layers (encoder: 0 self-attention, 1 FFN; decoder:
    0 self-attention, 1 cross-attention, 2 FFN).
    """

    def forward(self, residual: Tensor, branch: Tensor, slot: int) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class DeepNormResidual(ResidualWeight):
    """x_{l+1} = LN(alpha * x_l + G_l(x_l)): a constant, no parameter."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, residual: Tensor, branch: Tensor, slot: int) -> Tensor:
        return residual * self.alpha + branch

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4f}"


class AdminProfile:
    """The running omega of one stack during Admin's profiling pass.

    ``reduce(values, device)`` averages a list of floats over data-parallel workers (so every
    worker sets the same omega); None on a single process.
    """

    def __init__(self, reduce=None):
        self.ratio = 1.0  # omega_1 = 1 (the embedding's term)
        self.reduce = reduce
        self.omegas: List[float] = []  # the values set, in sub-layer order (for logs and tests)

    def step(self, scaled_residual: Tensor, branch: Tensor) -> None:
        """omega_{i+1}^2 = Var[omega_i x_{i-1}] + Var[f_i(x_{i-1})]."""
        variances = [scaled_residual.detach().float().var(unbiased=False).item(),
                     branch.detach().float().var(unbiased=False).item()]
        if self.reduce is not None:
            variances = self.reduce(variances, branch.device)
        self.ratio = math.sqrt(sum(variances))


class AdminResidual(ResidualWeight):
    """x_i = LN(x_{i-1} * omega_i + f_i(x_{i-1})), omega_i a learnable vector (Liu et al. 2020).

    omega = ``omega_init[slot] + omega_delta[slot]``: the profiled value is a *buffer* (1 until
    the profiling pass, :class:`AdminProfile`, sets it) and the learnable part a parameter that
    starts at 0.  Under Adam this trains exactly as the released code's ``nn.Parameter`` filled
    with the profiled value (same gradient, same update), and it keeps the profile out of the
    optimizer's state: with ``--fp16`` / ``--bf16`` fairseq's optimizer holds an fp32 copy of every
    parameter, made before the first batch, which a profile written into a parameter would
    never reach.  Shapes: ``omega_init (slots,)``, ``omega_delta (slots, d)``.
    """

    def __init__(self, slots: int, dim: int):
        super().__init__()
        self.register_buffer("omega_init", torch.ones(slots))
        self.omega_delta = nn.Parameter(torch.zeros(slots, dim))
        self.profile: Optional[AdminProfile] = None  # set only during the profiling pass

    def omega(self, slot: int) -> Tensor:
        return self.omega_init[slot] + self.omega_delta[slot]

    def forward(self, residual: Tensor, branch: Tensor, slot: int) -> Tensor:
        if self.profile is not None:
            with torch.no_grad():
                self.omega_init[slot] = self.profile.ratio
            self.profile.omegas.append(self.profile.ratio)
            scaled = residual * self.omega(slot)
            self.profile.step(scaled, branch)
            return scaled + branch
        return residual * self.omega(slot) + branch


def admin_residuals(stack: nn.Module) -> Iterable[AdminResidual]:
    """Every :class:`AdminResidual` of a stack, in layer order."""
    return [m for m in stack.modules() if isinstance(m, AdminResidual)]
