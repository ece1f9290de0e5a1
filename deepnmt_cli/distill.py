"""Train deep, serve shallow: a trained teacher to a served int8 student in one command.

    deepnmt-distill (--teacher TEACHER.pt|SAVE_DIR --data DATA_BIN | --teacher-row NAME [--repro-args "..."]) \\
        --work-dir WORK \\
        --test-source test.raw.en --test-reference test.raw.de [--bpe-codes CODES] \\
        [--student-init auto|extract|teacher|scratch] [--student-encoder-layers 6 --student-decoder-layers 3 ...] \\
        [--student-updates N] [--train-args "..."] [--quantization int8] [--cpu] [--tiny]

Stages (docs/distill.md; each skipped when its output exists, each resumes when interrupted):

  0. with --teacher-row NAME: the registry row's training stages (deepnmt-repro train NAME
     --stage ... REPRO_ARGS; reused when trained earlier); its last stage is the teacher;

  1. teacher average (when --teacher is fairseq-train's save directory: its last --average
     checkpoints);
  2. SKD data: the (averaged) teacher translates the training set (deepnmt-skd, beam 4, lenpen 0.6);
  3. student initialisation: one layer per group (deepnmt-extract-student) when the teacher was
     GP-trained, with h = the teacher's own GP group size from its checkpoint; else a plain
     pre-norm deepnmt_transformer (depths and width are flags, by default the teacher's width and
     depths capped at 6) that starts from every teacher tensor of the same name and shape
     (--student-init teacher; --student-init scratch: fairseq's initialisation);
  4. student training on the SKD data (fairseq-train; resumes from checkpoint_last.pt);
  5. student average (last --average checkpoints);
  6. export to CTranslate2 (deepnmt-export-ct2, --quantization int8 by default; WORK/ct2-int8, with
     --vmap the vocabulary shortlist in WORK/ct2-int8-vmap);
  7. report (WORK/report/report.{md,json}; with --vmap WORK/report-vmap/): teacher sacreBLEU with fairseq-generate, student
     sacreBLEU with fairseq-generate and with deepnmt-translate, tokens/s of each batched and one
     sentence at a time in the same run, parameters and size on disk.

Checked before any work, each error naming the flag or file: a missing teacher, a teacher whose
dictionary differs from --data's, a student that cannot be extracted from this teacher, and a
student that cannot be exported exactly (deploy.export.refusals on the student built from its
flags).  A re-run with other settings refuses the work directory.  Without --cpu the commands
run on CUDA when it is available.
"""

from __future__ import annotations

import sys
from typing import Optional

from . import fail, parser, run

PROG = "deepnmt-distill"

#: named student shapes (issue 71): name -> (encoder layers, decoder layers, what it is); None = the
#: teacher's depth (capped at 6 for "auto", the teacher's whole encoder for "desdar")
STUDENT_PRESETS = {
    "auto": (None, None, "the teacher's depths capped at 6 (one layer per group for a GP-trained teacher)"),
    "6-3": (6, 3, "6 encoder and 3 decoder layers"),
    "6-1": (6, 1, "6 encoder layers and one decoder layer"),
    "12-1": (12, 1, "12 encoder layers and one decoder layer"),
    "desdar": (None, 1, "the teacher's whole encoder and one decoder layer (deep encoder, shallow decoder: "
                        "GPKD's DESDAR, Kasai et al. 2021), started from the teacher's tensors"),
}


