"""The papers' experiments from the registry: list, show, train, evaluate, tabulate, plot.

  deepnmt-repro list [--table KEY] [--names]      # tables, rows, experiment names
  deepnmt-repro show NAME                         # settings, notes, commands
  deepnmt-repro arch NAME | --list                # a named architecture: its settings, paper row, experiments
  deepnmt-repro train NAME [--dry-run] [--gpus N] ... [-- fairseq-train flags]
  deepnmt-repro plan NAME [--gpu-memory 80G] [--gpus N] [--bf16|--fp32] [--checkpoint-activations]
  deepnmt-repro evaluate NAME [--dry-run] [--checkpoint-dir DIR] ... [-- fairseq-generate flags]
  deepnmt-repro table [--table KEY] [--checkpoint-root DIR] [--docs | --check-docs]
  deepnmt-repro plot KEY [--out DIR]              # the papers' figures from finished experiments
  deepnmt-repro write-configs [--config-dir configs]   # configs/*.yaml for fairseq-hydra-train
  deepnmt-repro check-configs [--config-dir configs]   # exit 1 if configs/ drifted

Also python -m deepnmt_fairseq.repro.  Data: $DEEPNMT_DATA/<dataset>/bin, checkpoints:
$DEEPNMT_CHECKPOINTS/NAME (both default to work/ under the current directory; the checkout's
scripts/train.sh and scripts/evaluate.sh default to <repo>/work).  deepnmt-repro COMMAND --help
shows a command's flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import parser, run, subparsers

PROG = "deepnmt-repro"

TRAIN_HELP = """\
Train one experiment of the registry: every stage in order (fairseq-train; for GPKD also
SKD data and student extraction), skipping stages that finished earlier.

  deepnmt-repro train NAME [--dry-run] [--gpus N] [--fp16|--bf16] [--save-dir DIR] [--data DIR]
                      [--stage S ...] [--max-tokens N] [--launcher local|torchrun|slurm]
                      [-- extra fairseq-train flags]
  (scripts/train.sh NAME ... is the same)

Tokens per update are the paper's on any number of GPUs: --update-freq =
ceil(tokens_per_update / (max_tokens * GPUs)), GPUs from --gpus, CUDA_VISIBLE_DEVICES or
nvidia-smi (or the launcher's world size).  Flags after -- go to every fairseq-train
command of the experiment and override the registry's (argparse: the last one wins).
"""

EVAL_HELP = """\
Evaluate one experiment: average its last checkpoints, decode the test set with the
paper's beam / length penalty, score (tokenized BLEU as multi-bleu.perl, lowercased for
IWSLT, compound-split for En->De, detokenized sacreBLEU with signature, decoding speed)
and write <save-dir>/results.json.

  deepnmt-repro evaluate NAME [--checkpoint-dir DIR] [--dry-run] [-- extra fairseq-generate flags]
  (scripts/evaluate.sh NAME ... is the same)
"""

TABLE_HELP = """\
Markdown tables of the papers' results next to ours, one per paper table.

  deepnmt-repro table [--table KEY] [--checkpoint-root DIR] [--output FILE]
  deepnmt-repro table --docs [--output docs/reproduction.md]   # regenerate the doc (from a checkout)
  deepnmt-repro table --check-docs                            # exit 1 if it drifted

Each row shows the paper's numbers, ours from <checkpoint-root>/<experiment>/results.json
(written by deepnmt-repro evaluate; "-" until it exists) and the command that produces it.
Rows of systems from other papers that the plugin does not implement have no command and say why.
"""

PLAN_HELP = """\
Will it fit: memory and time of each training stage of an experiment at the paper's shape, before a
GPU is booked.  Parameters, gradients and Adam/RAdam state are exact (the built model); activations
are the bytes autograd saves, counted on the CPU at a few batch shapes and fitted (fit error
printed); the backward transient and the time per update are estimates.  Units: GiB; a card's
nominal "80 GB" is read as 80 GiB.  docs/training.md ("Will it fit") explains every number.

  deepnmt-repro plan NAME [--gpu-memory 80G] [--gpus 8] [--bf16|--fp32] [--checkpoint-activations]
                     [--gpu A100-80GB]
