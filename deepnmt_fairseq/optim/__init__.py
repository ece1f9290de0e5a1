"""Optimizers the plugin registers in fairseq (``--optimizer NAME``)."""

from . import radam  # noqa: F401