def build_parser():
    p = parser(PROG, __doc__)
    t = p.add_mutually_exclusive_group(required=True)
    t.add_argument("--teacher",
                   help="teacher checkpoint (.pt), or fairseq-train's --save-dir (its last --average checkpoints "
                        "are averaged); any architecture of the plugin")
    t.add_argument("--teacher-row", metavar="NAME",
                   help="a deepnmt-repro registry row (deepnmt-repro list): its training stages run first "
                        "(deepnmt-repro train NAME; reused when trained earlier), its last stage is the teacher")
    p.add_argument("--repro-args", default="",
                   help="--teacher-row: flags of deepnmt-repro train, fairseq-train flags after '--' (e.g. "
                        "'--gpus 8 --bf16 --data-root DIR', '--launcher torchrun')")
    p.add_argument("--data", help="binarized data the teacher was trained on (fairseq-preprocess); "
                                  "--teacher-row: default the row's data")
    p.add_argument("--work-dir", required=True, help="where every stage writes; tied to these settings")
    p.add_argument("--test-source", required=True, help="raw (untokenized) source side of the test split of --data")
    p.add_argument("--test-reference", required=True, help="raw reference translations of the same sentences")
    g = p.add_argument_group("student")
    g.add_argument("--student", choices=list(STUDENT_PRESETS), default="auto",
                   help="a named student shape: " + "; ".join(f"{k}: {v[2]}" for k, v in STUDENT_PRESETS.items())
                        + " (--student-encoder-layers/--student-decoder-layers override its depths)")
    g.add_argument("--student-init", choices=["auto", "extract", "teacher", "scratch"], default="auto",
                   help="extract: one layer per group (a GP-trained teacher); teacher: every teacher tensor whose name "
                        "and shape the student shares; scratch: fairseq's initialisation; auto: extract when the "
                        "teacher was GP-trained, else teacher")
    g.add_argument("--student-arch", help="architecture of a scratch student (default deepnmt_transformer, pre-norm)")
    g.add_argument("--student-encoder-layers", type=int, help="scratch: encoder depth (default: the teacher's, <= 6)")
    g.add_argument("--student-decoder-layers", type=int, help="scratch: decoder depth (default: the teacher's, <= 6)")
    g.add_argument("--student-dim", type=int, help="scratch: embedding width (default: the teacher's)")
    g.add_argument("--student-ffn-dim", type=int, help="scratch: FFN width (default: the teacher's)")
    g.add_argument("--student-heads", type=int, help="scratch: attention heads (default: the teacher's)")
    g.add_argument("--student-args", default="", help="more fairseq model flags for the student")
    g.add_argument("--select", choices=["random", "first", "last"], default="random",
                   help="extract: which layer of each group")
    g = p.add_argument_group("training")
    g.add_argument("--train-args", default=None,
                   help="fairseq-train optimization flags of the student (default: the GPKD paper's, deepnmt_fairseq.distill.plan.DEFAULT_TRAIN_ARGS; shown by --dry-run)")
    g.add_argument("--student-updates", type=int, default=50000, help="--max-update of the student")
    g.add_argument("--save-interval-updates", type=int, default=0,
                   help="student checkpoint interval (default: --student-updates / 16)")
    g.add_argument("--average", type=int, default=5, help="last K checkpoints averaged (teacher directory, student)")
    g.add_argument("--skd-args", default="", help="more deepnmt-skd flags (e.g. --shards 8 --max-tokens 8192)")
    g.add_argument("--seed", type=int, default=1, help="seed of the student's training and of --select random")
    g = p.add_argument_group("export and report")
    g.add_argument("--quantization", default="int8", help="CTranslate2 weight type (deepnmt-export-ct2)")
    g.add_argument("--vmap", action="store_true",
                   help="export the student with a vocabulary shortlist built from --data's training pairs "
                        "(deepnmt-export-ct2 --vmap, into ct2-<quantization>-vmap; CTranslate2's use_vmap) and serve "
                        "the report with it: each output step scores only the target tokens the sentence's source "
                        "allows (docs/deployment.md). Not a setting of the work directory: the same student is "
                        "reported with and without it side by side; its BLEU cost is report-vmap's served "
                        "sacreBLEU against report's")
    seg = g.add_mutually_exclusive_group()
    seg.add_argument("--bpe-codes", help="subword-nmt codes of --data (default: found next to it)")
    seg.add_argument("--spm-model", help="sentencepiece model of --data")
    g.add_argument("--beam", type=int, default=5, help="beam size of the report's translations (teacher and student)")
    g.add_argument("--lenpen", type=float, default=1.0, help="length penalty of the report's translations")
    g.add_argument("--max-len-a", type=float, default=1.2, help="maximum output length a*source_length+b: a")
    g.add_argument("--max-len-b", type=int, default=10, help="maximum output length a*source_length+b: b")
    g.add_argument("--batch-size", type=int, default=64,
                   help="fairseq-generate's batch size (batched speed): tried with 32, 64, 128, 256 and --max-tokens "
                        "2048, 4096, 8192 in the tuning pass, the fastest is measured (--no-speed-search: this one)")
    g.add_argument("--ct2-batch-size", type=int, default=32,
                   help="deepnmt-translate's batch size (batched speed): tried with 4, 8, 16, 32, 64, the fastest is "
                        "measured (--no-speed-search: this one)")
    g.add_argument("--no-report", action="store_true",
                   help="stop after the export (the same command without it then only measures the report: e.g. "
                        "students trained side by side, their speeds measured one at a time on an idle machine)")
    g.add_argument("--no-speed-search", action="store_true",
                   help="measure each engine with the given batch sizes and every core's threads, without first "
                        "timing the candidate settings on a probe (each engine's best setting: docs/distill.md)")
    g.add_argument("--single-sentences", type=int, default=300,
                   help="about this many test sentences are translated one at a time for the single-sentence speed")
    g.add_argument("--speed-repeats", type=int, default=5, metavar="N",
                   help="the speed protocol's interleaved rounds (teacher, student, teacher, ...), batched and one "
                        "sentence at a time (default: the protocol's 5; fewer: the report says its figures are not "
                        "the protocol's claim; docs/benchmarks.md)")
    g.add_argument("--speed-min-seconds", type=float, default=10.0, metavar="S",
                   help="seconds of decoding in one timed run, at least: the input is repeated where one pass is "
                        "shorter (default: the protocol's 10; the quickstart's step 7 uses 2: docs/distill.md)")
    g.add_argument("--speed-cores", metavar="LIST",
                   help="pin the report's runs to these cores, e.g. 0-1 (default: the cores this process may use)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    p.add_argument("--tiny", action="store_true",
                   help="CI smoke size: a few student updates, --average <= 2, short outputs, the report's speed in "
                        "1 timed round of one pass (not a claim)")
    p.add_argument("--dry-run", action="store_true", help="check and print the plan, run nothing")
    return p


