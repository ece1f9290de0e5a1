"""Average fairseq checkpoints (the project's own; fairseq's script is not in any wheel).

The library behind ``deepnmt-average-checkpoints`` (its arguments: :mod:`deepnmt_cli.average_checkpoints`);
the distillation pipeline, the registry and the study call these functions directly.

``--num-checkpoints K`` takes the K newest checkpoints of either kind (by the
update count stored in each file): fairseq writes no ``checkpoint_E_U.pt`` at an
epoch boundary, so interval and epoch checkpoints together are the complete
series when both are saved.

Every file is read with ``weights_only=True`` (see checkpoint_safety); a file that
pickles anything else is refused.  Floating-point tensors are averaged in
float64 and cast back; integer/bool buffers must agree and are copied.  The
output keeps the newest input's configuration and training state but not its
optimizer state (use ``--reset-optimizer`` to train from it).  It is written
atomically and never overwrites an existing file unless ``--overwrite``.

``--keep-training-state`` also keeps the newest input's optimizer state, so that
``fairseq-train --continue-once AVG.pt`` continues *training* from the averaged
weights: Adam's moments, the learning-rate schedule and the update count go on
from the newest checkpoint (no second warm-up).  This is how a second training
stage starts from a converged, averaged first stage (GPKD two-stage training,
docs/reproduction.md).
"""

from __future__ import annotations

import collections
import logging
import os
import re
from typing import List, Sequence

import torch

from .checkpoint_safety import load_checkpoint

logger = logging.getLogger("deepnmt_fairseq.average_checkpoints")

_UPDATE_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")
_EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")


def last_checkpoints(directory: str, n: int, by: str = "update", upper_bound: int | None = None) -> List[str]:
    """The ``n`` newest ``checkpoint_E_U.pt`` (by update) or ``checkpointE.pt`` (by epoch)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"not a directory: {directory}")
    pattern = _UPDATE_RE if by == "update" else _EPOCH_RE
    found = []
    for name in os.listdir(directory):
        m = pattern.match(name)
        if m:
            key = int(m.group(2) if by == "update" else m.group(1))
            if upper_bound is None or key <= upper_bound:
                found.append((key, os.path.join(directory, name)))
    found.sort()
    if len(found) < n:
        kind = "checkpoint_EPOCH_UPDATE.pt (--save-interval-updates)" if by == "update" else "checkpointEPOCH.pt"
        raise ValueError(f"asked for the last {n} checkpoints in {directory} but found {len(found)} {kind}")
    return [p for _, p in found[-n:]]


def _num_updates(path: str) -> int:
    m = _UPDATE_RE.match(os.path.basename(path))
    if m:
        return int(m.group(2))
    state = load_checkpoint(path)
    history = state.get("optimizer_history") or [{}]
    n = history[-1].get("num_updates")
    if n is None:
        raise ValueError(f"{path} does not record its number of updates")
    return int(n)


def newest_checkpoints(directory: str, n: int, upper_bound: int | None = None) -> List[str]:
    """The ``n`` newest of checkpoint_E_U.pt and checkpointE.pt, by stored update count."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"not a directory: {directory}")
    found = {}
    for name in os.listdir(directory):
        if _UPDATE_RE.match(name) or _EPOCH_RE.match(name):
            path = os.path.join(directory, name)
            updates = _num_updates(path)
            if upper_bound is None or updates <= upper_bound:
                found.setdefault(updates, path)  # an epoch and an interval file of the same update: one
    if len(found) < n:
        raise ValueError(f"asked for the last {n} checkpoints in {directory} but found {len(found)}")
    return [found[u] for u in sorted(found)[-n:]]


def average(paths: Sequence[str], keep_training_state: bool = False) -> dict:
    """Average the ``model`` entries of ``paths``; returns a checkpoint dict.

    ``keep_training_state``: keep the newest input's optimizer state as well (module doc)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    sums: "collections.OrderedDict[str, torch.Tensor]" = collections.OrderedDict()
    newest = None
    for i, path in enumerate(paths):
        state = load_checkpoint(path)
        if "model" not in state:
            raise ValueError(f"{path} is not a fairseq checkpoint (no 'model' entry)")
        model = state["model"]
        if i == 0:
            ref_keys = list(model.keys())
        elif list(model.keys()) != ref_keys:
            missing = set(ref_keys) ^ set(model.keys())
            raise ValueError(f"{path} has different parameters than {paths[0]}: {sorted(missing)[:5]} ...")
        for k, v in model.items():
            if i == 0:
                sums[k] = v.double().clone() if v.is_floating_point() else v.clone()
                continue
            if v.shape != sums[k].shape:
                raise ValueError(f"{path}: {k} has shape {tuple(v.shape)}, {paths[0]} has {tuple(sums[k].shape)}")
            if v.is_floating_point():
                sums[k].add_(v.double())
            elif not torch.equal(v, sums[k]):
                raise ValueError(f"{path}: non-float tensor {k} differs from {paths[0]}; cannot average")
        newest = state
    dtypes = {k: v.dtype for k, v in newest["model"].items()}
    averaged = collections.OrderedDict(
        (k, (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v) for k, v in sums.items()
    )
    dropped = ("model",) if keep_training_state else ("model", "last_optimizer_state")
    out = {k: v for k, v in newest.items() if k not in dropped}
    if keep_training_state and out.get("last_optimizer_state") is None:
        raise ValueError(f"--keep-training-state: {paths[-1]} has no optimizer state to keep")
    out["model"] = averaged
    out.setdefault("extra_state", {})
    out["averaged_from"] = [os.path.abspath(p) for p in paths]
    return out


def save_atomic(state: dict, output: str, overwrite: bool = False) -> None:
    if os.path.exists(output) and not overwrite:
        raise FileExistsError(f"{output} exists; pass --overwrite to replace it")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tmp = f"{output}.tmp-{os.getpid()}"
    try:
        torch.save(state, tmp)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def run(a) -> int:
    """``deepnmt-average-checkpoints`` (arguments: :mod:`deepnmt_cli.average_checkpoints`)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import deepnmt_fairseq  # noqa: F401  (allow-list fairseq's checkpoint classes)

    if a.num_checkpoints:
        paths = newest_checkpoints(a.inputs[0], a.num_checkpoints, a.checkpoint_upper_bound)
    elif a.num_update_checkpoints or a.num_epoch_checkpoints:
        by = "update" if a.num_update_checkpoints else "epoch"
        paths = last_checkpoints(a.inputs[0], a.num_update_checkpoints or a.num_epoch_checkpoints, by,
                                 a.checkpoint_upper_bound)
    else:
        paths = a.inputs
    logger.info("averaging %d checkpoints:\n  %s", len(paths), "\n  ".join(paths))
    save_atomic(average(paths, a.keep_training_state), a.output, a.overwrite)
    logger.info("wrote %s", a.output)
    return 0
