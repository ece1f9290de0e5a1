"""What the decoder attends to: the memory interface of the deep encoder.

The encoder builds its memory module once (``DeepTransformerEncoder.build_memory``, the
extension point, in the style of fairseq's ``build_encoder_layer``).  On every forward
pass it opens a :class:`MemoryPass` and hands it each layer's input and output::

    run = memory.start(x0, padding_mask, layer_mask, final_norm)   # x0 = embeddings (T, B, d)
    for pos, layer in enumerate(layers_in_order):
        x, kwargs = run.layer_input(pos, x)                # e.g. MSC's context C^{n-1}
        x = layer(x, layer_mask, **kwargs)
        run.observe(pos, x)
    top = final_norm(run.output(x))                       # fairseq's encoder_out
    memories = run.finish()                               # None: attend to the top layer

``pos`` is the position in the stack (layer permutation, GP, permutes *which* layer runs
there, not the position).  ``finish`` returns ``None`` (every decoder layer reads the
top of the encoder, fairseq's own ``encoder_out``) or ``(memories, padding_mask)``: one
memory per decoder attention module stacked along dim 0, ``(M, T', B, d)``, and its
padding mask ``(B, T')``.  The encoder stores them in ``encoder_out`` under
:data:`MEMORY_KEY`/:data:`MEMORY_MASK_KEY`; :func:`reorder` reorders them for beam search
and :func:`decoder_memories` unpacks them for the decoder, which never reaches into the
encoder's internals.

A new method (e.g. DLCL) is one subclass of :class:`EncoderMemory` in this package and
one entry in ``deepnmt_fairseq.memories.MEMORIES``; no fairseq glue changes.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

MEMORY_KEY = "deepnmt_memory"
MEMORY_MASK_KEY = "deepnmt_memory_padding_mask"
#: the encoder-batch row (sentence) each memory row was copied from (:func:`reorder`)
MEMORY_ROWS_KEY = "deepnmt_memory_rows"

Memories = Optional[Tuple[Tensor, Tensor]]
Norm = Callable[[Tensor], Tensor]


class MemoryPass:
    """One forward pass of the encoder, seen by a memory module (per-call state lives here)."""

    def __init__(self, padding_mask: Tensor, layer_mask: Optional[Tensor], final_norm: Norm):
        self.padding_mask = padding_mask  # (B, T), True at padding
        self.layer_mask = layer_mask  # what the layers get: the padding mask, None without padding
        self.final_norm = final_norm  # the encoder's final LayerNorm (pre-norm) or identity

    def layer_input(self, pos: int, x: Tensor) -> Tuple[Tensor, Dict[str, Optional[Tensor]]]:
        """The input of the layer at position ``pos`` and extra keyword arguments for it."""
        return x, {}

    def observe(self, pos: int, x: Tensor) -> None:
        """The output ``(T, B, d)`` of the layer at position ``pos``."""

    def output(self, x: Tensor) -> Tensor:
        """The encoder's output before its final LayerNorm, given the last layer's ``x``
        (DLCL combines all layers here; everything else returns ``x``)."""
        return x

    def finish(self) -> Memories:
        """``(memories (M, T', B, d), padding mask (B, T'))``, or None for the top layer."""
        return None


class EncoderMemory(nn.Module):
    """Base class: observes the encoder's layers and returns the decoder's memories.

    Class-level facts the layers need *before* the memory is built (fairseq builds the
    layers inside ``TransformerEncoderBase.__init__``):

    * :meth:`encoder_layers_read_context` - encoder layers take a ``context`` argument;
    * :meth:`decoder_layers_read_context` - decoder cross-attention fuses a context state.
    """

    @classmethod
    def build(cls, opts, encoder_layers: int, decoder_layers: int, embed_dim: int, ffn_dim: int) -> "EncoderMemory":
        """The memory of an encoder of this shape, from the model options."""
        return cls()

    @classmethod
    def check(cls, opts, encoder_layers: int, decoder_layers: int) -> None:
        """Raise ``ValueError`` naming the flag for configurations the method cannot build."""

    def learned_weights(self) -> Optional[Dict[str, list]]:
        """The learned layer weights an analysis reads (rows as lists, eval mode: no dropout), or
        None for a memory without them."""
        return None

    @classmethod
    def encoder_layers_read_context(cls, opts) -> bool:
        return False

    @classmethod
    def decoder_layers_read_context(cls, opts) -> bool:
        return False

    def start(self, x0: Tensor, padding_mask: Tensor, layer_mask: Optional[Tensor], final_norm: Norm) -> MemoryPass:
        return MemoryPass(padding_mask, layer_mask, final_norm)


def reorder(encoder_out: Dict[str, List[Tensor]], out: Dict[str, List[Tensor]], new_order: Tensor) -> None:
    """Beam search: reorder the stacked memories (batch is dim 2) and their mask into ``out``.

    fairseq's ``SequenceGenerator`` reorders the encoder output at *every* step, with an
    order that moves beams only within their sentence, and the memories are M times (MSC:
    2M times) the size of fairseq's own ``encoder_out``.  Rows of one sentence hold the same
    memory, so :data:`MEMORY_ROWS_KEY` keeps each row's sentence (the row of the encoder's
    batch it was copied from): an order that leaves every row's sentence where it was
    selects rows equal to the ones already there, and the memories are passed on as they
    are instead of being copied (exact, not an approximation; a test compares it with the
    copy).  Any other order (the beam expansion, finished sentences removed) copies.
    """
    if len(encoder_out.get(MEMORY_KEY, [])) == 0:
        return
    memory, mask = encoder_out[MEMORY_KEY][0], encoder_out[MEMORY_MASK_KEY][0]
    known = encoder_out.get(MEMORY_ROWS_KEY, [])
    rows = known[0] if len(known) > 0 else torch.arange(memory.size(2), device=new_order.device)
    new_rows = rows.index_select(0, new_order)
    if new_rows.shape == rows.shape and torch.equal(new_rows, rows):
        out[MEMORY_KEY], out[MEMORY_MASK_KEY] = [memory], [mask]
    else:
        out[MEMORY_KEY] = [memory.index_select(2, new_order)]
        out[MEMORY_MASK_KEY] = [mask.index_select(0, new_order)]
    out[MEMORY_ROWS_KEY] = [new_rows]


def decoder_memories(encoder_out: Optional[Dict[str, List[Tensor]]], num_layers: int):
    """(memory ``(T', B, d)`` or None per decoder layer, padding mask ``(B, T')`` or None)."""
    if encoder_out is None or len(encoder_out.get("encoder_out", [])) == 0:
        return [None] * num_layers, None
    if len(encoder_out.get(MEMORY_KEY, [])) > 0:
        stacked = encoder_out[MEMORY_KEY][0]
        if stacked.size(0) != num_layers:
            raise ValueError(f"encoder produced {stacked.size(0)} memories for {num_layers} decoder layers")
        return list(stacked.unbind(0)), encoder_out[MEMORY_MASK_KEY][0]
    mask = encoder_out["encoder_padding_mask"][0] if len(encoder_out["encoder_padding_mask"]) else None
    return [encoder_out["encoder_out"][0]] * num_layers, mask


#: parameter names of the memories before they became modules of their own
_LEGACY_PREFIXES = ("layer_mix.", "context_cell.")


def upgrade_memory_keys(state_dict: Dict[str, Tensor], encoder_name: str = "encoder") -> Dict[str, Tensor]:
    """Rename ``<encoder>.layer_mix.*`` / ``<encoder>.context_cell.*`` of older checkpoints to
    ``<encoder>.memory.…`` in place (fairseq calls this through ``upgrade_state_dict_named``;
    tools reading a checkpoint's raw weights call it directly)."""
    prefix = f"{encoder_name}." if encoder_name else ""
    for key in [k for k in state_dict if k.startswith(tuple(prefix + p for p in _LEGACY_PREFIXES))]:
        state_dict[prefix + "memory." + key[len(prefix):]] = state_dict.pop(key)
    return state_dict
