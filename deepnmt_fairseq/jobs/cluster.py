"""The one cluster policy: devices, launches, distributed flags, the DDP backend, and the checks
that fail loudly before any process group starts.

* :func:`detect_gpus`: the GPUs this process may use (``CUDA_VISIBLE_DEVICES``, else
  ``nvidia-smi -L``, else the driver's ``/proc/driver/nvidia/gpus``);
* :func:`make_launch` / :class:`Launch`: how many processes train, which one this is (one
  local process, a torchrun rank, a Slurm task) and fairseq's distributed flags for it;
* :func:`check_devices`: the loud failures of the GPU path - ``--fp16``/``--bf16`` (also given raw
  to fairseq after ``--``) without a GPU, a torchrun / Slurm rank without a GPU, or GPUs listed by
  the node that the job's own torch cannot use (:func:`torch_gpus`: a CPU-only torch in the
  environment), is an error saying what was detected and how to ask for the CPU on purpose
  (``--cpu``); never a silent fallback;
* :func:`ddp_backend`: fairseq's ``--ddp-backend`` from the model's *options* (the architecture's
  defaults plus its flags, parsed by fairseq's own parser), not from command strings;
* :func:`check_dataset`: a missing or mismatched binarized dataset is an error naming the
  ``deepnmt-prepare-data`` command that makes it;
* :func:`job_id`, :func:`rank0_timeout`: what the ranks of one job share, and how long a rank
  waits for rank 0's steps (``$DEEPNMT_RANK0_TIMEOUT`` seconds).

DDP backend: ``legacy_ddp`` (fairseq's ``no_c10d``: gradients are all-reduced explicitly after
the backward pass) for

* the ``collapse_reducing`` criterion - it calls ``model.encoder``/``model.decoder`` directly (two
  or three decoder passes per step), i.e. *around* the DDP wrapper's ``forward``; c10d DDP would
  then not synchronise the gradients;
* stochastic structure: CAD with 0 < p < 1, skipping sub-layer / stochastic layers, LayerDrop,
  group permutation.  The plugin keeps skipped parameters in the graph (zero gradients), so c10d
  would work too, but legacy_ddp does not depend on it and is what the GPKD authors used
  (``--ddp-backend no_c10d``);
* any model trained by several CPU processes: c10d DDP asks for ``device_ids=[0]``.

Everything else keeps fairseq's default ``c10d`` (overlaps the all-reduce with the backward pass).
"""

from __future__ import annotations

import argparse
import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

#: seconds a rank waits for a rank-0 step (averaging, SKD, extraction) before it gives up
#: (``$DEEPNMT_RANK0_TIMEOUT``); a *failed* rank-0 step ends the wait at once (its failure marker)
DEFAULT_RANK0_TIMEOUT = 24 * 3600.0


from .stage import JobError


class ClusterError(JobError):
    """A launch that cannot work as asked; the message names what was detected and the flag to use."""


# ---------------------------------------------------------------------- devices
def detect_gpus(env: Optional[Mapping[str, str]] = None) -> int:
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


