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

DDP backend (:func:`ddp_backend`): ``legacy_ddp`` (fairseq's ``no_c10d``: gradients are
all-reduced explicitly after the backward pass) for

* the ``collapse_reducing`` criterion - it calls ``model.encoder``/``model.decoder``
  directly (two or three decoder passes per step), i.e. *around* the DDP wrapper's
  ``forward``; c10d DDP would then not synchronise the gradients;
* stochastic structure: CAD with 0 < p < 1, skipping sub-layer / stochastic layers,
  LayerDrop, group permutation.  The plugin keeps skipped parameters in the graph (zero
  gradients), so c10d would work too, but legacy_ddp does not depend on it and is what the
  GPKD authors used (``--ddp-backend no_c10d``).

Everything else keeps fairseq's default ``c10d`` (overlaps the all-reduce with the backward
pass: faster for plain deep models).

Several processes (torchrun / Slurm ranks): every rank walks the same steps; training steps
run on all ranks, the others (averaging, SKD data, student extraction) on rank 0 while the
other ranks wait for its done marker.  A non-zero rank waits for rank 0's marker of any
input produced by this run before it checks its inputs (:func:`run_steps`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .. import USER_DIR as _USER_DIR
from ..console import child_env, exe
from ..distill import plan as gpkd_plan  # the one GPKD planner: averaging, SKD and extraction commands
from ..models.architectures import ARCHS, cad_defaults
from .spec import Experiment, ExtractStage, Recipe, Ref, SkdStage, TrainStage, batch_plan

# --user-dir of every fairseq command: the imported (installed) package itself
USER_DIR = Path(_USER_DIR)
REFERENCE_GPUS = 8  # the papers' machines; used for configs/*.yaml
WAIT_POLL = 30.0  # seconds between looks at rank 0's done markers


def default_work_dir() -> Path:
    """``work/`` under the current directory: where data and checkpoints go unless
    ``$DEEPNMT_DATA`` / ``$DEEPNMT_CHECKPOINTS`` or flags say otherwise."""
    return Path.cwd() / "work"


def log(msg: str) -> None:
    print(f"[repro {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class ReproError(RuntimeError):
    """A clear, user-facing error (bad name, missing input, failed step)."""


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


# ---------------------------------------------------------------------- launch
@dataclass
class Launch:
    """How many processes train and which one this is.

    ``rank is None``: one local process; fairseq spawns one worker per visible GPU.
    Otherwise this process is one rank of a job started by torchrun / srun / by hand."""

    world_size: int
    gpus_found: int
    rank: Optional[int] = None
    device_id: Optional[int] = None
    init_method: Optional[str] = None
    cpu: bool = False
    source: str = ""

    @property
    def is_rank0(self) -> bool:
        return not self.rank

    def fairseq_flags(self) -> List[str]:
        flags: List[str] = []
        if self.cpu:
            flags.append("--cpu")
        if self.rank is None:
            if self.world_size > 1:
                flags += ["--distributed-world-size", str(self.world_size)]
            return flags
        flags += ["--distributed-world-size", str(self.world_size), "--distributed-rank", str(self.rank),
                  "--distributed-init-method", self.init_method or "env://", "--distributed-no-spawn"]
        if self.cpu:
            flags += ["--distributed-backend", "gloo"]
        else:
            flags += ["--device-id", str(self.device_id or 0)]
        return flags


def detect_gpus(env=None) -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else ``nvidia-smi -L`` (else the
    driver's /proc/driver/nvidia/gpus)."""
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [x.strip() for x in cvd.split(",") if x.strip()]
        return 0 if not ids or ids[0] == "-1" else len(ids)
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired, OSError):
        # no nvidia-smi (some containers): the driver lists its GPUs under /proc
        proc = Path("/proc/driver/nvidia/gpus")
        return len(list(proc.iterdir())) if proc.is_dir() else 0
    return sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU ")) if out.returncode == 0 else 0


def _env_int(env, key) -> int:
    try:
        return int(env[key])
    except KeyError:
        raise ReproError(f"{key} is not set (expected from the launcher)") from None
    except ValueError:
        raise ReproError(f"{key}={env[key]!r} is not an integer") from None


def make_launch(launcher: str = "local", gpus: Optional[int] = None, world_size: Optional[int] = None,
                rank: Optional[int] = None, device_id: Optional[int] = None, init_method: Optional[str] = None,
                cpu: bool = False, env=None) -> Launch:
    """Resolve the world size and this process's rank.

    local: W = --gpus, else the GPUs found (CUDA_VISIBLE_DEVICES / nvidia-smi), else 1 CPU process.
    torchrun: W, rank, local rank from WORLD_SIZE / RANK / LOCAL_RANK, init env:// (MASTER_ADDR/PORT).
    slurm: from SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID, init tcp://$MASTER_ADDR:$MASTER_PORT.
    Explicit --world-size/--rank/--device-id/--init-method win over the environment."""
    env = os.environ if env is None else env
    found = detect_gpus(env)
    if launcher == "local":
        if rank is not None:
            if not world_size:
                raise ReproError("--rank needs --world-size")
            return Launch(world_size, found, rank, device_id, init_method or "env://", cpu or (found == 0 and not gpus),
                          "explicit rank")
        if gpus is not None and gpus < 0:
            raise ReproError("--gpus must be >= 0")
        n = gpus if gpus is not None else found
        use_cpu = cpu or n == 0
        return Launch(max(1, n) if not cpu else 1, found, cpu=use_cpu,
                      source="--gpus" if gpus is not None else ("CUDA_VISIBLE_DEVICES/nvidia-smi" if found else "no GPU: CPU"))
    if launcher == "torchrun":
        w = world_size or _env_int(env, "WORLD_SIZE")
        r = rank if rank is not None else _env_int(env, "RANK")
        d = device_id if device_id is not None else (0 if found == 1 else _env_int(env, "LOCAL_RANK"))
        return Launch(w, found, r, d, init_method or "env://", cpu or found == 0, "torchrun environment")
    if launcher == "slurm":
        w = world_size or _env_int(env, "SLURM_NTASKS")
        r = rank if rank is not None else _env_int(env, "SLURM_PROCID")
        # a task bound to one GPU (--gpus-per-task=1) sees it as device 0
        d = device_id if device_id is not None else (0 if found == 1 else _env_int(env, "SLURM_LOCALID"))
        if init_method is None:
            if "MASTER_ADDR" not in env:
                raise ReproError("--launcher slurm needs MASTER_ADDR (and MASTER_PORT) exported by the sbatch "
                                 "script, or --init-method tcp://HOST:PORT")
            init_method = f"tcp://{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '29500')}"
        return Launch(w, found, r, d, init_method, cpu or found == 0, "Slurm environment")
    raise ReproError(f"unknown launcher {launcher!r} (local, torchrun, slurm)")


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


# ---------------------------------------------------------------------- steps
@dataclass
class Step:
    stage: str
    kind: str  # train | average | skd | extract
    argv: List[str]
    out: Path  # directory or file the step produces
    done: Path  # marker that says the step finished
    rank0_only: bool
    needs: List[Path] = field(default_factory=list)  # inputs from other experiments / stages
    comment: str = ""
    batch: Optional[Dict[str, int]] = None

    def shell(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


def named_cad_ratio(arch: str) -> float:
    """CAD drop ratio a named architecture sets by default (its ``cad_defaults``), 0 without CAD."""
    for key, name in ARCHS.items():
        if name == arch and key[0] == "dd" and key[-1]:
            return cad_defaults(key[3])[1]
    return 0.0


def ddp_backend(stage: TrainStage) -> str:
    """``legacy_ddp`` for the multi-pass criterion and stochastic structure, else ``c10d`` (module doc)."""
    flags = list(stage.model_flags)

    def val(flag, default=0.0):
        if flag in flags:
            try:
                return float(flags[flags.index(flag) + 1])
            except (IndexError, ValueError):
                return default
        return default

    if stage.criterion == "collapse_reducing":
        return "legacy_ddp"
    if any(val(f) > 0 for f in ("--ssl-rate", "--encoder-layerdrop", "--decoder-layerdrop")):
        return "legacy_ddp"
    if val("--gp-group-size", 1) > 1 or val("--gp-decoder-group-size", 1) > 1:
        return "legacy_ddp"
    ratio = val("--cad-drop-ratio", -1.0)
    if ratio < 0:  # no flag: the named architecture's default
        ratio = named_cad_ratio(stage.arch)
    if 0 < ratio < 1:
        return "legacy_ddp"
    return "c10d"


def recipe_flags(r: Recipe) -> List[str]:
    if r.lr_scheduler == "inverse_sqrt":
        schedule = ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(r.warmup_updates),
                    "--warmup-init-lr", f"{r.warmup_init_lr:g}"]
    else:
        schedule = ["--lr-scheduler", r.lr_scheduler, *r.scheduler_flags]
    flags = ["--optimizer", r.optimizer, "--adam-betas", r.adam_betas, "--adam-eps", f"{r.adam_eps:g}",
             "--clip-norm", f"{r.clip_norm:g}", "--weight-decay", f"{r.weight_decay:g}",
             "--lr", f"{r.lr:g}", *schedule, "--max-update", str(r.max_update), "--seed", str(r.seed)]
    if r.patience:
        flags += ["--patience", str(r.patience)]
    if r.save_interval_updates:
        flags += ["--save-interval-updates", str(r.save_interval_updates), "--keep-interval-updates", str(r.keep),
                  "--no-epoch-checkpoints"]
    else:
        flags += ["--keep-last-epochs", str(r.keep)]
    return flags


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
        k = average_count(exp, self.opts.average)
        d = self.stage_dir(exp, stage)
        return d / "checkpoint_last.pt" if k <= 1 else d / f"checkpoint_avg{k}.pt"

    def resume_path(self, exp: Experiment, stage: str) -> Path:
        """Averaged weights + the newest checkpoint's optimizer state (``Ref(..., "resume")``)."""
        k = average_count(exp, self.opts.average)
        d = self.stage_dir(exp, stage)
        return d / "checkpoint_last.pt" if k <= 1 else d / f"checkpoint_avg{k}.resume.pt"

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
        return Step(stage_name, "average", st.resolved(), out, out, True,
                    needs=[self.done_marker(exp, stage_name)], comment=st.what)

    # ---- stages
    def train_argv(self, stage: TrainStage) -> (List[str], Dict[str, int]):
        exp, opts = self.exp, self.opts
        src, tgt = exp.lang_pair
        data = self.resolve(stage.data) if stage.data else opts.paths.dataset_bin(exp, exp)
        save = self.stage_dir(exp, stage.name)
        r = stage.recipe
        max_tokens = opts.max_tokens or r.max_tokens
        uf, mt, eff = batch_plan(r.tokens_per_update, max_tokens, opts.launch.world_size)
        ddp = ddp_backend(stage)
        if opts.launch.cpu and opts.launch.world_size > 1:
            ddp = "legacy_ddp"  # c10d DDP asks for device_ids=[0], which a CPU process does not have
        argv = [exe("fairseq-train"), str(data), "--user-dir", str(USER_DIR), "--task", "translation",
                "--source-lang", src, "--target-lang", tgt, "--arch", stage.arch, *stage.model_flags,
                "--criterion", stage.criterion, "--label-smoothing", f"{r.label_smoothing:g}", *stage.criterion_flags,
                *recipe_flags(r), "--max-tokens", str(mt), "--update-freq", str(uf),
                "--ddp-backend", ddp, "--save-dir", str(save),
                "--skip-invalid-size-inputs-valid-test", "--log-format", "simple", "--log-interval", "100"]
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
                steps.append(Step(stage.name, "train", argv, d, d / ".done", False, needs, batch=batch,
                                  comment=f"train {exp.name}/{stage.name} ({stage.arch}, {stage.criterion}, "
                                          f"ddp {ddp_backend(stage)})"))
            elif isinstance(stage, SkdStage):
                teacher_exp = self._target(stage.teacher)
                data = opts.paths.dataset_bin(teacher_exp, exp)
                extra = ["--shards", stage.shards, "--beam", stage.beam, "--lenpen", f"{stage.lenpen:g}"]
                extra += ["--cpu", "--batch-size", "64"] if opts.launch.cpu else ["--max-tokens", stage.max_tokens]
                if opts.precision == "fp16":
                    extra.append("--fp16")
                st = gpkd_plan.skd_stage(data, self.resolve(stage.teacher), d / "bin", extra=[*extra, *opts.skd_args])
                steps.append(Step(stage.name, "skd", st.resolved(), d / "bin", st.done_file(), True, needs,
                                  comment=f"SKD data: the teacher translates the training set (beam {stage.beam}, "
                                          f"lenpen {stage.lenpen:g}); resumable by shard"))
            elif isinstance(stage, ExtractStage):
                out = d / "student-init.pt"
                st = gpkd_plan.extract_stage(self.resolve(stage.teacher), stage.encoder_group_size,
                                             stage.decoder_group_size, out, stage.select, stage.seed)
                steps.append(Step(stage.name, "extract", st.resolved(), out, out, True, needs,
                                  comment=f"student: one layer per group (h_enc={stage.encoder_group_size}, "
                                          f"h_dec={stage.decoder_group_size}, {stage.select})"))
        return steps


# ---------------------------------------------------------------------- running
def _tee(argv: List[str], logfile: Optional[Path]) -> int:
    """Run ``argv``; its output goes to our stdout and (rank 0) to ``logfile``."""
    env = child_env(dict(os.environ, PYTHONUNBUFFERED="1"))  # known-harmless warnings hidden (console.py)
    fh = None
    if logfile is not None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        fh = open(logfile, "a", encoding="utf-8")
        fh.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(shlex.quote(a) for a in argv)}\n")
        fh.flush()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace", bufsize=1)
    except FileNotFoundError as err:
        raise ReproError(f"cannot start {argv[0]}: {err} (is the environment activated?)") from None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if fh:
                fh.write(line)
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    finally:
        if fh:
            fh.close()


def _wait_for(marker: Path, what: str, poll: Optional[float] = None) -> None:
    poll = WAIT_POLL if poll is None else poll
    start = time.time()
    while not marker.exists():
        log(f"waiting for rank 0: {what} ({marker}); {time.time() - start:.0f} s")
        time.sleep(poll)


def _record_command(stage_dir: Path, step: Step) -> None:
    """Append the command to <stage>/commands.jsonl and warn when it differs from the last run."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    path = stage_dir / "commands.jsonl"
    entry = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": step.argv, "batch": step.batch}
    if path.exists():
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if lines:
            prev = json.loads(lines[-1]).get("argv", [])
            if prev != step.argv:
                changed = sorted(set(prev) ^ set(step.argv))
                log(f"note: {stage_dir} was started with a different command; fairseq resumes from its "
                    f"checkpoint_last.pt with the new one (differences: {' '.join(changed[:12])})")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def _check_inputs(needs: Sequence[Path]) -> None:
    missing = [n for n in needs if not n.exists()]
    if missing:
        raise ReproError("missing input(s): " + ", ".join(map(str, missing)) +
                         " - run the experiment(s) they belong to first (deepnmt-repro train NAME, "
                         "or scripts/train.sh NAME)")


def run_steps(steps: Sequence[Step], launch: Launch, dry_run: bool = False) -> int:
    if dry_run:
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
        return 0
    # markers written by rank 0 in this run (train .done, averaged model, SKD data, student):
    # a non-zero rank may get to a step before rank 0 has written them
    produced = {s.done: s for s in steps}
    for s in steps:
        if s.kind == "average" and launch.is_rank0 and stale_average(s.out, s.out.parent):
            old = set_aside(s.out)
            log(f"{s.out.name} predates the newest checkpoint of {s.out.parent}; kept it as {old.name}")
        if s.done.exists():
            log(f"{s.stage}/{s.kind}: done earlier ({s.done}); skipping" +
                (" - delete that .done file to train further" if s.kind == "train" else ""))
            continue
        if not launch.is_rank0:
            # inputs from outside this run (another experiment, a stage not selected) exist or never will;
            # the others are rank 0's to write, maybe still under way: wait for them, then check
            _check_inputs([n for n in s.needs if n not in produced])
            if s.rank0_only:  # rank 0 runs it; here only its result counts
                _wait_for(s.done, f"{s.stage}/{s.kind}")
                continue
            for n in s.needs:
                if n in produced and not n.exists():
                    _wait_for(n, f"{produced[n].stage}/{produced[n].kind} (input of {s.stage})")
        _check_inputs(s.needs)
        if s.batch and s.batch["effective_tokens_per_update"] > 1.25 * s.batch["tokens_per_update"]:
            log(f"warning: {s.batch['world_size']} processes x {s.batch['max_tokens']} tokens exceed the paper's "
                f"{s.batch['tokens_per_update']} tokens per update; use fewer GPUs or --max-tokens")
        log(f"{s.comment}\n$ {s.shell()}")
        t0 = time.time()
        if s.kind == "train":
            if launch.is_rank0:
                _record_command(s.out, s)
            rc = _tee(s.argv, s.out / "train.log" if launch.is_rank0 else None)
        elif s.kind == "skd":
            s.out.parent.mkdir(parents=True, exist_ok=True)
            rc = _tee(s.argv, s.out.parent / "skd.log")
        else:
            s.out.parent.mkdir(parents=True, exist_ok=True)
            rc = subprocess.run(s.argv).returncode
            if rc != 0 and s.kind == "average" and s.out.exists():
                rc = 0  # another job averaged the same checkpoints meanwhile
        if rc != 0:
            raise ReproError(f"{s.stage}/{s.kind} failed (exit {rc}); fix the cause and re-run the same command: "
                             "finished stages are skipped and fairseq resumes from checkpoint_last.pt")
        if s.kind == "train" and launch.is_rank0:
            s.done.write_text(json.dumps({"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": s.argv,
                                          "seconds": round(time.time() - t0, 1)}) + "\n")
        log(f"{s.stage}/{s.kind}: finished in {time.time() - t0:.0f} s")
    return 0


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