"""

PLOT_HELP = """\
The papers' figures from finished experiments (each figure's experiments must have been
evaluated): deepnmt-repro plot --list names them and the choices made where a paper is silent.
"""


def _paths_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--save-dir", help="this experiment's directory (default $DEEPNMT_CHECKPOINTS/NAME, "
                                      "else ./work/checkpoints/NAME); stages of multi-stage experiments "
                                      "go to DIR/STAGE")
    p.add_argument("--data", help="binarized data of the experiment's dataset (default $DEEPNMT_DATA/<dataset>/bin)")
    p.add_argument("--data-root", help="root of the prepared datasets (default $DEEPNMT_DATA, else ./work/data)")
    p.add_argument("--checkpoint-root", help="root of all experiments' directories, where references to other "
                                             "experiments (a GPKD teacher) are found (default $DEEPNMT_CHECKPOINTS, "
                                             "else ./work/checkpoints)")


def add_train_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of ``deepnmt-repro train`` (also parsed by ``deepnmt-distill --repro-args``)."""
    p.add_argument("name", help="experiment name (deepnmt-repro list)")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands, run nothing")
    p.add_argument("--gpus", type=int, help="number of GPUs (all nodes) to compute --update-freq for; default: "
                                            "CUDA_VISIBLE_DEVICES / nvidia-smi; 0 = CPU")
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--fp16", action="store_const", const="fp16", dest="precision",
                      help="mixed precision with fp16 (fairseq's dynamic loss scaling); needs a GPU")
    prec.add_argument("--bf16", action="store_const", const="bf16", dest="precision",
                      help="mixed precision with bf16; needs a GPU")
    _paths_args(p)
    p.add_argument("--stage", action="append", help="run only this stage (repeatable)")
    p.add_argument("--max-tokens", type=int, help="tokens per GPU and forward pass (default 4096); the "
                                                  "update frequency is recomputed to keep tokens per update")
    p.add_argument("--average", type=int, help="K checkpoints averaged wherever a finished model is used "
                                               "(SKD teacher, student extraction); 1 = checkpoint_last.pt")
    p.add_argument("--skd-args", default="", help="extra flags for deepnmt-skd (one string)")
    p.add_argument("--cpu", action="store_true", help="train on the CPU")
    p.add_argument("--gpu-memory", help="memory per GPU (e.g. 80G, read as GiB): plan --max-tokens and "
                                        "--update-freq with the memory planner (deepnmt-repro plan) and "
                                        "refuse a plan that cannot fit")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="recompute each layer in the backward pass (fairseq --checkpoint-activations); "
                        "planned with --gpu-memory")
    d = p.add_argument_group("distributed (one process per GPU, started by torchrun / srun / by hand)")
    d.add_argument("--launcher", choices=["local", "torchrun", "slurm"], default="local",
                   help="local: one process, fairseq spawns one worker per visible GPU; torchrun / slurm: this "
                        "process is one rank, read from the launcher's environment")
    d.add_argument("--world-size", type=int, help="total number of processes (GPUs)")
    d.add_argument("--rank", type=int, help="this process's global rank")
    d.add_argument("--device-id", type=int, help="this process's GPU on its node")
    d.add_argument("--init-method", help="rendezvous, e.g. tcp://HOST:PORT or env://")
    return p


def train_parser() -> argparse.ArgumentParser:
    """A parser of ``deepnmt-repro train`` flags alone."""
    return add_train_arguments(parser(f"{PROG} train", TRAIN_HELP))


