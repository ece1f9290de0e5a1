"""Sequence-level knowledge distillation data (Kim & Rush 2016; GPKD stage 2).

  deepnmt-skd --data data-bin --teacher teacher.pt --output skd-bin
  deepnmt-skd --data data-bin --teacher teacher.pt --output skd-bin --shards 8 --jobs 2 --max-tokens 8192

The teacher translates the whole training split with fairseq-generate (beam 4, length penalty
0.6 as in the GPKD paper) in --shards parts, --jobs of them at a time (one fairseq-generate
each: on CPU the cores are split between them unless OMP_NUM_THREADS is set; on several GPUs one
GPU each).  Each finished shard is kept, so an interrupted run resumes with the unfinished ones.
The SKD corpus is the training sources with the teacher's outputs, in the original order,
binarized with the teacher's dictionaries; valid and test keep their references.  Nothing is
dropped: every sentence id must come back exactly once.
"""

from __future__ import annotations

import sys

from . import parser, run

PROG = "deepnmt-skd"


def build_parser():
    p = parser(PROG, __doc__)
    p.add_argument("--data", required=True, help="binarized data (fairseq-preprocess output)")
    p.add_argument("--teacher", required=True, help="teacher checkpoint")
    p.add_argument("--output", required=True, help="directory for the binarized SKD data")
    p.add_argument("--work-dir", help="shard outputs (default: OUTPUT.work)")
    p.add_argument("--shards", type=int, default=1, help="the training split is translated in this many "
                   "parts, each kept when done (resumable)")
    p.add_argument("--jobs", type=int, default=1, help="shards translated at the same time (one fairseq-generate "
                   "each; CPU: the cores split between them; several GPUs: one each)")
    p.add_argument("--beam", type=int, default=4, help="beam size (GPKD: 4)")
    p.add_argument("--lenpen", type=float, default=0.6, help="length penalty (GPKD: 0.6)")
    p.add_argument("--max-len-a", type=float, default=1.2, help="maximum output length a*source_length+b: a")
    p.add_argument("--max-len-b", type=int, default=10, help="maximum output length a*source_length+b: b")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per batch (instead of --batch-size)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (when no --max-tokens)")
    p.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    p.add_argument("--cpu", action="store_true", help="translate on the CPU")
    p.add_argument("--fp16", action="store_true", help="translate in half precision (GPU)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.shards < 1:
        p.error(f"--shards must be at least 1, got {a.shards}")
    if a.jobs < 1:
        p.error(f"--jobs must be at least 1, got {a.jobs}")
    return run(PROG, "deepnmt_fairseq.distill.skd:run", a, errors=(ValueError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