def torch_gpus() -> int:
    """GPUs the job's own torch can use (``torch.cuda.device_count()`` of this interpreter: the
    environment the job runs in, not what the node lists)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - the package needs torch
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver counts as no GPU; the error says what torch is
        return 0


def describe_torch() -> str:
    import sys

    try:
        import torch

        return f"torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'}) of {sys.executable}"
    except ImportError:  # pragma: no cover
        return f"no torch in {sys.executable}"


#: fairseq-train flags (given raw after ``--``) that need a GPU: flag -> the precision it asks for
RAW_PRECISION = {"--fp16": "fp16", "--memory-efficient-fp16": "fp16", "--amp": "fp16", "--bf16": "bf16",
                 "--memory-efficient-bf16": "bf16"}


def precision_of(precision: Optional[str], extra: Sequence[str] = ()) -> Tuple[Optional[str], str]:
    """(the precision the job asks for, the flag that asked): ``--fp16``/``--bf16`` of the command, else a
    half-precision flag among the raw fairseq flags after ``--``."""
    if precision:
        return precision, f"--{precision}"
    for flag in extra:
        if str(flag) in RAW_PRECISION:
            return RAW_PRECISION[str(flag)], f"-- {flag} (a fairseq flag after --)"
    return None, ""


def gpus_requested(env: Optional[Mapping[str, str]] = None) -> str:
    """Why GPUs were asked for by the job's environment ('' if not): a Slurm allocation with GPUs
    (``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_GPUS``, ``SLURM_STEP_GPUS``, ``SLURM_GPUS``) or ``DEEPNMT_REQUIRE_GPU=1``."""
    env = os.environ if env is None else env
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS"):
        value = env.get(key, "").strip()
        if value and value != "0":
            return f"{key}={value}"
    if env.get("DEEPNMT_REQUIRE_GPU", "") not in ("", "0"):
        return f"DEEPNMT_REQUIRE_GPU={env['DEEPNMT_REQUIRE_GPU']}"
    return ""


def describe_detection(env: Optional[Mapping[str, str]] = None) -> str:
    """Where :func:`detect_gpus` looked, for error messages."""
    env = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in env:
        return f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}"
    return "no CUDA_VISIBLE_DEVICES, no GPU listed by nvidia-smi -L or /proc/driver/nvidia/gpus"


# ---------------------------------------------------------------------- launch
@dataclass
class Launch:
    """How many processes train and which one this is.

    ``rank is None``: one local process; fairseq spawns one worker per visible GPU.
    Otherwise this process is one rank of a job started by torchrun / srun / by hand.
    ``cpu_requested``: ``--cpu`` was given (the CPU on purpose); ``detection``: where the GPUs
    were looked for (:func:`describe_detection`)."""

    world_size: int
    gpus_found: int
    rank: Optional[int] = None
    device_id: Optional[int] = None
    init_method: Optional[str] = None
    cpu: bool = False
    source: str = ""
    launcher: str = "local"
    cpu_requested: bool = False
    detection: str = ""

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

    def local_gpus(self) -> int:
        """GPUs of this node that a rank-0-only step may use (0 on the CPU)."""
        return 0 if self.cpu else max(1, self.gpus_found)


def _env_int(env, key) -> int:
    try:
        return int(env[key])
    except KeyError:
        raise ClusterError(f"{key} is not set (expected from the launcher)") from None
    except ValueError:
        raise ClusterError(f"{key}={env[key]!r} is not an integer") from None


def make_launch(launcher: str = "local", gpus: Optional[int] = None, world_size: Optional[int] = None,
                rank: Optional[int] = None, device_id: Optional[int] = None, init_method: Optional[str] = None,
                cpu: bool = False, env=None) -> Launch:
    """Resolve the world size and this process's rank.

    local: W = --gpus, else the GPUs found (CUDA_VISIBLE_DEVICES / nvidia-smi), else 1 CPU process.
    torchrun: W, rank, local rank from WORLD_SIZE / RANK / LOCAL_RANK, init env:// (MASTER_ADDR/PORT).
    slurm: from SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID, init tcp://$MASTER_ADDR:$MASTER_PORT.
    Explicit --world-size/--rank/--device-id/--init-method win over the environment.

    A torchrun / Slurm rank (or an explicit --rank) without a GPU gets ``cpu=True`` here; that
    it was not asked for is :func:`check_devices`' error when the job runs."""
    env = os.environ if env is None else env
    found = detect_gpus(env)
    seen = describe_detection(env)
    if launcher == "local":
        if rank is not None:
            if not world_size:
                raise ClusterError("--rank needs --world-size")
            return Launch(world_size, found, rank, device_id, init_method or "env://", cpu or (found == 0 and not gpus),
                          "explicit rank", "rank", cpu, seen)
        if gpus is not None and gpus < 0:
            raise ClusterError("--gpus must be >= 0")
        n = gpus if gpus is not None else found
        use_cpu = cpu or n == 0
        return Launch(max(1, n) if not cpu else 1, found, cpu=use_cpu,
                      source="--gpus" if gpus is not None else ("CUDA_VISIBLE_DEVICES/nvidia-smi" if found else "no GPU: CPU"),
                      launcher="local", cpu_requested=cpu, detection=seen)
    if launcher == "torchrun":
        w = world_size or _env_int(env, "WORLD_SIZE")
        r = rank if rank is not None else _env_int(env, "RANK")
        d = device_id if device_id is not None else (0 if found == 1 else _env_int(env, "LOCAL_RANK"))
        return Launch(w, found, r, d, init_method or "env://", cpu or found == 0, "torchrun environment", "torchrun",
                      cpu, seen)
    if launcher == "slurm":
        w = world_size or _env_int(env, "SLURM_NTASKS")
        r = rank if rank is not None else _env_int(env, "SLURM_PROCID")
        # a task bound to one GPU (--gpus-per-task=1) sees it as device 0
        d = device_id if device_id is not None else (0 if found == 1 else _env_int(env, "SLURM_LOCALID"))
        if init_method is None:
            if "MASTER_ADDR" not in env:
                raise ClusterError("--launcher slurm needs MASTER_ADDR (and MASTER_PORT) exported by the sbatch "
                                   "script, or --init-method tcp://HOST:PORT")
            init_method = f"tcp://{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '29500')}"
        return Launch(w, found, r, d, init_method, cpu or found == 0, "Slurm environment", "slurm", cpu, seen)
    raise ClusterError(f"unknown launcher {launcher!r} (local, torchrun, slurm)")


