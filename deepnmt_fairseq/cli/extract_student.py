"""Build a GPKD student from a teacher checkpoint: one layer per group (Li et al. 2021).

    deepnmt-extract-student --teacher teacher.pt --encoder-group-size 8 --output student.pt
    deepnmt-extract-student --teacher t.pt --encoder-group-size 2 --decoder-group-size 3 --select last ...
    deepnmt-extract-student --teacher t.pt --encoder-layers-select 1,6,9,12,17,22 --output s.pt

The mechanism (layer selection, the h rule, the state-dict remapping, MSC blocks, transparent
weights, CAD depth, DeepNorm/Admin students) is :mod:`deepnmt_fairseq.modules.student_extraction`;
this file parses the command line.  The teacher's checkpoint records the GP group size it was
trained with (``cfg.model.gp_group_size`` / ``gp_decoder_group_size``; 1 = trained without GP); a
different h is refused unless ``--allow-group-size-mismatch`` is given, and then the student's
``extra_state["gpkd_student"]["group_size_override"]`` records both values.

The output is a normal fairseq checkpoint (config with the new layer counts, GP
switched off, no optimizer state): it loads in ``fairseq-generate`` and serves
as ``--finetune-from-model`` (or ``--restore-file`` with ``--reset-optimizer
--reset-lr-scheduler --reset-meters --reset-dataloader``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..console import quiet_known_warnings
from ..modules.student_extraction import extract

logger = logging.getLogger("deepnmt_fairseq.extract_student")


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def main(argv=None) -> int:
    quiet_known_warnings()  # known-harmless hydra/torch/fairseq warnings (deepnmt_fairseq/console.py)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", required=True, help="teacher checkpoint (.pt)")
    p.add_argument("--output", required=True, help="student checkpoint to write")
    p.add_argument("--encoder-group-size", type=int, default=1, help="h for the encoder (N/M); 1 = keep all")
    p.add_argument("--decoder-group-size", type=int, default=1, help="h for the decoder; 1 = keep all")
    p.add_argument("--select", choices=["random", "first", "last"], default="random")
    p.add_argument("--encoder-layers-select", help="explicit 0-based encoder indices, one per group")
    p.add_argument("--decoder-layers-select", help="explicit 0-based decoder indices, one per group")
    p.add_argument("--seed", type=int, default=1, help="seed of --select random")
    p.add_argument("--allow-group-size-mismatch", action="store_true",
                   help="extract with a group size other than the teacher's GP group size (refused otherwise; "
                        "recorded in the student checkpoint)")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import deepnmt_fairseq  # noqa: F401
    from ..checkpoint_safety import load_checkpoint
    from .average_checkpoints import save_atomic

    try:
        state = load_checkpoint(a.teacher)
        student = extract(state, a.encoder_group_size, a.decoder_group_size, a.select, a.seed,
                          _ints(a.encoder_layers_select), _ints(a.decoder_layers_select),
                          allow_group_size_mismatch=a.allow_group_size_mismatch)
        student["extra_state"]["gpkd_student"]["teacher"] = os.path.abspath(a.teacher)
        save_atomic(student, a.output, a.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    info = student["extra_state"]["gpkd_student"]
    logger.info("student written to %s (encoder layers kept: %s, decoder layers kept: %s)",
                a.output, info["encoder_layers"], info["decoder_layers"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
