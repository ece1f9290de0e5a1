r"""Attention heatmaps of one sentence (MSC, Wei et al. 2020, Fig. 4 and 6).

    deepnmt-attention --path checkpoint_best.pt --data data-bin \
        --sentence "Click the OK button." --moses-lang en --bpe-codes bpe.codes --out att/
    deepnmt-attention --path model.pt --sentence "pre@@ tokenized input" --greedy --out att/

The sentence is tokenized with sacremoses (--moses-lang) and split with the model's
subword-nmt BPE codes (--bpe-codes) when given; otherwise it is taken as already
tokenized/BPE'd.  It is translated (beam search, --beam; --greedy = beam 1), or
--target is used as the translation (forced decoding), then a teacher-forced pass over the
translation records

* cross: the cross-attention of the top decoder layer (--layer picks another), averaged
  over heads.  In an MSC model this is ATTN_h over encoder block N's output B_e^N (Eq. 13); with
  transparent attention it is the attention over the layer mix z^j (Bapna Eq. 2);
* context (MSC with a context cell only): ATTN_c of the same layer, the attention over the
  context state C^N (Eq. 13), whose positions are the source positions.

--attention auto (default) draws cross, and context too for MSC models.  Asking for an
attention the model does not have fails with a message naming the model's --deep-memory.

Writes attention.png (one heatmap per attention: rows = target tokens, columns = source
tokens) and attention.json (tokens, translation, matrices).
"""

from __future__ import annotations

import sys

from . import parser, run

PROG = "deepnmt-attention"


def build_parser():
    p = parser(PROG, __doc__)
    p.add_argument("--path", required=True, help="model checkpoint")
    p.add_argument("--data", help="binarized data directory with the dictionaries (default: the checkpoint's)")
    p.add_argument("--sentence", required=True, help="source sentence")
    p.add_argument("--target", help="force-decode this (tokenized/BPE'd like the training data) instead of translating")
    p.add_argument("--moses-lang", help="tokenize the sentence with sacremoses for this language first")
    p.add_argument("--bpe-codes", help="apply these subword-nmt BPE codes (the model's)")
    p.add_argument("--attention", choices=("auto", "cross", "context", "both"), default="auto",
                   help="which attention to draw (auto: cross, plus context for MSC models)")
    p.add_argument("--layer", type=int, default=-1, help="decoder layer, 1-based; -1 = top (MSC Fig. 4)")
    p.add_argument("--beam", type=int, default=4, help="beam size (MSC: 4)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding (beam 1)")
    p.add_argument("--lenpen", type=float, default=0.6, help="length penalty (MSC: 0.6)")
    p.add_argument("--out", "--output", dest="out", required=True, help="output directory")
    p.add_argument("--prefix", default="attention", help="file name prefix (default: attention)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is available")
    p.add_argument("--overwrite", action="store_true", help="replace files of an earlier run in --out")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.layer == 0:
        p.error("--layer is 1-based (or -1 for the top layer)")
    return run(PROG, "deepnmt_fairseq.analysis.attention_maps:run", a, errors=(ValueError,), code=2)


if __name__ == "__main__":
    sys.exit(main())