def check_devices(launch: Launch, precision: Optional[str] = None, extra: Sequence[str] = (),
                  torch_count: Optional[int] = None) -> None:
    """The GPU path's loud failures (issues 67, 82): raise :class:`ClusterError` when

    * ``--fp16`` / ``--bf16`` (or a half-precision fairseq flag in ``extra``, given after ``--``) is
      asked for and the job would train on the CPU;
    * a torchrun / Slurm rank (or an explicit ``--rank``) found no GPU and ``--cpu`` was not given;
    * the job would train on GPUs but its own torch (``torch_count``, default :func:`torch_gpus`) sees
      none, or fewer than this rank's ``--device-id`` needs (a CPU-only torch in ``DEEPNMT_VENV``
      would otherwise fail later in NCCL with a vaguer message).

    The message says what was detected and how to ask for the CPU on purpose."""
    precision, asked = precision_of(precision, extra)
    if not launch.cpu:
        n = torch_gpus() if torch_count is None else torch_count
        need = (launch.device_id or 0) + 1 if launch.rank is not None else 1
        if n < need:
            raise ClusterError(f"this job would train on {'GPU ' + str(need - 1) if launch.rank is not None else 'the GPU'}"
                               f" ({launch.detection or launch.source}), but the job's own {describe_torch()} sees "
                               f"{n} GPU(s): a CPU-only torch in the environment ($DEEPNMT_VENV / the active "
                               "environment), or a driver it cannot use. Install a CUDA build of torch there, or "
                               "train on the CPU on purpose with --cpu")
        return
    how = launch.detection or "no GPU detected"
    if precision:
        why = "--cpu was given" if launch.cpu_requested else f"no GPU was detected ({how})"
        raise ClusterError(f"{asked} needs a GPU, but {why}: this job would train on the CPU. Run it on a GPU "
                           f"node, or drop {asked.split(' (')[0]} to train on the CPU on purpose (with --cpu)")
    if launch.rank is not None and not launch.cpu_requested:
        where = {"torchrun": "under torchrun", "slurm": "as a Slurm task", "rank": "with --rank"}.get(
            launch.launcher, f"by {launch.launcher}")
        raise ClusterError(f"started {where} (rank {launch.rank} of {launch.world_size}) but no GPU was detected "
                           f"({how}); a multi-process job on GPU nodes that sees no GPU is a broken node or "
                           "environment. To train these ranks on the CPU on purpose (gloo), add --cpu")


def job_id(env: Optional[Mapping[str, str]] = None) -> str:
    """What every rank of one job shares and a later job does not: torchrun's run id, Slurm's job id,
    else the rendezvous address ('' for one local process)."""
    env = os.environ if env is None else env
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        if env.get(key) and env.get(key) != "none":
            return f"{key}={env[key]}"
    if env.get("MASTER_ADDR"):
        return f"MASTER={env['MASTER_ADDR']}:{env.get('MASTER_PORT', '')}"
    return ""


def restart_count(env: Optional[Mapping[str, str]] = None) -> str:
    """How often this job was restarted: Slurm's requeues, torchrun's restarts ('0' when neither says)."""
    env = os.environ if env is None else env
    return env.get("SLURM_RESTART_COUNT") or env.get("TORCHELASTIC_RESTART_COUNT") or "0"


def _seconds(env: Optional[Mapping[str, str]], key: str, default: float) -> float:
    env = os.environ if env is None else env
    raw = env.get(key)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ClusterError(f"{key}={raw!r} is not a number of seconds") from None


#: seconds without a fresh heartbeat of rank 0 after which a waiting rank stops (``$DEEPNMT_RANK0_STALE``)
DEFAULT_RANK0_STALE = 600.0
#: seconds between rank 0's heartbeats (``$DEEPNMT_HEARTBEAT``)
DEFAULT_HEARTBEAT = 30.0
#: seconds a rank waits to see rank 0's token in the checkpoint root (``$DEEPNMT_SHARED_ROOT_WAIT``)
DEFAULT_SHARED_ROOT_WAIT = 120.0


def rank0_stale(env: Optional[Mapping[str, str]] = None) -> float:
    """Seconds a waiting rank accepts rank 0's heartbeat unchanged: ``$DEEPNMT_RANK0_STALE``, else 10 minutes."""
    return _seconds(env, "DEEPNMT_RANK0_STALE", DEFAULT_RANK0_STALE)


