"""Build a GPKD student from a teacher checkpoint: one layer per group (Li et al. 2021).

  deepnmt-extract-student --teacher teacher.pt --encoder-group-size 8 --output student.pt
  deepnmt-extract-student --teacher t.pt --encoder-group-size 2 --decoder-group-size 3 --select last --output s.pt
  deepnmt-extract-student --teacher t.pt --encoder-layers-select 1,6,9,12,17,22 --output s.pt

The teacher's checkpoint records the GP group size it was trained with (1 = trained without
GP); a different group size is refused unless --allow-group-size-mismatch is given, and the
student then records both values.  The output is a normal fairseq checkpoint (the new layer
counts, GP switched off, no optimizer state): it loads in fairseq-generate and serves as
fairseq-train --finetune-from-model.
"""

from __future__ import annotations

import sys

from . import parser, run

PROG = "deepnmt-extract-student"


def build_parser():
    p = parser(PROG, __doc__)
    p.add_argument("--teacher", required=True, help="teacher checkpoint (.pt)")
    p.add_argument("--output", required=True, help="student checkpoint to write")
    p.add_argument("--encoder-group-size", type=int, default=1, help="h for the encoder (N/M); 1 = keep all")
    p.add_argument("--decoder-group-size", type=int, default=1, help="h for the decoder; 1 = keep all")
    p.add_argument("--select", choices=["random", "first", "last"], default="random",
                   help="which layer of each group is kept")
    p.add_argument("--encoder-layers-select", metavar="I,J,...",
                   help="explicit 0-based encoder indices, one per group")
    p.add_argument("--decoder-layers-select", metavar="I,J,...",
                   help="explicit 0-based decoder indices, one per group")
    p.add_argument("--seed", type=int, default=1, help="seed of --select random")
    p.add_argument("--allow-group-size-mismatch", action="store_true",
                   help="extract with a group size other than the teacher's GP group size (refused otherwise; "
                        "recorded in the student checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    for flag in ("encoder_layers_select", "decoder_layers_select"):
        value = getattr(a, flag)
        if value and not all(x.strip().isdigit() for x in value.split(",") if x.strip()):
            p.error(f"--{flag.replace('_', '-')}: comma-separated 0-based layer indices, got {value!r}")
    return run(PROG, "deepnmt_fairseq.distill.extract:run", a, errors=(ValueError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
