"""From a registry entry to the exact commands, and running them.

Paths (all overridable):

* data: ``$DEEPNMT_DATA/<dataset>/bin`` (default ``work/data`` under the current directory;
  scripts/train.sh and scripts/evaluate.sh default to ``<repo>/work/data``), ``--data DIR``
  replaces the ``bin`` directory of the experiment's own dataset;
* checkpoints: ``$DEEPNMT_CHECKPOINTS/<experiment>`` (default ``work/checkpoints``, the same way),
  ``--save-dir DIR`` replaces it for the experiment being run; a multi-stage experiment
  keeps stage ``S`` in ``<save-dir>/S``; references to *other* experiments (a GPKD teacher)
  resolve under the checkpoint root (``--checkpoint-root`` or ``$DEEPNMT_CHECKPOINTS``).

Batch size: the paper's tokens per update T are kept on any number of GPUs W with
``--update-freq = ceil(T / (max_tokens * W))`` (and ``--max-tokens`` lowered to
``ceil(T / (W * update_freq))`` when W * max_tokens alone exceeds T), see
:func:`deepnmt_fairseq.repro.spec.batch_plan`.

The launch (GPUs, ranks, distributed flags), the DDP backend and the loud failures of the GPU
path are the cluster policy's (:mod:`deepnmt_fairseq.jobs.cluster`); the steps are
:class:`deepnmt_fairseq.jobs.stage.Stage` objects run by the one runner
(:class:`deepnmt_fairseq.jobs.runner.Runner`): every rank walks the same steps, training on all
ranks, averaging / SKD data / student extraction on rank 0 while the others wait for its done
marker (with a timeout; a failed rank-0 step ends them with its error).  Before any step starts,
the experiment's binarized dataset is checked (an error naming ``deepnmt-prepare-data``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..console import exe  # noqa: F401  (re-exported: repro.evaluate)
from ..distill import plan as gpkd_plan  # the one GPKD planner: averaging, SKD and extraction commands
from ..jobs import cluster
from ..jobs.cluster import Launch, detect_gpus, make_launch  # noqa: F401  (the registry's names for them)
from ..jobs.fairseq_argv import averaged_path, fairseq_train, recipe_flags, user_dir  # noqa: F401
from ..jobs.runner import Runner
from ..jobs.stage import JobError, Stage, make_log
from .spec import Experiment, ExtractStage, Recipe, Ref, SkdStage, TrainStage, batch_plan

# --user-dir of every fairseq command: the imported (installed) package itself
USER_DIR = Path(user_dir())
REFERENCE_GPUS = 8  # the papers' machines; used for configs/*.yaml


def default_work_dir() -> Path:
    """``work/`` under the current directory: where data and checkpoints go unless
    ``$DEEPNMT_DATA`` / ``$DEEPNMT_CHECKPOINTS`` or flags say otherwise."""
    return Path.cwd() / "work"


log = make_log("repro")

#: a clear, user-facing error (bad name, missing input, failed step, a launch that cannot work):
#: the job model's one error class, which ``deepnmt-repro`` reports
ReproError = JobError


# ---------------------------------------------------------------------- paths
@dataclass
class Paths:
    data_root: Path
    checkpoint_root: Path
    save_dir: Optional[Path] = None  # this experiment's directory (default: root/name)
    data: Optional[Path] = None  # this experiment's binarized data (default: data_root/dataset/bin)

    @classmethod
    def from_env(cls, data_root=None, checkpoint_root=None, save_dir=None, data=None, env=None) -> "Paths":
        env = os.environ if env is None else env
        dr = Path(data_root or env.get("DEEPNMT_DATA") or default_work_dir() / "data")
        cr = Path(checkpoint_root or env.get("DEEPNMT_CHECKPOINTS") or default_work_dir() / "checkpoints")
        return cls(dr.absolute(), cr.absolute(), Path(save_dir).absolute() if save_dir else None,
                   Path(data).absolute() if data else None)

    def exp_dir(self, exp: Experiment, current: Experiment) -> Path:
        if exp.name == current.name and self.save_dir is not None:
            return self.save_dir
        return self.checkpoint_root / exp.name

    def stage_dir(self, exp: Experiment, stage: str, current: Experiment) -> Path:
        base = self.exp_dir(exp, current)
        return base / stage if exp.multi_stage else base

    def dataset_bin(self, exp: Experiment, current: Experiment) -> Path:
        if exp.name == current.name and self.data is not None:
            return self.data
        return self.data_root / exp.dataset / "bin"

    def dataset_dir(self, exp: Experiment) -> Path:
        return self.data_root / exp.dataset


def average_count(exp: Experiment, override: Optional[int]) -> int:
    return override if override else exp.eval.average


def checkpoint_pattern(recipe: Recipe) -> str:
    return "update" if recipe.save_interval_updates else "epoch"


# ---------------------------------------------------------------------- options
@dataclass
class RunOptions:
    paths: Paths
    launch: Launch
    precision: Optional[str] = None  # "fp16" | "bf16"
    max_tokens: Optional[int] = None
    average: Optional[int] = None
    extra: List[str] = field(default_factory=list)  # appended to every fairseq-train command
    skd_args: List[str] = field(default_factory=list)
    stages: Optional[List[str]] = None
    placeholders: bool = False  # configs: env-var placeholders instead of absolute paths
    # stage -> --max-tokens planned by the memory planner (train --gpu-memory, repro/plan.py)
    stage_max_tokens: Dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------- steps
@dataclass(init=False)
class Step(Stage):
    """A stage of a registry experiment: the job model's :class:`Stage` with the experiment stage it
    belongs to (``stage``; ``name`` is ``stage/kind``)."""

    stage: str = ""

    def __init__(self, *args, stage: str = "", **kw):
        super().__init__(*args, **kw)
        self.stage = stage

    @property
    def out(self) -> Path:
        """The directory or file the step produces."""
        return self.output

    @property
    def comment(self) -> str:
        return self.what


def _step(stage: str, kind: str, st: Stage, **kw) -> Step:
    """A :class:`Step` of experiment stage ``stage`` from a planned :class:`Stage` (the GPKD planner's)."""
    fields = {k: getattr(st, k) for k in ("argv", "output", "marker", "log", "what", "done", "rank0_only")}
    fields.update(argv=st.resolved(), kind=kind, **kw)
    return Step(f"{stage}/{kind}", stage=stage, **fields)


def named_cad_ratio(arch: str) -> float:
    """CAD drop ratio a named architecture sets by default (its options), 0 without CAD."""
    return float(getattr(cluster.model_options(arch, []), "cad_drop_ratio", 0.0) or 0.0)


def ddp_backend(stage: TrainStage, launch: Optional[Launch] = None) -> str:
    """The training stage's ``--ddp-backend`` (:func:`deepnmt_fairseq.jobs.cluster.ddp_backend`, from the
    model's options); with a ``launch``, several CPU processes get ``legacy_ddp``."""
    cpus = launch.world_size if launch is not None and launch.cpu else 1
    return cluster.ddp_backend(stage.arch, stage.model_flags, stage.criterion, cpus)


class Planner:
    """Turns an experiment into steps for one launch."""

    def __init__(self, registry: Dict[str, Experiment], exp: Experiment, opts: RunOptions):
        self.registry, self.exp, self.opts = registry, exp, opts

    # ---- references
    def _target(self, ref: Ref) -> Experiment:
        return self.registry[ref.experiment] if ref.experiment else self.exp

    def stage_dir(self, exp: Experiment, stage: str) -> Path:
        return self.opts.paths.stage_dir(exp, stage, self.exp)

    def model_path(self, exp: Experiment, stage: str) -> Path:
        return averaged_path(self.stage_dir(exp, stage), average_count(exp, self.opts.average))

    def resume_path(self, exp: Experiment, stage: str) -> Path:
        """Averaged weights + the newest checkpoint's optimizer state (``Ref(..., "resume")``)."""
        return averaged_path(self.stage_dir(exp, stage), average_count(exp, self.opts.average), True)

    def resolve(self, ref: Ref) -> Path:
        exp = self._target(ref)
        d = self.stage_dir(exp, ref.stage)
        if ref.what == "model":
            return self.model_path(exp, ref.stage)
        if ref.what == "resume":
            return self.resume_path(exp, ref.stage)
        if ref.what == "last":
            return d / "checkpoint_last.pt"
        if ref.what == "skd":
            return d / "bin"
        if ref.what == "student":
            return d / "student-init.pt"
        return d

    def done_marker(self, exp: Experiment, stage_name: str) -> Path:
        stage = exp.stage(stage_name)
        d = self.stage_dir(exp, stage_name)
        if stage.kind == "skd":
            return d / "bin" / ".done"
        if stage.kind == "extract":
            return d / "student-init.pt"
        return d / ".done"

    def average_step(self, exp: Experiment, stage_name: str, resume: bool = False) -> Optional[Step]:
        k = average_count(exp, self.opts.average)
        if k <= 1:
            return None
        stage = exp.stage(stage_name)
        d = self.stage_dir(exp, stage_name)
        out = self.resume_path(exp, stage_name) if resume else self.model_path(exp, stage_name)
        st = gpkd_plan.average_stage(stage_name, d, k, keep_training_state=resume, out=out,
                                     by=checkpoint_pattern(stage.recipe), label=f"{exp.name}/{stage_name}")
        return _step(stage_name, "average", st, needs=[self.done_marker(exp, stage_name)], ok_if_output=True,
                     refresh=partial(refresh_average, out, d, log))

    # ---- checks before any step starts (every rank, before any process group)
    def preflight(self, dataset_of: Optional[Experiment] = None) -> None:
        """The GPU path's loud failures (:func:`deepnmt_fairseq.jobs.cluster.check_devices`) and, for a
        stage that reads its experiment's dataset, that dataset (an error naming deepnmt-prepare-data)."""
        cluster.check_devices(self.opts.launch, self.opts.precision, self.opts.extra)
        if dataset_of is not None:
            src, tgt = dataset_of.lang_pair
            cluster.check_dataset(self.opts.paths.dataset_bin(dataset_of, self.exp), src, tgt, dataset_of.dataset,
                                  self.opts.paths.data_root)

    # ---- stages
    def train_argv(self, stage: TrainStage) -> Tuple[List[str], Dict[str, int]]:
        exp, opts = self.exp, self.opts
        src, tgt = exp.lang_pair
        data = self.resolve(stage.data) if stage.data else opts.paths.dataset_bin(exp, exp)
        save = self.stage_dir(exp, stage.name)
        r = stage.recipe
        max_tokens = opts.max_tokens or opts.stage_max_tokens.get(stage.name) or r.max_tokens
        uf, mt, eff = batch_plan(r.tokens_per_update, max_tokens, opts.launch.world_size)
        argv = fairseq_train(data, ["--task", "translation", "--source-lang", src, "--target-lang", tgt,
                                    "--arch", stage.arch, *stage.model_flags, "--criterion", stage.criterion,
                                    "--label-smoothing", f"{r.label_smoothing:g}", *stage.criterion_flags],
                             recipe_flags(r), ["--max-tokens", mt, "--update-freq", uf,
                                               "--ddp-backend", ddp_backend(stage, opts.launch), "--save-dir", save,
                                               "--skip-invalid-size-inputs-valid-test", "--log-format", "simple",
                                               "--log-interval", "100"], resolve=True)
        if stage.init:
            how, ref = stage.init
            argv += ["--finetune-from-model" if how == "finetune" else "--continue-once", str(self.resolve(ref))]
        if opts.precision:
            argv.append(f"--{opts.precision}")
        argv += opts.launch.fairseq_flags()
        if opts.launch.cpu:
            argv += ["--num-workers", "0"]
        argv += opts.extra
        batch = {"tokens_per_update": r.tokens_per_update, "world_size": opts.launch.world_size,
                 "max_tokens": mt, "update_freq": uf, "effective_tokens_per_update": eff}
        return argv, batch

    def plan(self) -> List[Step]:
        exp, opts = self.exp, self.opts
        steps: List[Step] = []
        wanted = set(opts.stages) if opts.stages else None
        if wanted:
            unknown = wanted - {s.name for s in exp.stages}
            if unknown:
                raise ReproError(f"{exp.name} has no stage(s) {sorted(unknown)}; stages: {[s.name for s in exp.stages]}")
        averaged = set()

        def need_model(ref: Ref):
            """Average the referenced stage's checkpoints first (once) when a step uses its model."""
            if ref.what not in ("model", "resume"):
                return
            target = self._target(ref)
            key = (target.name, ref.stage, ref.what)
            if key in averaged:
                return
            averaged.add(key)
            step = self.average_step(target, ref.stage, resume=ref.what == "resume")
            if step is not None:
                steps.append(step)

        for stage in exp.stages:
            if wanted and stage.name not in wanted:
                continue
            d = self.stage_dir(exp, stage.name)
            needs = []
            for ref in ([stage.data, stage.init[1] if stage.init else None] if stage.kind == "train" else [stage.teacher]):
                if ref is None:
                    continue
                target = self._target(ref)
                needs.append(self.done_marker(target, ref.stage))
                need_model(ref)
            if isinstance(stage, TrainStage):
                argv, batch = self.train_argv(stage)
                check = partial(self.preflight, exp if stage.data is None else None)
                steps.append(Step(f"{stage.name}/train", argv, d, marker=True, log=d / "train.log", kind="train",
                                  stage=stage.name, needs=needs, batch=batch, history=True, preflight=check,
                                  what=f"train {exp.name}/{stage.name} ({stage.arch}, {stage.criterion}, "
                                       f"ddp {ddp_backend(stage)})"))
            elif isinstance(stage, SkdStage):
                teacher_exp = self._target(stage.teacher)
                data = opts.paths.dataset_bin(teacher_exp, exp)
                extra = ["--shards", stage.shards, "--beam", stage.beam, "--lenpen", f"{stage.lenpen:g}"]
                extra += ["--cpu", "--batch-size", "64"] if opts.launch.cpu else ["--max-tokens", stage.max_tokens]
                if opts.precision == "fp16":
                    extra.append("--fp16")
                gpus = opts.launch.local_gpus() if opts.launch.rank is not None else opts.launch.world_size
                if not opts.launch.cpu and gpus > 1:  # one shard per GPU of rank 0's node at a time
                    extra += ["--jobs", gpus]
                st = gpkd_plan.skd_stage(data, self.resolve(stage.teacher), d / "bin", extra=[*extra, *opts.skd_args])
                steps.append(_step(stage.name, "skd", st, output=d / "bin", done=st.done_file(), log=d / "skd.log",
                                   needs=needs, preflight=self.preflight, what=f"SKD data: the teacher translates the training set (beam "
                                                     f"{stage.beam}, lenpen {stage.lenpen:g}); resumable by shard"))
            elif isinstance(stage, ExtractStage):
                out = d / "student-init.pt"
                st = gpkd_plan.extract_stage(self.resolve(stage.teacher), stage.encoder_group_size,
                                             stage.decoder_group_size, out, stage.select, stage.seed)
                steps.append(_step(stage.name, "extract", st, needs=needs,
                                   what=f"student: one layer per group (h_enc={stage.encoder_group_size}, "
                                        f"h_dec={stage.decoder_group_size}, {stage.select})"))
        return steps


# ---------------------------------------------------------------------- running
def print_plan(steps: Sequence[Step]) -> None:
    """``--dry-run``: each step's description, inputs, batch arithmetic and exact command."""
    for s in steps:
        print(f"# {s.comment}")
        for n in s.needs:
            print(f"#   needs: {n}")
        if s.batch:
            b = s.batch
            print(f"#   batch: {b['tokens_per_update']} tokens/update = {b['world_size']} GPU(s) x "
                  f"{b['max_tokens']} max-tokens x update-freq {b['update_freq']} "
                  f"(effective {b['effective_tokens_per_update']})")
        print(s.shell())


def runner(launch: Launch, state_dir: Optional[Path] = None) -> Runner:
    """The one runner as the registry uses it: every output line on the console, log lines on stderr;
    ``state_dir``: the experiment's folder, for the job lock, rank 0's token and heartbeat (issue 82)."""
    return Runner("repro", echo=None, echo_all=True, in_process=False, launch=launch, error=ReproError,
                  numbered=False, state_dir=state_dir)


def run_steps(steps: Sequence[Step], launch: Launch, dry_run: bool = False, precision: Optional[str] = None,
              state_dir: Optional[Path] = None) -> int:
    """Print (``dry_run``) or run the planned steps on this launch (the GPU path's checks first);
    ``state_dir``: the experiment's folder (``deepnmt-repro train`` passes it: one job per folder,
    the shared-root check, rank 0's heartbeat)."""
    if dry_run:
        print_plan(steps)
        return 0
    cluster.check_devices(launch, precision)
    runner(launch, state_dir).run(steps)
    return 0


def refresh_average(avg: Path, stage_dir: Path, log=log) -> None:
    """An averaged model older than the newest checkpoint of its stage is set aside (training went on)."""
    if stale_average(avg, stage_dir):
        old = set_aside(avg)
        log(f"{avg.name} predates the newest checkpoint of {stage_dir}; kept it as {old.name}")


def stale_average(avg: Path, stage_dir: Path) -> bool:
    """An averaged model older than the newest checkpoint (training went on after averaging)."""
    last = stage_dir / "checkpoint_last.pt"
    return avg.exists() and last.exists() and last.stat().st_mtime > avg.stat().st_mtime + 1


def set_aside(path: Path) -> Path:
    """Rename ``path`` to a free ``<stem>.old-N<suffix>`` (nothing is deleted)."""
    n = 1
    while True:
        cand = path.with_name(f"{path.stem}.old-{n}{path.suffix}")
        if not cand.exists():
            shutil.move(str(path), str(cand))
            return cand
        n += 1
