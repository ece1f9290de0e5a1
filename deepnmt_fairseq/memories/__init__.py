"""Encoder memories: how the encoder's layers are combined, and what each decoder attention
module attends to; one module per method.

``--deep-memory`` picks one of :data:`MEMORIES`; the encoder builds it with its
``build_memory`` hook.  See :mod:`.base` for the interface: a memory's per-pass object both
builds each encoder layer's *input* (``layer_input``) and returns the decoder's memories
(``finish``).  Two of them change the decoder's memories (transparent, MSC); DLCL changes the
encoder's layer inputs instead (each layer reads a learned combination of all layers below it)
and leaves the decoder attending to the encoder's top, as ``top`` does: it lives here because it
is the same hook, not because it is a memory in the decoder's sense.
"""

from .base import MEMORY_KEY, MEMORY_MASK_KEY, EncoderMemory, MemoryPass, decoder_memories, reorder  # noqa: F401
from .dlcl import DLCLMemory
from .msc import MSCMemory
from .top import TopMemory
from .transparent import TransparentMemory

MEMORIES = {
    "top": TopMemory,  # Vaswani et al. 2017
    "transparent": TransparentMemory,  # Bapna et al. 2018, Eq. 1-2
    "msc": MSCMemory,  # Wei et al. 2020, Eq. 5-13
    "dlcl": DLCLMemory,  # Wang et al. 2019a, Sec. 3.2 (pre-norm)
}


def memory_class(opts) -> type:
    """The memory class of ``--deep-memory``."""
    return MEMORIES[opts.deep_memory]
