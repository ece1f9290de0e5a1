"""The sub-commands of ``deepnmt-repro`` (their arguments and help: :mod:`deepnmt_cli.repro`):
each ``cmd_NAME(args)`` takes the parsed arguments; a :class:`ReproError` is a user-facing
error (one line, exit 1)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from .architecture import cmd_arch  # noqa: F401  (deepnmt-repro arch)
from .commands import Paths, Planner, ReproError, RunOptions, ddp_backend, make_launch, run_steps
from .spec import DATASETS, Experiment, Table

PROG = "deepnmt-repro"

def _get(registry: Dict[str, Experiment], name: str) -> Experiment:
    if name not in registry:
        import difflib

        close = difflib.get_close_matches(name, list(registry), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ReproError(f"unknown experiment {name!r}{hint} ({PROG} list)")
    return registry[name]


def train_options(a: argparse.Namespace, extra: List[str], registry) -> Tuple[Experiment, RunOptions]:
    """The experiment and run options of parsed ``deepnmt-repro train`` flags."""
    exp = _get(registry, a.name)
    launch = make_launch(a.launcher, a.gpus, a.world_size, a.rank, a.device_id, a.init_method, a.cpu)
    paths = Paths.from_env(a.data_root, a.checkpoint_root, a.save_dir, a.data)
    return exp, RunOptions(paths=paths, launch=launch, precision=a.precision, max_tokens=a.max_tokens,
                           average=a.average, extra=extra, skd_args=shlex.split(a.skd_args), stages=a.stage)


def cmd_train(a: argparse.Namespace) -> int:
    from .registry import EXPERIMENTS as registry

    exp, opts = train_options(a, a.extra, registry)
    launch, paths = opts.launch, opts.paths
    plans = memory_plan(a, exp, opts)
    steps = Planner(registry, exp, opts).plan()
    if a.dry_run:
        print(f"# {exp.name}: {exp.title}")
        print(f"# {launch.world_size} process(es) ({launch.source}); data root {paths.data_root}; "
              f"checkpoints {paths.exp_dir(exp, exp)}")
        for p in plans:
            print(f"# memory plan {p.stage}: {p.memory_gib:g} GiB per GPU, {p.precision}"
                  f"{' + checkpointing' if p.checkpoint else ''}: largest --max-tokens {p.max_tokens} "
                  f"(deepnmt-repro plan {exp.name})")
    elif launch.rank is None and not launch.cpu and launch.world_size > launch.gpus_found:
        raise ReproError(f"--gpus {launch.world_size} but this node has {launch.gpus_found} GPU(s): one process "
                         "trains on the local GPUs only; for several nodes use scripts/slurm/train.sbatch or "
                         "scripts/torchrun_example.sh (--dry-run shows the plan for any --gpus)")
    elif launch.cpu and launch.gpus_found == 0 and not a.cpu:
        print("[repro] no GPU found: training on the CPU (--gpus N to plan for N GPUs)", file=sys.stderr)
    return run_steps(steps, launch, dry_run=a.dry_run, state_dir=paths.exp_dir(exp, exp))


def memory_plan(a: argparse.Namespace, exp: Experiment, opts: RunOptions) -> list:
    """``train --gpu-memory M``: plan each training stage (:mod:`.plan`) and write its largest
    ``--max-tokens`` into the options (``--update-freq`` follows, the paper's batch kept); a stage
    that cannot fit even its longest sentence is refused with the planner's message."""
    ckpt = bool(getattr(a, "checkpoint_activations", False))
    if ckpt:
        opts.extra = ["--checkpoint-activations", *opts.extra]
    if not getattr(a, "gpu_memory", None):
        return []
    from .plan import PlanError, parse_memory, plan_stage, refusal

    if a.max_tokens:
        raise ReproError("--max-tokens and --gpu-memory: give one (--gpu-memory plans --max-tokens)")
    if opts.launch.cpu:
        raise ReproError("--gpu-memory plans GPUs: give --gpus N (N >= 1)")
    try:
        memory = parse_memory(a.gpu_memory)
        precision = "fp32" if opts.precision is None else "bf16"  # fp16 and bf16 keep the same bytes
        plans = [plan_stage(exp, s, opts.launch.world_size, memory, precision, ckpt)
                 for s in exp.train_stages if not opts.stages or s.name in opts.stages]
    except PlanError as e:
        raise ReproError(str(e)) from None
    for p in plans:
        if not p.fits:
            raise ReproError(refusal(p))
    opts.stage_max_tokens = {p.stage: p.max_tokens for p in plans}
    return plans


def cmd_plan(a: argparse.Namespace) -> int:
    import json

    from .plan import DEFAULT_GPU, GPUS, PlanError, describe, parse_memory, plan_experiment
    from .registry import EXPERIMENTS as registry

    exp = _get(registry, a.name)
    gpu = a.gpu or DEFAULT_GPU
    if gpu not in GPUS:
        raise ReproError(f"--gpu {gpu}: unknown; known: {', '.join(GPUS)}")
    try:
        plans = plan_experiment(exp, a.gpus, parse_memory(a.gpu_memory), a.precision, a.checkpoint_activations)
    except PlanError as e:
        raise ReproError(str(e)) from None
    if a.json:
        print(json.dumps([dict(vars(p), seconds_per_update=p.seconds_per_update(gpu), fits=p.fits)
                          for p in plans], indent=1))
        return 0
    print("\n".join(describe(p, gpu) for p in plans))
    return 0


def cmd_evaluate(a: argparse.Namespace) -> int:
    from .evaluate import EvalOptions, Evaluator
    from .registry import EXPERIMENTS as registry

    extra = a.extra
    exp = _get(registry, a.name)
    paths = Paths.from_env(a.data_root, a.checkpoint_root, a.save_dir, a.data)
    opts = EvalOptions(paths=paths, checkpoint_dir=Path(a.checkpoint_dir).absolute() if a.checkpoint_dir else None,
                       checkpoint=Path(a.checkpoint).absolute() if a.checkpoint else None, average=a.average,
                       subset=a.subset, beam=a.beam, lenpen=a.lenpen, batch_size=a.batch_size, cpu=a.cpu,
                       fp16=a.fp16, remove_bpe=a.remove_bpe, tag=a.tag, extra=extra, dry_run=a.dry_run,
                       allow_unfinished=getattr(a, "allow_unfinished", False),
                       max_len_b=[int(x) for x in a.max_len_b.split(",")] if a.max_len_b else None)
    evaluator = Evaluator
    if exp.eval.primary.startswith("rouge"):  # MSC Appendix A summarization: ROUGE, max length tuned on valid
        from .summarization import SummarizationEvaluator as evaluator
    evaluator(exp, registry, opts).run()
    return 0


def cmd_list(a: argparse.Namespace) -> int:
    from .registry import EXPERIMENTS as registry
    from .registry import TABLES as tables

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


def cmd_show(a: argparse.Namespace) -> int:
    from .registry import EXPERIMENTS as registry

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
            print(f"    lr {r.lr:g} ({r.lr_scheduler}, warmup {r.warmup_updates}), {r.optimizer} {r.adam_betas} eps {r.adam_eps:g}, "
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


def _configs(cmd: str, a: argparse.Namespace) -> int:
    """write-configs / check-configs: configs/*.yaml of a checkout (not part of the wheel)."""
    from .hydra_config import main_check, main_write
    from .registry import EXPERIMENTS as registry

    config_dir = Path(a.config_dir or "configs")
    if not config_dir.is_dir() and (cmd == "check-configs" or a.config_dir is None):
        raise ReproError(f"no configs directory {config_dir.absolute()}: run from the repository root or pass "
                         "--config-dir DIR (the configs are part of the repository, not of the installed package)")
    return main_write(registry, config_dir) if cmd == "write-configs" else main_check(registry, config_dir)


def cmd_write_configs(a: argparse.Namespace) -> int:
    return _configs("write-configs", a)


def cmd_check_configs(a: argparse.Namespace) -> int:
    return _configs("check-configs", a)


def cmd_table(a: argparse.Namespace) -> int:
    from .tables import main as table_main

    return table_main(a)


def cmd_plot(a: argparse.Namespace) -> int:  # the papers' figures (deepnmt_fairseq/repro/figures.py)
    from .figures import main as plot_main

    return plot_main(a)
