"""Average the weights of fairseq checkpoints into one checkpoint.

  deepnmt-average-checkpoints --inputs CKPT_DIR --num-update-checkpoints 5 --output avg.pt
  deepnmt-average-checkpoints --inputs CKPT_DIR --num-epoch-checkpoints 5 --output avg.pt
  deepnmt-average-checkpoints --inputs CKPT_DIR --num-checkpoints 5 --output avg.pt
  deepnmt-average-checkpoints --inputs a.pt b.pt c.pt --output avg.pt

--num-checkpoints K takes the K newest checkpoints of either kind (checkpoint_E_U.pt and
checkpointE.pt, by the update count stored in each file).  Every file is read with torch's
weights-only loader; a file that pickles anything else is refused.  Floating-point tensors are
averaged in float64 and cast back; integer buffers must agree.  The output keeps the newest
input's configuration but not its optimizer state, unless --keep-training-state (then
fairseq-train --continue-once OUTPUT continues training from the averaged weights).  It is
written atomically and never replaces an existing file unless --overwrite.
"""

from __future__ import annotations

import os
import sys

from . import parser, run

PROG = "deepnmt-average-checkpoints"


def build_parser():
    p = parser(PROG, __doc__)
    p.add_argument("--inputs", nargs="+", required=True, help="checkpoint files, or one directory")
    p.add_argument("--output", required=True, help="averaged checkpoint to write")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--num-update-checkpoints", type=int, metavar="K",
                   help="average the last K checkpoint_E_U.pt by update")
    g.add_argument("--num-epoch-checkpoints", type=int, metavar="K", help="average the last K checkpointE.pt by epoch")
    g.add_argument("--num-checkpoints", type=int, metavar="K",
                   help="average the last K checkpoints of either kind, by update")
    p.add_argument("--checkpoint-upper-bound", type=int, help="ignore checkpoints after this epoch/update")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--keep-training-state", action="store_true",
                   help="keep the newest checkpoint's optimizer state, schedule and update count: "
                        "fairseq-train --continue-once OUTPUT continues training from the averaged weights")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    by_count = a.num_checkpoints or a.num_update_checkpoints or a.num_epoch_checkpoints
    if by_count and len(a.inputs) != 1:
        p.error("--num-checkpoints/--num-update-checkpoints/--num-epoch-checkpoints need exactly one directory "
                "in --inputs")
    if not by_count:
        for path in a.inputs:
            if os.path.isdir(path):
                p.error(f"{path} is a directory: give files, or --num-update/epoch-checkpoints")
    return run(PROG, "deepnmt_fairseq.checkpoint_averaging:run", a, errors=(ValueError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
