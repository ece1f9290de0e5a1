"""Build a GPKD student from a teacher checkpoint file: one layer per group (Li et al. 2021).

The library behind ``deepnmt-extract-student`` (its arguments: :mod:`deepnmt_cli.extract_student`).
The mechanism (layer selection, the h rule, the state-dict remapping, MSC blocks, transparent
weights, CAD depth, DeepNorm/Admin students) is :mod:`deepnmt_fairseq.modules.student_extraction`;
this module reads the teacher file and writes the student file.
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional

from ..checkpoint_averaging import save_atomic
from ..checkpoint_safety import load_checkpoint
from ..modules.student_extraction import extract

logger = logging.getLogger("deepnmt_fairseq.extract_student")


def extract_file(teacher: str, output: str, encoder_group_size: int = 1, decoder_group_size: int = 1,
                 select: str = "random", seed: int = 1, encoder_layers: Optional[List[int]] = None,
                 decoder_layers: Optional[List[int]] = None, allow_group_size_mismatch: bool = False,
                 overwrite: bool = False) -> dict:
    """Extract a student from the checkpoint ``teacher`` and write it to ``output`` atomically;
    returns the student's ``extra_state["gpkd_student"]`` record."""
    import deepnmt_fairseq  # noqa: F401  (allow-list fairseq's checkpoint classes)

    student = extract(load_checkpoint(teacher), encoder_group_size, decoder_group_size, select, seed,
                      encoder_layers, decoder_layers, allow_group_size_mismatch=allow_group_size_mismatch)
    info = student["extra_state"]["gpkd_student"]
    info["teacher"] = os.path.abspath(teacher)
    save_atomic(student, output, overwrite)
    return info


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def run(a) -> int:
    """``deepnmt-extract-student`` (arguments: :mod:`deepnmt_cli.extract_student`)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    info = extract_file(a.teacher, a.output, a.encoder_group_size, a.decoder_group_size, a.select, a.seed,
                        _ints(a.encoder_layers_select), _ints(a.decoder_layers_select),
                        a.allow_group_size_mismatch, a.overwrite)
    logger.info("student written to %s (encoder layers kept: %s, decoder layers kept: %s)",
                a.output, info["encoder_layers"], info["decoder_layers"])
    return 0