def parse_repro_args(p, a) -> Optional[str]:
    """--repro-args are flags of deepnmt-repro train (fairseq-train flags after --): parsed here,
    so that a mistake is an error (returned, naming the flag) before any work."""
    import shlex

    from .repro import split_extra, train_parser

    if not a.teacher_row:
        if a.repro_args:
            return "--repro-args: only with --teacher-row"
        a.repro = None
        return None
    words = shlex.split(a.repro_args)
    flags, extra = split_extra(words)
    if "--stage" in flags or "--dry-run" in flags:
        return ("--repro-args: --stage and --dry-run are chosen by deepnmt-distill (the row's training stages; "
                "deepnmt-distill --dry-run)")
    try:
        parsed = train_parser().parse_args([a.teacher_row, *flags])
    except SystemExit:
        return f"--repro-args {a.repro_args!r}: not flags of deepnmt-repro train (deepnmt-repro train --help)"
    a.repro = (parsed, flags, extra)
    return None


def apply_student_preset(p, a) -> Optional[str]:
    """--student NAME: the preset's depths where no --student-*-layers flag gives one; a preset
    other than auto trains a student of its own shape, started from the teacher's tensors of the
    same name and shape unless --student-init says otherwise (extraction fixes the depths itself)."""
    enc, dec, _ = STUDENT_PRESETS[a.student]
    a.student_depth_cap = 6
    if a.student == "auto":
        return None
    if a.student_init == "extract":
        return (f"--student {a.student} with --student-init extract: an extracted student's depths are the "
                "teacher's N/h; use --student-init teacher or scratch with a preset")
    a.student_init = "teacher" if a.student_init == "auto" else a.student_init
    a.student_encoder_layers = a.student_encoder_layers or enc
    a.student_decoder_layers = a.student_decoder_layers or dec
    if a.student == "desdar":
        a.student_depth_cap = None
    return None


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    problem = parse_repro_args(p, a) or apply_student_preset(p, a)
    if problem:
        return fail(PROG, problem, 2)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # the report records the command
    return run(PROG, "deepnmt_fairseq.distill.command:run", a)


if __name__ == "__main__":
    sys.exit(main())
