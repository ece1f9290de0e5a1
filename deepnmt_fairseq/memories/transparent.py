"""Transparent attention (Bapna et al. 2018, Eq. 1-2) as an encoder memory.

Decoder attention module j attends to

    z^j = sum_{i=0..N} s_{i,j} h^i,      s_{:,j} = softmax(W_{:,j})            (Eq. 1-2)

where h^0 is the embedding layer and h^1..h^N the encoder layer outputs; W is learned
(:class:`~deepnmt_fairseq.modules.layer_mix.LayerMix`, dropout on W in training).

Our reading for pre-norm stacks (the paper's models are post-norm, where every h^i is
already normalised): the encoder's final LayerNorm is applied to the mix z^j, since
the raw pre-norm layer outputs grow with depth and the decoder expects normalised keys.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from ..modules.layer_mix import LayerMix
from .base import EncoderMemory, Memories, MemoryPass, Norm


#: the name of W in a model's state dict (the encoder's memory module owns it)
WEIGHT_KEY = "encoder.memory.layer_mix.weight"


class _TransparentPass(MemoryPass):
    def __init__(self, mix: LayerMix, x0: Tensor, *args):
        super().__init__(*args)
        self.mix = mix
        self.states: List[Tensor] = [x0]  # h^0 .. h^N

    def observe(self, pos: int, x: Tensor) -> None:
        self.states.append(x)

    def finish(self) -> Memories:
        return self.final_norm(self.mix(torch.stack(self.states))), self.padding_mask


class TransparentMemory(EncoderMemory):
    """``--deep-memory transparent``: one learned mix of all layers per decoder layer."""

    def __init__(self, encoder_layers: int, decoder_layers: int, dropout: float):
        super().__init__()
        self.layer_mix = LayerMix(encoder_layers + 1, decoder_layers, dropout)

    @classmethod
    def check(cls, opts, encoder_layers: int, decoder_layers: int) -> None:
        if encoder_layers < 1:
            raise ValueError("--deep-memory transparent needs --encoder-layers >= 1")

    @classmethod
    def build(cls, opts, encoder_layers: int, decoder_layers: int, embed_dim: int, ffn_dim: int):
        return cls(encoder_layers, decoder_layers, opts.transparent_dropout)

    def start(self, x0: Tensor, padding_mask: Tensor, layer_mask: Optional[Tensor], final_norm: Norm) -> MemoryPass:
        return _TransparentPass(self.layer_mix, x0, padding_mask, layer_mask, final_norm)

    def learned_weights(self):
        """s of Eq. 1 without dropout: one row per decoder layer, over the embeddings and the N layers."""
        with torch.no_grad():
            s = torch.softmax(self.layer_mix.weight.float(), dim=0)
        return {"transparent_s": [[round(float(v), 4) for v in row] for row in s.t()]}
