"""The one fairseq command builder: architecture + recipe + data -> ``fairseq-train`` /
``fairseq-generate`` argv, used by the registry, ``deepnmt-distill``, the quickstart and the study.

* :func:`user_dir`: ``--user-dir`` of every fairseq command (the installed package itself, found
  without importing fairseq);
* :func:`fairseq_command`: ``SCRIPT DATA --user-dir DIR`` and the caller's sections in its order
  (each caller keeps its own flag order, so that its recorded commands stay the same);
* :func:`recipe_flags`: a registry :class:`~deepnmt_fairseq.repro.spec.Recipe` as fairseq flags;
* :func:`gp_flags`, :func:`averaged_path`: GPKD's group-permutation flags and where the average of
  a training stage's last checkpoints goes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterable, List


def user_dir() -> str:
    """--user-dir of every fairseq command: the installed package (found without importing fairseq)."""
    return list(importlib.util.find_spec("deepnmt_fairseq").submodule_search_locations)[0]


def fairseq_command(script: str, data, *sections: Iterable, resolve: bool = False) -> List[str]:
    """``[script, data, --user-dir, user_dir(), *sections...]`` as strings; ``resolve``: the console
    script of this environment (:func:`deepnmt_fairseq.console.exe`) instead of its bare name."""
    if resolve:
        from ..console import exe

        script = exe(script)
    return [script, str(data), "--user-dir", user_dir(), *[str(a) for sec in sections for a in sec]]


def fairseq_train(data, *sections: Iterable, resolve: bool = False) -> List[str]:
    """A ``fairseq-train`` command on ``data`` with the plugin (:func:`fairseq_command`)."""
    return fairseq_command("fairseq-train", data, *sections, resolve=resolve)


def fairseq_generate(data, *sections: Iterable, resolve: bool = False) -> List[str]:
    """A ``fairseq-generate`` command on ``data`` with the plugin (:func:`fairseq_command`)."""
    return fairseq_command("fairseq-generate", data, *sections, resolve=resolve)


def recipe_flags(r) -> List[str]:
    """The optimisation, schedule and checkpointing flags of a registry recipe."""
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
        if getattr(r, "checkpoint_updates", 0):  # checkpoint_last.pt mid-epoch (preemption, issue 67 §3)
            flags += ["--save-interval-updates", str(r.checkpoint_updates), "--keep-interval-updates", "1"]
    return flags


def gp_flags(h_enc: int, h_dec: int = 1) -> List[str]:
    """Group permutation (GPKD): encoder groups of ``h_enc`` layers, decoder groups of ``h_dec``."""
    out = ["--gp-group-size", str(h_enc)] if h_enc > 1 else []
    return out + (["--gp-decoder-group-size", str(h_dec)] if h_dec > 1 else [])


def averaged_path(stage_dir: Path, k: int, keep_training_state: bool = False) -> Path:
    """The model of a training stage: the average of its last ``k`` checkpoints (checkpoint_last.pt
    for k <= 1); ``keep_training_state``: with the newest checkpoint's optimizer state and update
    count, for ``--continue-once``."""
    stage_dir = Path(stage_dir)
    if k <= 1:
        return stage_dir / "checkpoint_last.pt"
    return stage_dir / (f"checkpoint_avg{k}.resume.pt" if keep_training_state else f"checkpoint_avg{k}.pt")
