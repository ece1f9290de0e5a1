"""Dynamic linear combination of layers, DLCL (Wang et al. 2019a), pre-norm form.

"Learning Deep Transformer Models for Machine Translation" (ACL 2019), Sec. 3.2: the
input of layer l+1 is a learned linear combination of the outputs of *all* earlier
layers instead of the previous one alone,

    x_{l+1} = G(y_0, ..., y_l) = sum_{k=0}^{l} W^{(l+1)}_k LN_k(y_k)

where y_0 is the embedding layer and y_k (k >= 1) the output of layer k.  In the
pre-norm form every earlier output is normalised by its own LayerNorm before it is
combined (the embedding is not: it is not a residual stream, cf. the authors'
``LearnableDenseLayerHistory``), and the top of the encoder is the combination
G(y_0, ..., y_L), passed through the encoder's final LayerNorm as in any pre-norm
stack.  W is lower-triangular, (L+1) x (L+1), initialised to the uniform average of
what each row may see (row l: 1/(l+1)), i.e. DLCL starts as a dense average; it is
learned freely (no softmax), as in the paper.

It is an aggregation of the encoder's layers, so it lives behind the same hook as the
other memories: :meth:`_DLCLPass.layer_input` builds each layer's input and
:meth:`_DLCLPass.output` the encoder's output; the decoder attends to that top output
(``finish`` returns None), so incremental decoding and beam search are the plain
Transformer's.  Encoder side only: the MSC comparison (Wei et al. 2020, Sec. 4.2)
deepens the encoder, and the decoder stays a 6-layer pre-norm stack.

Parameters: (L+1)^2 weights (the upper triangle is never read) and L LayerNorms
(2d each): +~30k for a 30-layer base encoder, next to the 137M of Wang et al.'s
30-layer base model (MSC Table 4, GPKD Table 1).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from .base import EncoderMemory, MemoryPass


class _DLCLPass(MemoryPass):
    def __init__(self, memory: "DLCLMemory", x0: Tensor, *args):
        super().__init__(*args)
        self.memory = memory
        self.history: List[Tensor] = [x0]  # y_0, LN_1(y_1), ..., LN_l(y_l)

    def _combine(self) -> Tensor:
        n = len(self.history)
        w = self.memory.weight[n - 1, :n].to(self.history[0].dtype)
        return torch.tensordot(w, torch.stack(self.history), dims=1)

    def layer_input(self, pos: int, x: Tensor) -> Tuple[Tensor, Dict[str, Optional[Tensor]]]:
        return self._combine(), {}  # x_{pos+1} = G(y_0, ..., y_pos)

    def observe(self, pos: int, x: Tensor) -> None:
        self.history.append(self.memory.layer_norms[pos](x))

    def output(self, x: Tensor) -> Tensor:
        return self._combine()  # G(y_0, ..., y_L)


class DLCLMemory(EncoderMemory):
    """``--deep-memory dlcl``: every encoder layer reads a learned mix of all layers below it."""

    def __init__(self, num_layers: int, dim: int):
        super().__init__()
        w = torch.ones(num_layers + 1, num_layers + 1).tril()
        self.weight = nn.Parameter(w / w.sum(1, keepdim=True))
        self.layer_norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(num_layers))

    def learned_weights(self):
        """W of the module docstring's equation (lower triangle): row l weights y_0 .. y_l for layer
        l+1's input; the last row makes the encoder's output."""
        return {"dlcl_w": [[round(float(v), 4) for v in row[: i + 1]] for i, row in enumerate(self.weight.detach())]}

    @classmethod
    def check(cls, opts, encoder_layers: int, decoder_layers: int) -> None:
        if encoder_layers < 1:
            raise ValueError("--deep-memory dlcl needs --encoder-layers >= 1")
        if getattr(opts, "post_norm", False):
            raise ValueError(
                "--deep-memory dlcl is implemented in its pre-norm form (Wang et al. 2019a, Sec. 3.2, "
                "the form the MSC and GPKD papers compare against); drop --post-norm")

    @classmethod
    def build(cls, opts, encoder_layers: int, decoder_layers: int, embed_dim: int, ffn_dim: int):
        return cls(encoder_layers, embed_dim)

    def start(self, x0: Tensor, padding_mask: Tensor, layer_mask: Optional[Tensor], final_norm) -> MemoryPass:
        return _DLCLPass(self, x0, padding_mask, layer_mask, final_norm)
