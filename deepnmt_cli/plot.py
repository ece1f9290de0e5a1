"""The papers' diagnostic figures, one command each (PNG + the numbers as CSV/JSON).

    deepnmt-plot grad-norms  RUN --out DIR             # MSC Fig. 5: gradient norm per layer vs update
    deepnmt-plot grad-ratio  RUN [RUN ...] --out DIR   # Bapna Fig. 1-3: r_t vs update, several runs
    deepnmt-plot mixing      RUN --out DIR [--decoder-layer J]    # Bapna Fig. 4: s_ij heatmap, s_iJ vs update
    deepnmt-plot mixing      --checkpoint CKPT --out DIR          # s_ij of a checkpoint
    deepnmt-plot gates       RUN --out DIR             # MSC gate means per layer vs update
    deepnmt-plot degradation --data BIN --model plain=p36.pt --model msc=m36.pt ... --out DIR   # MSC Fig. 2
    deepnmt-plot depth       --results DIR_OR_JSON ... [--arch NAME ...] --out DIR   # BLEU/params vs depth

RUN is a training log with --log-format json lines (train.log or a capture of the console),
a directory holding such *.log files, or a --tensorboard-logdir (read with the optional
tensorboard package).  The diagnostics come from --task deep_translation (see
deepnmt_fairseq/tasks/deep_translation.py): --log-grad-norms-every K, --log-grad-ratio,
--log-mixing-weights, --log-gate-stats.  Existing output files are never replaced
without --overwrite.
"""

from __future__ import annotations

import sys

from . import parser, run, subparsers

PROG = "deepnmt-plot"


def build_parser():
    p = parser(PROG, __doc__)
    sub = subparsers(p, dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--out", "--output", dest="out", required=True, help="output directory (PNG + CSV/JSON)")
        sp.add_argument("--overwrite", action="store_true", help="replace files of an earlier run")

    g = sub.add_parser("grad-norms", help="gradient norm of each layer vs update (MSC Fig. 5)",
                       description="Gradient norm of every encoder/decoder layer's parameters vs update (MSC Fig. 5), "
                                   "from --log-grad-norms-every K.")
    g.add_argument("run", help="JSON log (--log-format json), a directory of *.log, or a tensorboard log dir")
    g.add_argument("--stack", choices=("encoder", "decoder", "both"), default="both", help="which stack's layers")
    g.add_argument("--logy", action="store_true", help="logarithmic y axis")
    common(g)
    g.set_defaults(fn="cmd_grad_norms")

    r = sub.add_parser("grad-ratio", help="r_t vs update for several runs (Bapna et al. 2018 Fig. 1-3)",
                       description="r_t = ||grad h_1|| / ||grad h_N|| vs update (Bapna et al. 2018, Sec. 2.3), one "
                                   "line per run, from --log-grad-ratio.")
    r.add_argument("runs", nargs="+", help="training logs or log directories")
    r.add_argument("--labels", nargs="+", help="one legend name per run (default: file/directory names)")
    r.add_argument("--logy", action="store_true", help="logarithmic y axis")
    common(r)
    r.set_defaults(fn="cmd_grad_ratio")

    m = sub.add_parser("mixing", help="transparent-attention weights: heatmap and evolution (Bapna Fig. 4)",
                       description="Heatmap of s_ij at the last logged update and s_iJ of one decoder layer J over "
                                   "updates (Bapna et al. 2018, Fig. 4), from --log-mixing-weights; or the heatmap "
                                   "of a checkpoint's weights (--checkpoint).")
    m.add_argument("run", nargs="?", help="training log (or directory) with --log-mixing-weights")
    m.add_argument("--checkpoint", help="draw s_ij of this checkpoint instead (softmax of W, no dropout)")
    m.add_argument("--decoder-layer", type=int, help="J for the evolution plot (default: the top decoder layer; "
                                                     "Bapna Fig. 4 shows j = 6)")
    common(m)
    m.set_defaults(fn="cmd_mixing")

    t = sub.add_parser("gates", help="MSC gate means per layer vs update (Eq. 12-13)",
                       description="Mean gate value of every MSC gated fusion vs update, from --log-gate-stats.")
    t.add_argument("run", help="training log (or directory) with --log-gate-stats")
    common(t)
    t.set_defaults(fn="cmd_gates")

    d = sub.add_parser("degradation", help="train-sample and valid BLEU vs depth for several models (MSC Fig. 2)",
                       description="BLEU on a fixed random sample of the training data and on valid for several "
                                   "models vs depth (MSC Fig. 2: 3K training pairs).  Every model translates the "
                                   "same sample (--seed).  BLEU is sacreBLEU on the target dictionary strings with "
                                   "--post-process applied (use --tokenize none for tokenized text).")
    d.add_argument("--data", required=True, help="binarized data directory")
    d.add_argument("--model", action="append", required=True, metavar="FAMILY=CHECKPOINT",
                   help="a model and its family (one line per family, e.g. plain=plain36/checkpoint_best.pt); "
                        "depth is read from the checkpoint")
    d.add_argument("--depth", choices=("encoder", "decoder", "total"), default="encoder",
                   help="x axis: encoder layers (MSC Fig. 2), decoder or total layers")
    d.add_argument("--train-sample", type=int, default=3000, help="training pairs to translate (MSC: 3K)")
    d.add_argument("--seed", type=int, default=1, help="seed of the training sample")
    d.add_argument("--train-subset", default="train", help="split the training sample is drawn from")
    d.add_argument("--valid-subset", default="valid", help="the validation split")
    d.add_argument("--beam", type=int, default=4, help="beam size (MSC: 4; 1 = greedy)")
    d.add_argument("--lenpen", type=float, default=0.6, help="length penalty (MSC: 0.6)")
    d.add_argument("--max-len-a", type=float, default=1.2, help="maximum output length a*source_length+b: a")
    d.add_argument("--max-len-b", type=int, default=10, help="maximum output length a*source_length+b: b")
    d.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    d.add_argument("--post-process", default=None, help="BPE removal: subword_nmt, sentencepiece, ...")
    d.add_argument("--tokenize", default="13a", help="sacreBLEU tokenizer")
    d.add_argument("--cpu", action="store_true", help="translate on the CPU even if a GPU is available")
    common(d)
    d.set_defaults(fn="cmd_degradation")

    h = sub.add_parser("depth", help="BLEU and parameters vs depth from results.json files / param counts",
                       description="BLEU and parameter counts vs depth from results files (JSON objects with "
                                   "experiment, bleu or sacrebleu, params, encoder_layers, decoder_layers; optional "
                                   "series) and/or the plugin's named architectures (--arch, counted like "
                                   "deepnmt-param-counts, with the paper's count as x).")
    h.add_argument("--results", nargs="+", help="results.json files or directories searched for results.json")
    h.add_argument("--arch", nargs="+", help="named architectures to count (deepnmt-param-counts)")
    h.add_argument("--vocab", type=int, help="vocabulary size for --arch (default: the paper's)")
    h.add_argument("--x", choices=("encoder_layers", "decoder_layers", "total_layers"), default="encoder_layers", help="x axis")
    common(h)
    h.set_defaults(fn="cmd_depth")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    return run(PROG, f"deepnmt_fairseq.analysis.plots:{a.fn}", a, errors=(ValueError,), code=2)


if __name__ == "__main__":
    sys.exit(main())
