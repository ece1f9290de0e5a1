"""Multiscale collaboration, MSC (Wei et al. 2020): blocks, context state, memories.

Everything MSC decides about the *data flow* lives here; the two mechanisms it uses
are plain modules (:mod:`~deepnmt_fairseq.modules.context_cell`, Eq. 9, and
:mod:`~deepnmt_fairseq.modules.gated_fusion`, Eq. 12-13) and the fused attention that
reads the context state is :mod:`~deepnmt_fairseq.models.context_attention`.

* **Blocks** (Eq. 5-6).  The N_e encoder layers form N blocks, N = the decoder depth,
  of M_n layers each (``--msc-block-layers``: one M for every block or a list
  M_1,...,M_N).  B_e^n is the output of block n, passed through the encoder's final
  LayerNorm in pre-norm models (our reading: the decoder attends to normalised keys).
* **Context state** (Eq. 9).  C^0 is the embedded source; after block n,
  C^n = Q(C^{n-1}, B_e^n) with Q a GRU cell shared by all blocks (or the Table 5
  ablations: an FFN, or no context at all with ``--msc-context-cell none``).
* **Encoder layers** (Eq. 10-12).  Every layer of block n attends to C^{n-1} besides
  itself: :meth:`_MSCPass.layer_input` hands C^{n-1} to the layer
  (``--msc-no-encoder-context``: the Table 5 "remove CXT-ENC attention" ablation).
* **Decoder** (Eq. 7, 13).  Decoder layer n attends to block n and to C^n: its memory
  is the time concatenation [B_e^n ; C^n] ``(2T, B, d)`` with the padding mask
  repeated, which the decoder's fused cross-attention splits again
  (``ContextFusionAttention``, ``key.chunk(2)``).  Without context, memory n = B_e^n.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..modules.context_cell import ContextCell
from .base import EncoderMemory, Memories, MemoryPass, Norm


def parse_block_layers(spec) -> Optional[List[int]]:
    """``--msc-block-layers`` as a list of ints (None when not given)."""
    if spec in (None, ""):
        return None
    try:
        sizes = [int(s) for s in str(spec).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--msc-block-layers must be integers, got {spec!r}") from None
    if not sizes:
        return None
    if any(s < 1 for s in sizes):
        raise ValueError(f"--msc-block-layers: every block needs >= 1 layer, got {spec!r}")
    return sizes


def encoder_layers_of(spec, decoder_layers: int) -> Optional[int]:
    """The encoder depth ``--msc-block-layers`` implies (one M repeats over the N blocks)."""
    sizes = parse_block_layers(spec)
    if sizes is None:
        return None
    return sum(sizes) if len(sizes) > 1 else sizes[0] * decoder_layers


def block_sizes(spec, encoder_layers: Optional[int], num_blocks: int) -> List[int]:
    """Layers per encoder block, validated against the layer counts (Eq. 5-7)."""
    sizes = parse_block_layers(spec)
    if sizes is None:
        if not encoder_layers or encoder_layers % num_blocks != 0:
            raise ValueError(
                f"--deep-memory msc: --encoder-layers ({encoder_layers}) must be a multiple "
                f"of the number of blocks (= --decoder-layers = {num_blocks}), or give "
                f"--msc-block-layers"
            )
        return [encoder_layers // num_blocks] * num_blocks
    if len(sizes) == 1:
        sizes = sizes * num_blocks
    if len(sizes) != num_blocks:
        raise ValueError(
            f"--msc-block-layers lists {len(sizes)} blocks but --decoder-layers is "
            f"{num_blocks}: MSC decoder layer n attends to encoder block n (Eq. 7)"
        )
    if encoder_layers is not None and encoder_layers != sum(sizes):
        raise ValueError(
            f"--encoder-layers ({encoder_layers}) does not match --msc-block-layers "
            f"{spec!r} (sum {sum(sizes)})"
        )
    return sizes


def has_context(opts) -> bool:
    """Contextual collaboration (Eq. 9-13) is on unless ``--msc-context-cell none``."""
    return opts.deep_memory == "msc" and opts.msc_context_cell != "none"


class _MSCPass(MemoryPass):
    def __init__(self, memory: "MSCMemory", x0: Tensor, *args):
        super().__init__(*args)
        self.memory = memory
        self.context: Optional[Tensor] = x0 if memory.context_cell is not None else None  # C^0
        self.blocks: List[Tensor] = []

    def layer_input(self, pos: int, x: Tensor) -> Tuple[Tensor, Dict[str, Optional[Tensor]]]:
        if not self.memory.layers_read_context:
            return x, {}
        return x, {"context": self.context, "context_padding_mask": self.layer_mask}  # C^{n-1}

    def observe(self, pos: int, x: Tensor) -> None:
        if pos not in self.memory.block_ends:
            return
        block = self.final_norm(x)  # B_e^n
        if self.memory.context_cell is None:
            self.blocks.append(block)
            return
        self.context = self.memory.context_cell(self.context, block)  # C^n (Eq. 9)
        self.blocks.append(torch.cat([block, self.context], dim=0))  # [B_e^n ; C^n]

    def finish(self) -> Memories:
        mask = self.padding_mask
        if self.memory.context_cell is not None:
            mask = torch.cat([mask, mask], dim=1)
        return torch.stack(self.blocks), mask


class MSCMemory(EncoderMemory):
    """``--deep-memory msc``: memory n = [B_e^n ; C^n] for decoder layer n."""

    def __init__(self, blocks: Sequence[int], context_cell: Optional[ContextCell], layers_read_context: bool):
        super().__init__()
        self.blocks = list(blocks)
        self.block_ends = frozenset(end - 1 for end in accumulate(self.blocks))  # last position of each block
        self.context_cell = context_cell
        self.layers_read_context = layers_read_context

    @classmethod
    def check(cls, opts, encoder_layers: int, decoder_layers: int) -> None:
        blocks = block_sizes(opts.msc_block_layers, encoder_layers, decoder_layers)
        h = opts.gp_group_size
        if h > 1 and any(m % h for m in blocks):
            raise ValueError(
                f"--gp-group-size {h} must divide every MSC block "
                f"({opts.msc_block_layers or blocks}): a permutation may not "
                f"move a layer to another block, whose context state differs"
            )
        if opts.gp_decoder_group_size > 1:
            raise ValueError(
                "--gp-decoder-group-size cannot be combined with --deep-memory msc: decoder "
                "layer n is tied to encoder block n (block-scale collaboration, Eq. 7)"
            )

    @classmethod
    def encoder_layers_read_context(cls, opts) -> bool:
        return has_context(opts) and not opts.msc_no_encoder_context

    @classmethod
    def decoder_layers_read_context(cls, opts) -> bool:
        return has_context(opts)

    @classmethod
    def build(cls, opts, encoder_layers: int, decoder_layers: int, embed_dim: int, ffn_dim: int):
        cell = ContextCell(embed_dim, opts.msc_context_cell, ffn_dim) if has_context(opts) else None
        return cls(block_sizes(opts.msc_block_layers, encoder_layers, decoder_layers), cell,
                   cls.encoder_layers_read_context(opts))

    def start(self, x0: Tensor, padding_mask: Tensor, layer_mask: Optional[Tensor], final_norm: Norm) -> MemoryPass:
        return _MSCPass(self, x0, padding_mask, layer_mask, final_norm)
