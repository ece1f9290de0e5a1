r"""Difficulty-split test sets and BLEU per part (MSC, Wei et al. 2020, Sec. 4.3, Eq. 14-15, Fig. 3).

    # 1-3: score every test pair with the last K checkpoints of a shallow reference model, split in 4
    deepnmt-difficulty split DATA_BIN --checkpoint-dir shallow/checkpoints --last 20 --out split/ \
        [--source-text test.en --target-text test.de] [--post-process subword_nmt]
    # 4: BLEU of several systems on each part, gains over the reference (Fig. 3)
    deepnmt-difficulty evaluate --split split/ --baseline plain6 \
        --system plain6=gen_plain6.txt --system msc36=gen_msc36.txt --system msc72=hyp_msc72.txt --out fig3/

Score (MSC Eq. 14-15): mean + standard deviation of a pair's teacher-forced NLL over the K
checkpoints; the pairs ordered by score are cut into Simple / Ordinary / Difficult / Challenging
parts of equal size.  split writes the scores, the parts as text and binarized (fairseq-generate
OUT/bin --gen-subset difficult ...) and a score plot; evaluate writes sacreBLEU of every system on
every part and the gains over --baseline (bleu.csv, bleu.json, difficulty_bleu.png).  Details:
docs/analysis.md.
"""

from __future__ import annotations

import sys

from . import parser, run, subparsers

PROG = "deepnmt-difficulty"


def build_parser():
    p = parser(PROG, __doc__)
    sub = subparsers(p, dest="cmd", required=True)
    s = sub.add_parser("split", help="score the test pairs with K checkpoints and split them in 4 (MSC Eq. 14-15)",
                       description="Score every pair of a binarized split with the last K checkpoints of a shallow "
                                   "reference model (s = mean + std of the sentence NLL, MSC Eq. 14-15) and split "
                                   "it into four equal parts by s.")
    s.add_argument("data", help="binarized data directory (fairseq-preprocess output)")
    s.add_argument("--checkpoints", nargs="+", help="the reference model's checkpoints")
    s.add_argument("--checkpoint-dir", help="take the newest --last checkpoints of this directory "
                                            "(checkpoint_E_U.pt and checkpointE.pt, by update count)")
    s.add_argument("--last", type=int, default=20, help="K, number of checkpoints (the paper's K = 20)")
    s.add_argument("--subset", default="test", help="split to score (default: test)")
    s.add_argument("--out", "--output", dest="out", required=True, help="output directory")
    s.add_argument("--source-text", help="the original source lines of the split (written per part)")
    s.add_argument("--target-text", help="the original target lines (per part, and references.txt)")
    s.add_argument("--post-process", default=None,
                   help="BPE removal for text taken from the binarized data: subword_nmt, sentencepiece, ...")
    s.add_argument("--batch-size", type=int, default=32, help="sentences per batch when scoring")
    s.add_argument("--cpu", action="store_true", help="score on the CPU even if a GPU is available")
    s.add_argument("--overwrite", action="store_true", help="replace files of an earlier run in --out")
    s.set_defaults(fn="cmd_split")

    e = sub.add_parser("evaluate", help="BLEU of several systems on each part and gains over a baseline (MSC Fig. 3)",
                       description="sacreBLEU of every system on each difficulty part; bar chart of the gains over "
                                   "the baseline like MSC Fig. 3.")
    e.add_argument("--split", required=True, help="output directory of 'split'")
    e.add_argument("--system", action="append", required=True, metavar="NAME=FILE",
                   help="a system's fairseq-generate output or hypothesis file (one line per test sentence, "
                        "test order); repeat for every system")
    e.add_argument("--baseline", required=True, help="the reference system (a --system NAME), e.g. the 6-layer plain net")
    e.add_argument("--refs", help="references, one per test sentence (default: SPLIT/references.txt)")
    e.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer (13a; 'none' for pre-tokenized text)")
    e.add_argument("--out", "--output", dest="out", required=True, help="output directory")
    e.add_argument("--overwrite", action="store_true", help="replace files of an earlier run in --out")
    e.set_defaults(fn="cmd_evaluate")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if getattr(a, "last", 1) < 1:
        p.error("--last must be >= 1")
    return run(PROG, f"deepnmt_fairseq.analysis.difficulty_split:{a.fn}", a, errors=(ValueError,), code=2)


if __name__ == "__main__":
    sys.exit(main())
