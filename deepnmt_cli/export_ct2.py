"""Export a trained checkpoint of the plugin to CTranslate2 for fast serving (deepnmt-translate).

  deepnmt-export-ct2 checkpoint_best.pt served/ --quantization int8
  deepnmt-export-ct2 CHECKPOINT OUT_DIR --data DATA_BIN --bpe-codes bpe.codes --force

A model is exportable when its inference graph is a standard Transformer: pre- or post-norm
stacks of any depth, relative positions, the skipping sub-layer (folded into the weights), GP
and LayerDrop (training-only), CAD with --cad-drop-ratio < 1, DeepNorm and Admin
(reparameterised exactly).  MSC, transparent attention and DLCL memories are refused with the
reason (docs/deployment.md).  The tokenization (Moses, BPE or sentencepiece) is stored with the
model so that deepnmt-translate takes raw text.
"""

from __future__ import annotations

import sys

from deepnmt_deploy import QUANTIZATIONS
from deepnmt_deploy.vmap import FREQUENT, MAX_PAIRS, PER_TOKEN

from . import parser, run

PROG = "deepnmt-export-ct2"


def build_parser():
    p = parser(PROG, __doc__)
    p.add_argument("checkpoint", help="fairseq checkpoint (.pt)")
    p.add_argument("out_dir", help="output directory of the CTranslate2 model")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                   help="weight type stored (default: float32, as trained); int8 is the fast CPU choice")
    p.add_argument("--data", help="binarized data directory with the dictionaries (default: the one in the checkpoint)")
    seg = p.add_mutually_exclusive_group()
    seg.add_argument("--bpe-codes", help="subword-nmt codes the data were segmented with "
                     "(default: found next to the data directory, see docs/deployment.md)")
    seg.add_argument("--spm-model", help="sentencepiece model the data were segmented with")
    p.add_argument("--no-moses", dest="moses", action="store_false", default=None,
                   help="the data were not Moses-tokenized before BPE")
    p.add_argument("--lowercase", action="store_true", default=None, help="the data were lowercased")
    p.add_argument("--aggressive-dash", action="store_true", default=None,
                   help="Moses aggressive dash splits were used")
    p.add_argument("--force", action="store_true", help="overwrite OUT_DIR")
    v = p.add_argument_group("vocabulary shortlist (CTranslate2's vmap; docs/deployment.md)")
    v.add_argument("--vmap", nargs="?", const="train", default=None, metavar="FILE",
                   help="add a vocabulary shortlist: built from the training data (no FILE), or FILE "
                        "(CTranslate2's vmap.txt format); deepnmt-translate uses it unless --no-vmap")
    v.add_argument("--vmap-per-token", type=int, default=PER_TOKEN,
                   help="target candidates per source token (the highest Dice coefficient)")
    v.add_argument("--vmap-frequent", type=int, default=FREQUENT, help="most frequent target tokens, always allowed")
    v.add_argument("--vmap-max-pairs", type=int, default=MAX_PAIRS, help="training pairs read")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return run(PROG, "deepnmt_fairseq.deploy.export:run", a, errors=(ValueError,), code=2)


if __name__ == "__main__":
    sys.exit(main())
