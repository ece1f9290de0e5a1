"""``deepnmt-repro``: the papers' experiments from the registry (scripts/train.sh,
scripts/evaluate.sh and the Slurm / torchrun templates call it).

    deepnmt-repro list [--table KEY] [--names]      # tables, rows, experiment names
    deepnmt-repro show NAME                         # settings, notes, commands
    deepnmt-repro train NAME [--dry-run] [--gpus N] ... [-- fairseq-train flags]
    deepnmt-repro evaluate NAME [--dry-run] [--checkpoint-dir DIR] ... [-- fairseq-generate flags]
    deepnmt-repro table [--table KEY] [--checkpoint-root DIR] [--docs | --check-docs]
    deepnmt-repro write-configs [--config-dir configs]   # configs/*.yaml for fairseq-hydra-train
    deepnmt-repro check-configs [--config-dir configs]   # exit 1 if configs/ drifted

Also ``python -m deepnmt_fairseq.repro ...``.  Data: ``$DEEPNMT_DATA/<dataset>/bin``,
checkpoints: ``$DEEPNMT_CHECKPOINTS/NAME`` (both default to ``work/`` under the current
directory; scripts/train.sh and scripts/evaluate.sh default to ``<repo>/work``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .commands import Paths, Planner, ReproError, RunOptions, ddp_backend, make_launch, run_steps
from .spec import DATASETS, Experiment, Table

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


def _split_extra(argv: List[str]):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _get(registry: Dict[str, Experiment], name: str) -> Experiment:
    if name not in registry:
        import difflib

        close = difflib.get_close_matches(name, list(registry), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ReproError(f"unknown experiment {name!r}{hint} ({PROG} list)")
    return registry[name]


def _paths_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--save-dir", help="this experiment's directory (default $DEEPNMT_CHECKPOINTS/NAME, "
                                      "else ./work/checkpoints/NAME); stages of multi-stage experiments "
                                      "go to DIR/STAGE")
    p.add_argument("--data", help="binarized data of the experiment's dataset (default $DEEPNMT_DATA/<dataset>/bin)")
    p.add_argument("--data-root", help="root of the prepared datasets (default $DEEPNMT_DATA, else ./work/data)")
    p.add_argument("--checkpoint-root", help="root of all experiments' directories, where references to other "
                                             "experiments (a GPKD teacher) are found (default $DEEPNMT_CHECKPOINTS, "
                                             "else ./work/checkpoints)")


def train_parser() -> argparse.ArgumentParser:
    """The flags of ``deepnmt-repro train`` (also read by ``deepnmt-distill --teacher-row``)."""
    p = argparse.ArgumentParser(prog=f"{PROG} train", description=TRAIN_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands, run nothing")
    p.add_argument("--gpus", type=int, help="number of GPUs (all nodes) to compute --update-freq for; default: "
                                            "CUDA_VISIBLE_DEVICES / nvidia-smi; 0 = CPU")
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--fp16", action="store_const", const="fp16", dest="precision")
    prec.add_argument("--bf16", action="store_const", const="bf16", dest="precision")
    _paths_args(p)
    p.add_argument("--stage", action="append", help="run only this stage (repeatable)")
    p.add_argument("--max-tokens", type=int, help="tokens per GPU and forward pass (default 4096); the "
                                                  "update frequency is recomputed to keep tokens per update")
    p.add_argument("--average", type=int, help="K checkpoints averaged wherever a finished model is used "
                                               "(SKD teacher, student extraction); 1 = checkpoint_last.pt")
    p.add_argument("--skd-args", default="", help="extra flags for deepnmt-skd (one string)")
    p.add_argument("--cpu", action="store_true", help="train on the CPU")
    d = p.add_argument_group("distributed (one process per GPU, started by torchrun / srun / by hand)")
    d.add_argument("--launcher", choices=["local", "torchrun", "slurm"], default="local",
                   help="local: one process, fairseq spawns one worker per visible GPU; torchrun / slurm: this "
                        "process is one rank, read from the launcher's environment")
    d.add_argument("--world-size", type=int, help="total number of processes (GPUs)")
    d.add_argument("--rank", type=int, help="this process's global rank")
    d.add_argument("--device-id", type=int, help="this process's GPU on its node")
    d.add_argument("--init-method", help="rendezvous, e.g. tcp://HOST:PORT or env://")
    return p


def train_options(a: argparse.Namespace, extra: List[str], registry) -> Tuple[Experiment, RunOptions]:
    """The experiment and run options of parsed ``deepnmt-repro train`` flags."""
    exp = _get(registry, a.name)
    launch = make_launch(a.launcher, a.gpus, a.world_size, a.rank, a.device_id, a.init_method, a.cpu)
    paths = Paths.from_env(a.data_root, a.checkpoint_root, a.save_dir, a.data)
    return exp, RunOptions(paths=paths, launch=launch, precision=a.precision, max_tokens=a.max_tokens,
                           average=a.average, extra=extra, skd_args=shlex.split(a.skd_args), stages=a.stage)


def cmd_train(argv: List[str], registry) -> int:
    argv, extra = _split_extra(argv)
    a = train_parser().parse_args(argv)
    exp, opts = train_options(a, extra, registry)
    launch, paths = opts.launch, opts.paths
    steps = Planner(registry, exp, opts).plan()
    if a.dry_run:
        print(f"# {exp.name}: {exp.title}")
        print(f"# {launch.world_size} process(es) ({launch.source}); data root {paths.data_root}; "
              f"checkpoints {paths.exp_dir(exp, exp)}")
    elif launch.rank is None and not launch.cpu and launch.world_size > launch.gpus_found:
        raise ReproError(f"--gpus {launch.world_size} but this node has {launch.gpus_found} GPU(s): one process "
                         "trains on the local GPUs only; for several nodes use scripts/slurm/train.sbatch or "
                         "scripts/torchrun_example.sh (--dry-run shows the plan for any --gpus)")
    elif launch.cpu and launch.gpus_found == 0 and not a.cpu:
        print("[repro] no GPU found: training on the CPU (--gpus N to plan for N GPUs)", file=sys.stderr)
    return run_steps(steps, launch, dry_run=a.dry_run)


def cmd_evaluate(argv: List[str], registry) -> int:
    from .evaluate import EvalOptions, Evaluator

    argv, extra = _split_extra(argv)
    p = argparse.ArgumentParser(prog=f"{PROG} evaluate", description=EVAL_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--checkpoint-dir", help="directory with the checkpoints (default: the evaluation stage's "
                                            "directory); results.json is written there too")
    p.add_argument("--checkpoint", help="evaluate this checkpoint file only (no averaging)")
    _paths_args(p)
    p.add_argument("--average", type=int, help="K last checkpoints (default: the paper's); 1 = checkpoint_last.pt")
    p.add_argument("--subset", default="test")
    p.add_argument("--beam", type=int, help="override the paper's beam (results go to results-beamB-lenpenL.json)")
    p.add_argument("--lenpen", type=float)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--cpu", action="store_true", default=None, help="decode on the CPU (default when no GPU)")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--remove-bpe", help="fairseq-generate --remove-bpe (default: sentencepiece for data "
                                         "prepared with --spm, else subword_nmt)")
    p.add_argument("--tag", help="results-TAG.json instead of results.json")
    p.add_argument("--max-len-b", help="summarization (msc-cnndm-*): comma list of maximum summary lengths to "
                                       "try on valid (default: the experiment's grid)")
    a = p.parse_args(argv)
    exp = _get(registry, a.name)
    paths = Paths.from_env(a.data_root, a.checkpoint_root, a.save_dir, a.data)
    opts = EvalOptions(paths=paths, checkpoint_dir=Path(a.checkpoint_dir).absolute() if a.checkpoint_dir else None,
                       checkpoint=Path(a.checkpoint).absolute() if a.checkpoint else None, average=a.average,
                       subset=a.subset, beam=a.beam, lenpen=a.lenpen, batch_size=a.batch_size, cpu=a.cpu,
                       fp16=a.fp16, remove_bpe=a.remove_bpe, tag=a.tag, extra=extra, dry_run=a.dry_run,
                       max_len_b=[int(x) for x in a.max_len_b.split(",")] if a.max_len_b else None)
    evaluator = Evaluator
    if exp.eval.primary.startswith("rouge"):  # MSC Appendix A summarization: ROUGE, max length tuned on valid
        from .summarization import SummarizationEvaluator as evaluator
    evaluator(exp, registry, opts).run()
    return 0


def cmd_list(argv: List[str], registry, tables: List[Table]) -> int:
    p = argparse.ArgumentParser(prog=f"{PROG} list")
    p.add_argument("--table", help="only this table (e.g. msc-t2)")
    p.add_argument("--names", action="store_true", help="experiment names only, one a line")
    a = p.parse_args(argv)
    if a.names:
        print("\n".join(registry))
        return 0
    for t in tables:
        if a.table and t.key != a.table:
            continue
        print(f"[{t.key}] {t.paper.split(',')[0]} - {t.title}")
        for r in t.rows:
            paper = r.paper.get("bleu", "")
            print(f"  {r.label:<55} {str(paper):>12}  {r.experiment or '(no command: ' + r.note + ')'}")
    return 0


def cmd_show(argv: List[str], registry) -> int:
    p = argparse.ArgumentParser(prog=f"{PROG} show")
    p.add_argument("name")
    p.add_argument("--gpus", type=int, default=8)
    a = p.parse_args(argv)
    exp = _get(registry, a.name)
    src, tgt = DATASETS[exp.dataset]
    print(f"{exp.name}: {exp.title}\n  paper: {exp.paper}\n  dataset: {exp.dataset} ({src}->{tgt})")
    for s in exp.stages:
        if s.kind == "train":
            r = s.recipe
            print(f"  stage {s.name}: fairseq-train --arch {s.arch} {' '.join(s.model_flags)} --criterion {s.criterion} "
                  f"{' '.join(s.criterion_flags)}  [ddp {ddp_backend(s)}]")
            try:
                from .hydra_config import resolved_model

                print(f"    model: {resolved_model(registry, exp, s)}")
            except ImportError:  # fairseq not installed: the registry alone
                pass
            print(f"    lr {r.lr:g} ({r.lr_scheduler}, warmup {r.warmup_updates}), adam {r.adam_betas} eps {r.adam_eps:g}, "
                  f"label smoothing {r.label_smoothing:g}, {r.tokens_per_update} tokens/update, "
                  f"{f'{r.max_update} updates' if r.max_update else 'no update limit (--max-epoch)'}, "
                  f"save {r.save} keep {r.keep}")
            if s.data:
                print(f"    data: {s.data}")
            if s.init:
                print(f"    init: {s.init[0]} from {s.init[1]}")
            for k, v in r.notes:
                print(f"    note [{k}]: {v}")
        else:
            print(f"  stage {s.name}: {s.kind} {s}")
    e = exp.eval
    print(f"  evaluation: beam {e.beam}, lenpen {e.lenpen:g}, {e.mode} of the last {e.average} checkpoints, "
          f"report {e.primary}")
    for n in e.notes:
        print(f"    note: {n}")
    for n in exp.notes:
        print(f"  note: {n}")
    print(f"\n  {PROG} train {exp.name} && {PROG} evaluate {exp.name}"
          f"\n  (from a checkout: scripts/train.sh {exp.name} && scripts/evaluate.sh {exp.name})")
    return 0


def cmd_configs(cmd: str, argv: List[str], registry) -> int:
    """write-configs / check-configs: configs/*.yaml of a checkout (not part of the wheel)."""
    from .hydra_config import main_check, main_write

    p = argparse.ArgumentParser(prog=f"{PROG} {cmd}")
    p.add_argument("--config-dir", help="the configs/ directory of a checkout (default ./configs; run from the "
                                        "repository root)")
    a = p.parse_args(argv)
    config_dir = Path(a.config_dir or "configs")
    if not config_dir.is_dir() and (cmd == "check-configs" or a.config_dir is None):
        raise ReproError(f"no configs directory {config_dir.absolute()}: run from the repository root or pass "
                         "--config-dir DIR (the configs are part of the repository, not of the installed package)")
    return main_write(registry, config_dir) if cmd == "write-configs" else main_check(registry, config_dir)


COMMANDS = ("list", "show", "train", "evaluate", "table", "plot", "write-configs", "check-configs")


def main(argv: Optional[List[str]] = None) -> int:
    from ..console import quiet_known_warnings

    quiet_known_warnings()  # known-harmless hydra/torch/fairseq warnings (deepnmt_fairseq/console.py)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd not in COMMANDS:
            raise ReproError(f"unknown command {cmd!r} ({', '.join(COMMANDS)})")
        if cmd == "table":
            from .tables import main as table_main

            return table_main(rest)
        if cmd == "plot":  # the papers' figures (deepnmt_fairseq/repro/figures.py)
            from .figures import main as plot_main

            return plot_main(rest)
        from .registry import EXPERIMENTS as registry
        from .registry import TABLES as tables

        if cmd == "train":
            return cmd_train(rest, registry)
        if cmd == "evaluate":
            return cmd_evaluate(rest, registry)
        if cmd == "list":
            return cmd_list(rest, registry, tables)
        if cmd == "show":
            return cmd_show(rest, registry)
        return cmd_configs(cmd, rest, registry)
    except ReproError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
