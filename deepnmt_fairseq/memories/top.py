"""Every decoder layer attends to the top encoder layer (Vaswani et al. 2017).

The default memory: it keeps nothing, and the decoder reads fairseq's own
``encoder_out`` (the last layer, after the final LayerNorm in pre-norm models).
"""

from __future__ import annotations

from .base import EncoderMemory


class TopMemory(EncoderMemory):
    """``--deep-memory top``: nothing to keep, ``finish`` returns None."""