def build_parser() -> argparse.ArgumentParser:
    p = parser(PROG, __doc__)
    sub = subparsers(p, dest="command", metavar="COMMAND", required=True)
    ls = sub.add_parser("list", help="tables, rows and experiment names", description="Tables, rows and experiment "
                        "names of the registry.")
    ls.add_argument("--table", help="only this table (e.g. msc-t2)")
    ls.add_argument("--names", action="store_true", help="experiment names only, one a line")
    sh = sub.add_parser("show", help="an experiment's settings, notes and commands",
                        description="An experiment's settings, where each value comes from, and its commands.")
    sh.add_argument("name", help="experiment name (deepnmt-repro list)")
    sh.add_argument("--gpus", type=int, default=8, help="GPUs to plan the shown commands for")
    ar = sub.add_parser("arch", help="a named architecture: its settings, paper row and experiments",
                        description="What a named architecture (--arch NAME) sets, the paper's row it implements "
                                    "and the registry's experiments that train it; --list names them all.")
    ar.add_argument("name", nargs="?", help="a named architecture, e.g. msc_iwslt_36l")
    ar.add_argument("--list", action="store_true", help="every name, one a line")
    add_train_arguments(sub.add_parser("train", help="train an experiment (every stage, resumable)",
                                       description=TRAIN_HELP))
    pn = sub.add_parser("plan", help="will it fit: memory, --max-tokens, --update-freq, time",
                        description=PLAN_HELP)
    pn.add_argument("name", help="experiment name (deepnmt-repro list)")
    pn.add_argument("--gpu-memory", default="80G", help="memory per GPU, e.g. 24G, 40G, 80G (GiB; default 80G)")
    pn.add_argument("--gpus", type=int, default=8, help="number of GPUs (default 8, the papers')")
    pprec = pn.add_mutually_exclusive_group()
    pprec.add_argument("--bf16", action="store_const", const="bf16", dest="precision", default="bf16",
                       help="bf16 mixed precision (default)")
    pprec.add_argument("--fp32", action="store_const", const="fp32", dest="precision", help="fp32")
    pn.add_argument("--checkpoint-activations", action="store_true", help="plan with activation checkpointing")
    pn.add_argument("--gpu", default=None, help="the GPU of the time estimate (default: A100-80GB; "
                                                "A100-80GB, A100-40GB, H100-SXM, RTX-4090)")
    pn.add_argument("--json", action="store_true", help="print the plan as JSON")
    ev = sub.add_parser("evaluate", help="average, decode, score -> results.json", description=EVAL_HELP)
    ev.add_argument("name", help="experiment name (deepnmt-repro list)")
    ev.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ev.add_argument("--checkpoint-dir", help="directory with the checkpoints (default: the evaluation stage's "
                                             "directory); results.json is written there too")
    ev.add_argument("--checkpoint", help="evaluate this checkpoint file only (no averaging)")
    _paths_args(ev)
    ev.add_argument("--average", type=int, help="K last checkpoints (default: the paper's); 1 = checkpoint_last.pt")
    ev.add_argument("--subset", default="test", help="the split to decode")
    ev.add_argument("--beam", type=int, help="override the paper's beam (results go to results-beamB-lenpenL.json)")
    ev.add_argument("--lenpen", type=float, help="override the paper's length penalty")
    ev.add_argument("--batch-size", type=int, help="fairseq-generate's --batch-size")
    ev.add_argument("--cpu", action="store_true", default=None,
                    help="decode on the CPU (default when no GPU is seen and none was asked for: a Slurm "
                         "allocation with GPUs, DEEPNMT_REQUIRE_GPU=1 or --fp16 makes a missing GPU an error)")
    ev.add_argument("--allow-unfinished", action="store_true",
                    help="score the checkpoints even though the training stage has no .done marker yet "
                         "(default: refused, so that an afterok job never scores a half-trained model)")
    ev.add_argument("--fp16", action="store_true", help="decode in half precision (GPU)")
    ev.add_argument("--remove-bpe", help="fairseq-generate --remove-bpe (default: sentencepiece for data "
                                          "prepared with --spm, else subword_nmt)")
    ev.add_argument("--tag", help="results-TAG.json instead of results.json")
    ev.add_argument("--max-len-b", help="summarization (msc-cnndm-*): comma list of maximum summary lengths to "
                                        "try on valid (default: the experiment's grid)")
    tb = sub.add_parser("table", help="the papers' numbers next to ours", description=TABLE_HELP)
    tb.add_argument("--table", help="one table (keys: deepnmt-repro list)")
    tb.add_argument("--checkpoint-root", default=os.environ.get("DEEPNMT_CHECKPOINTS"),
                    help="where the experiments' results.json are (default $DEEPNMT_CHECKPOINTS, else "
                         "./work/checkpoints)")
    tb.add_argument("--output", help="write to this file instead of stdout")
    tb.add_argument("--docs", action="store_true", help="regenerate docs/reproduction.md (run from the repository root)")
    tb.add_argument("--check-docs", action="store_true", help="exit 1 if docs/reproduction.md is not up to date")
    pl = sub.add_parser("plot", help="the papers' figures from finished experiments", description=PLOT_HELP)
    pl.add_argument("key", nargs="?", help="figure key (--list)")
    pl.add_argument("--list", action="store_true", help="the figures, their experiments and our choices")
    pl.add_argument("--checkpoint-root", default=os.environ.get("DEEPNMT_CHECKPOINTS"),
                    help="where the experiments' directories are (default $DEEPNMT_CHECKPOINTS, else "
                         "./work/checkpoints)")
    pl.add_argument("--out", "--output", dest="out", default="figures", help="output directory")
    pl.add_argument("--overwrite", action="store_true", help="replace files of an earlier run")
    for name, what in (("write-configs", "write configs/*.yaml for fairseq-hydra-train"),
                       ("check-configs", "exit 1 if configs/ differs from the registry")):
        c = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        c.add_argument("--config-dir", help="the configs/ directory of a checkout (default ./configs; run from the "
                                            "repository root)")
    return p


def split_extra(argv: List[str]):
    """``(flags, extra)``: the words after ``--`` go to fairseq unchanged."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = split_extra(argv)
    p = build_parser()
    if not argv:  # no command: the overview of the commands, as a usage error
        p.print_help(sys.stderr)
        return 2
    a = p.parse_args(own)
    if extra and a.command not in ("train", "evaluate"):
        p.error(f"{a.command}: no fairseq flags after --")
    a.extra = extra
    return run(PROG, f"deepnmt_fairseq.repro.cli:cmd_{a.command.replace('-', '_')}", a,
               errors=("deepnmt_fairseq.repro.commands:ReproError",))


if __name__ == "__main__":
    sys.exit(main())
