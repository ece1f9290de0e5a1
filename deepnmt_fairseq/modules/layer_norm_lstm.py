"""LSTM cell with per-gate layer normalization (RNMT+, Chen et al. 2018, Sec. 4.1).

Chen et al.: "Inspired by the Transformer model, per-gate layer normalization is
applied within each LSTM cell. [...] No non-linearity is applied to the LSTM
output."  PyTorch's fused ``nn.LSTM``/``nn.LSTMCell`` have no hook for a
normalisation between the matrix products and the gate non-linearities, so the
cell is written here; ``benchmarks/speed.py`` measures what it costs.

One step, with gates a = W [x; h] (4 blocks of H units in ``nn.LSTM``'s order:
input i, forget f, candidate g, output o):

    a_k   = LN_k(a_k)                         (one LayerNorm per gate, own gain/bias)
    c'    = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h'    = sigmoid(o) * c'                   (no output non-linearity, Chen et al.)
    h'    = sigmoid(o) * tanh(c')             (``output_tanh=True``: the classic LSTM)

Where the paper is silent we follow the authors' released implementation
(lingvo ``rnn_cell.LayerNormalizedLSTMCellSimple`` as used by
``base_config.SetupRNMTParams``): the LayerNorm is applied to each gate's
pre-activation (the sum of the input and recurrent products), the cell state is
not normalised, ``output_nonlinearity=False`` is the reading of "no
non-linearity is applied to the LSTM output", and weights are drawn from
U(-0.04, 0.04).  With LayerNorm the gate bias is the LayerNorm's bias (the
matrix product has none); without it (``layer_norm=False``, the benchmark's
"LayerNorm off") the product carries the usual bias.  Gains start at 1 and
biases at 0 (no forget-gate bias; lingvo's default ``forget_gate_bias=0``).

The input product W_x x of a whole sequence is one matrix multiplication
(:meth:`input_projection`); :meth:`step` then adds the recurrent product for one
time step.  :meth:`run` loops over time with a padding mask: at padded
positions the state is carried unchanged and the output is zero, so a sentence
gets the same states alone and inside a padded batch, whichever side the
padding is on and whichever direction the cell runs.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

#: U(-r, r) initialisation of the authors' implementation (lingvo ``WeightInit.Uniform(0.04)``)
DEFAULT_INIT_RANGE = 0.04


class LayerNormLSTMCell(nn.Module):
    """One LSTM cell; ``layer_norm=True`` normalises each of the four gates separately."""

    def __init__(self, input_size: int, hidden_size: int, layer_norm: bool = True, output_tanh: bool = False,
                 init_range: float = DEFAULT_INIT_RANGE, eps: float = 1e-5):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.layer_norm, self.output_tanh, self.eps = layer_norm, output_tanh, eps
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        if layer_norm:
            self.ln_weight = nn.Parameter(torch.ones(4, hidden_size))
            self.ln_bias = nn.Parameter(torch.zeros(4, hidden_size))
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(torch.zeros(4 * hidden_size))
            self.register_parameter("ln_weight", None)
            self.register_parameter("ln_bias", None)
        nn.init.uniform_(self.weight_ih, -init_range, init_range)
        nn.init.uniform_(self.weight_hh, -init_range, init_range)

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, layer_norm={self.layer_norm}, "
                f"output_tanh={self.output_tanh}")

    def input_projection(self, x: Tensor) -> Tensor:
        """W_x x (+ bias without LayerNorm) for any leading shape: ``(..., input)`` -> ``(..., 4H)``."""
        return F.linear(x, self.weight_ih, self.bias)

    def step(self, xw: Tensor, state: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor]:
        """One time step from the input product ``xw (B, 4H)`` and the state ``(h, c)``, each ``(B, H)``."""
        h, c = state
        gates = xw + F.linear(h, self.weight_hh)
        b, hid = h.size(0), self.hidden_size
        if self.layer_norm:
            g = F.layer_norm(gates.view(b, 4, hid), (hid,), eps=self.eps)
            gates = (g * self.ln_weight + self.ln_bias).view(b, 4 * hid)
        i, f, cand, o = gates.chunk(4, dim=1)  # torch's nn.LSTM order
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cand)
        out = torch.tanh(c_new) if self.output_tanh else c_new
        return torch.sigmoid(o) * out, c_new

    def forward(self, x: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
        """``nn.LSTMCell``-style single step: x ``(B, input)`` -> ``(h, c)``."""
        if state is None:
            z = x.new_zeros(x.size(0), self.hidden_size)
            state = (z, z)
        return self.step(self.input_projection(x), state)

    def run(self, xw: Tensor, mask: Optional[Tensor] = None, reverse: bool = False,
            state: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """The cell over a sequence of input products ``xw (T, B, 4H)``.

        ``mask (T, B)`` is True at real tokens (None: no padding); ``reverse`` runs
        from the last position to the first.  Returns the outputs ``(T, B, H)`` (zero
        at padding) and the final state.
        """
        steps, bsz = xw.size(0), xw.size(1)
        if state is None:
            z = xw.new_zeros(bsz, self.hidden_size)
            state = (z, z)
        h, c = state
        outs = [xw.new_empty(0)] * steps
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        for t in order:
            h_new, c_new = self.step(xw[t], (h, c))
            if mask is not None:
                m = mask[t].unsqueeze(-1)
                h, c = torch.where(m, h_new, h), torch.where(m, c_new, c)
                outs[t] = h_new * m.to(h_new.dtype)
            else:
                h, c = h_new, c_new
                outs[t] = h_new
        return torch.stack(outs, 0), (h, c)