def heartbeat_every(env: Optional[Mapping[str, str]] = None) -> float:
    return _seconds(env, "DEEPNMT_HEARTBEAT", DEFAULT_HEARTBEAT)


def shared_root_wait(env: Optional[Mapping[str, str]] = None) -> float:
    return _seconds(env, "DEEPNMT_SHARED_ROOT_WAIT", DEFAULT_SHARED_ROOT_WAIT)


def rank0_timeout(env: Optional[Mapping[str, str]] = None) -> float:
    """Seconds a rank waits for one rank-0 step: ``$DEEPNMT_RANK0_TIMEOUT``, else one day."""
    return _seconds(env, "DEEPNMT_RANK0_TIMEOUT", DEFAULT_RANK0_TIMEOUT)


# ---------------------------------------------------------------------- DDP backend
@lru_cache(maxsize=None)
def _arch_parser(arch: str) -> Optional[argparse.ArgumentParser]:
    import deepnmt_fairseq  # noqa: F401  (registers the plugin's architectures)
    from fairseq.models import ARCH_MODEL_REGISTRY

    if arch not in ARCH_MODEL_REGISTRY:
        return None
    parser = argparse.ArgumentParser(allow_abbrev=False, argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    return parser


@lru_cache(maxsize=4096)
def _model_options(arch: str, flags: Tuple[str, ...]) -> argparse.Namespace:
    from fairseq.models import ARCH_CONFIG_REGISTRY

    parser = _arch_parser(arch)
    if parser is None:
        raise ClusterError(f"--arch {arch}: not a registered architecture (deepnmt-repro arch --list)")
    args, _ = parser.parse_known_args(list(flags))
    args.arch = arch
    ARCH_CONFIG_REGISTRY[arch](args)  # the named architecture's defaults under the explicit flags
    return args


def model_options(arch: str, flags: Sequence[str]) -> argparse.Namespace:
    """The model's options as fairseq builds them: the architecture's defaults, then ``flags``."""
    return _model_options(arch, tuple(str(f) for f in flags))


def ddp_backend(arch: str, model_flags: Sequence[str], criterion: str = "", cpu_processes: int = 1) -> str:
    """fairseq's ``--ddp-backend`` for a model (module doc): ``legacy_ddp`` for the multi-pass
    criterion, stochastic structure and several CPU processes, else ``c10d``."""
    if criterion == "collapse_reducing" or cpu_processes > 1:
        return "legacy_ddp"
    a = model_options(arch, model_flags)

    def num(key, default=0.0) -> float:
        value = getattr(a, key, default)
        try:
            return float(default if value is None else value)
        except (TypeError, ValueError):
            return default

    if any(num(k) > 0 for k in ("ssl_rate", "encoder_layerdrop", "decoder_layerdrop")):
        return "legacy_ddp"
    if num("gp_group_size", 1) > 1 or num("gp_decoder_group_size", 1) > 1:
        return "legacy_ddp"
    if 0 < num("cad_drop_ratio") < 1:
        return "legacy_ddp"
    return "c10d"


# ---------------------------------------------------------------------- dataset
def check_dataset(bin_dir: Path, src: str, tgt: str, dataset: str, data_root: Optional[Path] = None) -> None:
    """A binarized dataset fairseq-train can read: ``dict.{src,tgt}.txt`` and the training split of
    the ``src-tgt`` pair.  Raise :class:`ClusterError` naming the ``deepnmt-prepare-data`` command
    that makes it (before any process group starts, so every rank says so and none hangs)."""
    bin_dir = Path(bin_dir)
    root = f" --data-root {data_root}" if data_root is not None else ""
    make = f"deepnmt-prepare-data {dataset}{root}"
    if not bin_dir.is_dir():
        raise ClusterError(f"no binarized data at {bin_dir} (dataset {dataset}): make it with `{make}`, or point "
                           "--data / --data-root / $DEEPNMT_DATA at it")
    missing = [f"dict.{lang}.txt" for lang in (src, tgt) if not (bin_dir / f"dict.{lang}.txt").is_file()]
    pairs = sorted({p.name.split(".")[1] for p in bin_dir.glob("train.*-*.*.idx")})
    if not any((bin_dir / f"train.{pair}.{src}.idx").is_file() for pair in (f"{src}-{tgt}", f"{tgt}-{src}")):
        missing.append(f"train.{src}-{tgt}.{src}.idx")
    if missing:
        found = f"it holds the pair(s) {', '.join(pairs)}" if pairs else "it holds no binarized training split"
        raise ClusterError(f"{bin_dir} is not the binarized {dataset} ({src}->{tgt}): {', '.join(missing)} missing, "
                           f"{found}. Make it with `{make}`, or point --data at the right directory")
