"""The implementations of the "behaviour" fixes to fairseq 0.12 (docs/reliability.md).

What we measured going wrong in fairseq 0.12.3 on Python 3.11 / torch 2.13, fixed by
subclassing or wrapping fairseq's own hooks; the happy path is unchanged except where fairseq
loses data.  Which fairseq attribute each one replaces, on which fairseq version, and how to
switch them off is decided in one place, ``fairseq_fixes.py`` (its table ``FIXES``, kind
``"behaviour"``; the kind ``"safety"`` is implemented in ``checkpoint_safety.py``); this module
patches nothing itself: ``fairseq_fixes.install()``/``uninstall()`` apply and remove it.

1. **Atomic checkpoint copies.**  fairseq writes the first checkpoint of a save atomically
   (``file.tmp`` + rename) but *copies* it to the others (``checkpoint_last.pt``,
   ``checkpoint_best.pt``) with ``shutil.copyfile`` straight onto the destination: a
   SIGTERM (cluster pre-emption, ``kill``) during that copy leaves a truncated
   ``checkpoint_last.pt`` and the run cannot resume.  ``checkpoint_utils.PathManager``
   becomes :class:`AtomicCopyPathManager`, whose ``copy`` writes a temporary file next to
   the destination, fsyncs it and renames it over the destination.
2. **No silently dropped sentences.**  ``data_utils.batch_by_size`` drops the last batch
   whenever its size is not a multiple of ``--required-batch-size-multiple`` (default 8):
   ``fairseq-generate`` then translates e.g. 8 of 10 test sentences without a word,
   ``fairseq-validate`` scores a subset, and training never sees the longest sentences
   (the last batch of the length-sorted order).  The dropped tail is re-appended as one
   smaller batch (it already satisfied ``--max-tokens``/``--batch-size``).  Resuming a run
   mid-epoch across a change of this setting reshuffles the rest of that epoch (one batch
   more or less in fairseq's per-epoch shuffle).
3. **Clear errors for empty training data.**  An empty split (fairseq-preprocess of an
   empty file) fails in fairseq with "cannot mmap an empty file"; a training split whose
   every pair is longer than ``--max-source-positions``/``--max-target-positions`` fails
   with ``IndexError: list index out of range`` (or "The dataset is empty").  Both now
   raise :class:`EmptyDatasetError` naming the file / split, the limits and the shortest
   pair.
4. **Checkpoint/model mismatches explained.**  Loading a checkpoint into a model of
   another shape (``--restore-file``, ``--finetune-from-model``, ``fairseq-generate`` with
   another dictionary) gives torch's list of hundreds of missing keys and size mismatches,
   wrapped in fairseq's "please ensure that the architectures match".  It now raises
   :class:`CheckpointMismatchError`: "checkpoint X has 2 encoder layers, ...; this model
   has 3 ...".
5. **``--ddp-backend c10d`` on CPU.**  fairseq passes ``device_ids=[0]`` to torch's
   DistributedDataParallel whatever the device, which torch refuses for a CPU module.
   The DDP class fairseq instantiates becomes :class:`CPUCompatibleDDP`, which drops
   ``device_ids``/``output_device`` for CPU modules (GPU runs are unchanged).
6. **No silent divergence under c10d.**  torch's DDP synchronises gradients only for a
   backward pass whose forward went through ``DistributedDataParallel.forward``.  A
   criterion that calls ``model.encoder``/``model.decoder`` directly (it gets the DDP
   wrapper, whose attribute access reaches the inner model) trains every rank on its own
   gradients: the replicas drift apart without any error.  :class:`CPUCompatibleDDP`
   counts its forward calls and the trainer's step raises :class:`DDPBypassError` (before
   the optimizer step) when a training step made none.  ``--ddp-backend legacy_ddp``
   all-reduces gradients explicitly and is not affected.
7. **No abort at exit.**  fairseq prefetches batches in a daemon thread
   (``iterators.BackgroundConsumer``, ``--data-buffer-size``, default 10).  When training
   stops mid-epoch (``--max-update``), that thread is still collating the next batches in
   torch code that released the GIL; Python 3.11 ends such a thread with ``pthread_exit``
   when it takes the GIL back during interpreter finalization, the forced unwinding crosses a
   ``noexcept`` C++ frame and the process dies with "terminate called without an active
   exception" (SIGABRT, exit 134) *after* "done training": measured in 3-5 of 8 runs of a
   2-update ``fairseq-train`` (0 of 8 with ``--data-buffer-size 0``), and a script that checks
   the exit status sees a failed stage.  :func:`_finish_prefetch_at_exit` makes the thread's
   source stop at exit: an ``atexit`` hook (run before finalization) tells every live
   consumer to stop, empties its queue so a blocked ``put`` returns, and joins it.
8. **A resumed run trains on the batches of the run it resumes.**  Without
   ``--rebuild-batches`` fairseq makes the training batches once, when the run starts, and
   only reshuffles their order every epoch; the length-sorted order that the batches are cut
   from breaks ties between equal lengths with a permutation seeded by ``seed + epoch``
   (``FairseqTask.get_batch_iterator``).  A run started at epoch 1 keeps epoch 1's batches for
   its whole life, but a run resumed from ``checkpoint_last.pt`` in epoch ``e > 1`` cuts them
   with ``seed + e``: same sizes, other sentences, so from its first update on it trains a
   different model than the run it continues (measured: a 6-3 model of the evidence study
   resumed at update 700 of 1600 ended 0.33 BLEU away from the same run uninterrupted; a tiny
   model resumed in epoch 3 differed in parameters by up to 1.5e-3 after 30 updates).
   :func:`_resume_with_the_starting_batches` builds a resumed run's frozen batches as at
   epoch 1 and then moves the iterator (and the dataset) to the resumed epoch, so stopping
   and resuming gives exactly the uninterrupted run (tested).  Iterators that fairseq rebuilds
   every epoch (``--rebuild-batches``, sharded data, ``disable_iterator_cache``) already use
   each epoch's own seed in both runs and are left alone.
9. **``--bf16`` trains on the GPU.**  fairseq 0.12's ``options.parse_args_and_arch`` sets
   ``args.tpu = True`` whenever ``--bf16`` is given (bf16 was a TPU feature when it was
   written), so a CUDA run with ``--bf16`` builds its trainer for a TPU and fails at once with
   "'NoneType' object has no attribute 'xla_device'" when torch_xla is not installed (seen on
   an H100, torch 2.11).  :func:`_bf16_is_not_tpu` leaves ``--tpu`` as the user gave it: the
   implied TPU mode is taken back when ``--tpu`` was not on the command line and torch_xla
   cannot be imported (TPU users, who have it, keep fairseq's behaviour).
10. **``--patience`` survives a resume.**  fairseq keeps early stopping's state (the best
   valid value and the validations since it) only as attributes of
   ``fairseq_cli.train.should_stop_early``, never in a checkpoint: a run resumed from
   ``checkpoint_last.pt`` starts counting afresh, with the first valid value after the resume as
   its best, so an interrupted run stops later than the same run uninterrupted (or never), and
   two runs in one process share the first one's count.  :func:`_save_early_stopping` adds
   the state to every checkpoint's ``extra_state``; :func:`_restore_early_stopping` puts it
   back when fairseq resumes the run from its own ``checkpoint_last.pt`` or an explicit
   ``--restore-file`` (as it puts back ``save_checkpoint.best``; not after
   ``--reset-optimizer``/``--reset-meters``) and clears it for any other start (a first launch
   from ``--continue-once`` or ``--finetune-from-model`` is a new run: a stage 2 continuing stage
   1's averaged checkpoint counts its own patience) (tested: a run stopped
   and resumed stops at the update of the uninterrupted run, as ``fairseq-train`` and as
   ``python -m fairseq_cli.train``, where the module holding the state is ``__main__``).
11. **SIGUSR1 saves before the job ends** (issue 82).  fairseq-train has no save-on-signal: a
   cluster's notice before the time limit (Slurm ``--signal=B:USR1@600``) was lost work up to the
   save interval.  ``fairseq_cli.train.validate_and_save`` is wrapped: its first call installs a
   SIGUSR1 handler that sets a flag; after each update the ranks agree on the flag (one all-reduce of
   one number when there are several) and, once it is set, every rank calls fairseq's
   ``checkpoint_utils.save_checkpoint`` (``checkpoint_last.pt`` at that update; rank 0 writes) and
   the process exits with :data:`USR1_EXIT` (75), never 0, so no runner marks the stage done.  A run
   that reaches its end at that very update finishes normally.  Not covered: a signal before the
   first update of a (re)started run (the default action ends it: nothing new to save), ``python -m
   fairseq_cli.train`` (the running module is ``__main__``), ``--no-last-checkpoints``.

The plugin keeps skipped sub-layers in the autograd graph (``graph_tie`` and
``BranchScaleMixin`` in ``models/deep_transformer.py``), so c10d DDP works without
``--find-unused-parameters``; the distributed tests check both DDP backends.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
import weakref
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from .checkpoint_safety import last_loaded_path

logger = logging.getLogger(__name__)


class EmptyDatasetError(ValueError):
    """A data split has no sentences, or none that fits the length limits."""


class CheckpointMismatchError(RuntimeError):
    """A checkpoint's parameters do not fit the model built for it."""


class DDPBypassError(RuntimeError):
    """A training step computed its loss without DistributedDataParallel.forward."""


# --------------------------------------------------------------------------- 1. atomic copies
def atomic_copy(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` so that ``dst`` is either the old or the complete new file.

    The bytes go to a temporary file in the destination's directory (same file system),
    which is flushed, fsynced and renamed over ``dst`` (``os.replace`` is atomic on POSIX).
    A process killed half-way leaves ``dst`` untouched and a stray ``.<name>.*.tmp``.
    """
    dst_dir = os.path.dirname(os.path.abspath(dst))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=".tmp", dir=dst_dir)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give it a normal file's mode
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


try:  # pragma: no branch
    from fairseq.file_io import PathManager as _FairseqPathManager
except ImportError:  # pragma: no cover - plugin used without fairseq
    _FairseqPathManager = object  # type: ignore


class AtomicCopyPathManager(_FairseqPathManager):  # type: ignore[misc,valid-type]
    """fairseq's ``PathManager`` whose ``copy`` is atomic for local files."""

    @staticmethod
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if _FairseqPathManager.path_requires_pathmanager(dst_path):  # remote store: fairseq's own
            return _FairseqPathManager.copy(src_path, dst_path, overwrite=overwrite)
        if not overwrite and os.path.exists(dst_path):
            return False
        atomic_copy(src_path, dst_path)
        return True


# --------------------------------------------------------------------------- 2. last batch
def _keep_last_batch(batch_by_size):
    def wrapper(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        if len(indices) == 0:  # fairseq: IndexError on b[-1]
            return []
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                                required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is not None or required_batch_size_multiple <= 1:
            return batches
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            # batches are consecutive slices of ``indices``; the dropped tail is the last one
            head = np.concatenate(batches) if batches else indices[:0]
            if np.array_equal(head, indices[:covered]):
                batches = list(batches) + [indices[covered:].copy()]
                logger.info("kept the last batch (%d of %d items) that fairseq drops when its size is not a "
                            "multiple of --required-batch-size-multiple %d", len(indices) - covered, len(indices),
                            required_batch_size_multiple)
        return batches

    wrapper.__wrapped__ = batch_by_size
    wrapper.__doc__ = batch_by_size.__doc__
    return wrapper


# --------------------------------------------------------------------------- 3. empty data
def _refuse_empty_file(make_dataset):
    def wrapper(path, impl, fix_lua_indexing=False, dictionary=None):
        if impl in ("mmap", "lazy", "cached"):
            from fairseq.data.indexed_dataset import data_file_path

            bin_path = data_file_path(path)
            if os.path.isfile(bin_path) and os.path.getsize(bin_path) == 0:
                raise EmptyDatasetError(
                    f"dataset {bin_path} is empty: this split has no sentences (fairseq-preprocess "
                    f"was given an empty text file). Give it a non-empty --trainpref/--validpref/"
                    f"--testpref, or leave the split out."
                )
        return make_dataset(path, impl, fix_lua_indexing=fix_lua_indexing, dictionary=dictionary)

    wrapper.__wrapped__ = make_dataset
    return wrapper


def _pair_sizes(dataset) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    src = getattr(dataset, "src_sizes", None)
    tgt = getattr(dataset, "tgt_sizes", None)
    if src is None:
        src = getattr(dataset, "sizes", None)
        if src is not None and getattr(src, "ndim", 1) == 2:
            src, tgt = src[:, 0], src[:, 1]
    return (None if src is None else np.asarray(src)), (None if tgt is None else np.asarray(tgt))


def describe_unusable_split(trainer) -> Optional[str]:
    """Why the training split yields no batch, or None if it does not look empty."""
    from fairseq import utils

    split = trainer.cfg.dataset.train_subset
    dataset = getattr(trainer.task, "datasets", {}).get(split)
    if dataset is None:
        return None
    data = getattr(getattr(trainer.task, "cfg", None), "data", "?")
    if len(dataset) == 0:
        return f"the training split '{split}' of {data} has no sentences"
    max_positions = utils.resolve_max_positions(
        trainer.task.max_positions(), trainer.model.max_positions(), trainer.cfg.dataset.max_tokens
    )
    kept = trainer.task.filter_indices_by_size(
        np.arange(len(dataset), dtype=np.int64), dataset, max_positions, ignore_invalid_inputs=True
    )
    if len(kept) > 0:
        return None
    src, tgt = _pair_sizes(dataset)
    shortest = ""
    if src is not None:
        i = int(np.argmin(src + (tgt if tgt is not None else 0)))
        shortest = f"; the shortest pair has {int(src[i])} source" + (
            f" / {int(tgt[i])} target tokens" if tgt is not None else " tokens")
    return (
        f"all {len(dataset)} sentence pairs of the training split '{split}' of {data} are longer than the "
        f"allowed maximum of {max_positions} (source, target) tokens (the smallest of --max-source-positions/"
        f"--max-target-positions, the model's maximum positions and --max-tokens "
        f"{trainer.cfg.dataset.max_tokens}){shortest}. Raise these limits or check the data."
    )


def _explain_empty_train(get_train_iterator):
    def wrapper(self, *args, **kwargs):
        try:
            return get_train_iterator(self, *args, **kwargs)
        except EmptyDatasetError:
            raise
        except Exception as err:
            try:
                problem = describe_unusable_split(self)
            except Exception:  # the diagnosis must never hide the original error
                problem = None
            if problem is None:
                raise
            raise EmptyDatasetError(problem) from err

    wrapper.__wrapped__ = get_train_iterator
    return wrapper


# --------------------------------------------------------------------------- 4. mismatches
_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.")

# parameter-name markers of the plugin's mechanisms (shown when one side lacks them)
_FEATURES = {
    ".context_cell.": "MSC context cell (--msc-context-cell)",
    ".context_attn.": "MSC context attention (--deep-memory msc)",
    ".fusion.w1.": "MSC gated fusion (--msc-fusion gate)",
    ".layer_mix.": "transparent attention (--deep-memory transparent)",
    ".relative.keys": "relative positions (--rpr-max-relative-position)",
    ".relative.values": "relative position values (--rpr-values)",
    "ssl_active": "skipping sub-layer schedule (--ssl-rate)",
}


def _shape_summary(state: Dict[str, torch.Tensor]) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for side in ("encoder", "decoder"):
        idx = {int(m.group(2)) for k in state if (m := _LAYER.match(k)) and m.group(1) == side}
        out[f"{side} layers"] = max(idx) + 1 if idx else 0
    for key, label in (("encoder.embed_tokens.weight", "source dictionary"),
                       ("decoder.embed_tokens.weight", "target dictionary")):
        if key in state:
            out[label] = int(state[key].shape[0])
    if "encoder.embed_tokens.weight" in state:
        out["embedding dim"] = int(state["encoder.embed_tokens.weight"].shape[1])
    for side in ("encoder", "decoder"):
        key = f"{side}.layers.0.fc1.weight"
        if key in state:
            out[f"{side} FFN dim"] = int(state[key].shape[0])
    if out["decoder layers"]:  # CAD with --cad-drop-ratio 1.0 builds layers without it
        cross = {m.group(1) for k in state if (m := re.match(r"^decoder\.layers\.(\d+)\.encoder_attn\.", k))}
        out["decoder layers with cross-attention"] = len(cross)
    for marker, label in _FEATURES.items():
        out[label] = any(marker in k for k in state)
    return out


def _fmt(name: str, value) -> str:
    if isinstance(value, bool):
        return f"{'' if value else 'no '}{name}"
    if name.endswith("dictionary"):
        return f"a {name} of {value} symbols"
    return f"{value} {name}" if "layers" in name else f"{name} {value}"


def describe_mismatch(model_state: Dict[str, torch.Tensor], ckpt_state: Dict[str, torch.Tensor],
                      path: Optional[str] = None) -> Optional[str]:
    """'checkpoint X has N encoder layers / a dictionary of V symbols, this model has M / W'."""
    have, want = _shape_summary(ckpt_state), _shape_summary(model_state)
    diffs = [k for k in want if k in have and have[k] != want[k]]
    if not diffs:
        missing = sorted(set(model_state) - set(ckpt_state))
        extra = sorted(set(ckpt_state) - set(model_state))
        shapes = sorted(k for k in set(model_state) & set(ckpt_state)
                        if tuple(model_state[k].shape) != tuple(ckpt_state[k].shape))
        if not (missing or extra or shapes):
            return None
        detail = "; ".join(
            f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
            for label, keys in (("missing in the checkpoint", missing), ("unexpected", extra),
                                ("other shapes", shapes)) if keys
        )
        return (f"checkpoint {path or '<checkpoint>'} does not fit this model ({detail}); "
                f"build the model with the checkpoint's architecture flags")
    ckpt = ", ".join(_fmt(k, have[k]) for k in diffs)
    mine = ", ".join(_fmt(k, want[k]) for k in diffs)
    hint = ""
    if any(k.endswith("dictionary") for k in diffs):
        hint = (" The dictionary comes from the data directory (dict.*.txt): use the data-bin the "
                "checkpoint was trained with, or binarize with its dictionaries (--srcdict/--tgtdict).")
    if "decoder layers with cross-attention" in diffs:
        hint += (" Decoder layers 1..--cad-drop-depth have no cross-attention when --cad-drop-ratio is 1.0.")
    if any("layers" in k or k.endswith("dim") or k in _FEATURES.values() for k in diffs):
        hint += (" Give the same architecture flags as the checkpoint (fewer layers from a deep "
                 "model: deepnmt-extract-student).")
    return f"checkpoint {path or '<checkpoint>'} has {ckpt}; this model has {mine}.{hint}"


def _explain_mismatch(load_state_dict):
    def wrapper(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            return load_state_dict(self, state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as err:
            if "size mismatch" not in str(err) and "key(s) in state_dict" not in str(err):
                raise
            try:
                message = describe_mismatch(self.state_dict(), state_dict, last_loaded_path())
            except Exception:
                message = None
            if message is None:
                raise
            raise CheckpointMismatchError(message) from err

    wrapper.__wrapped__ = load_state_dict
    return wrapper


def _unwrap_mismatch(load_checkpoint):
    """fairseq's trainer replaces any load error by 'please ensure that the architectures
    match'; surface our explanation instead (the original stays chained)."""

    def wrapper(self, *args, **kwargs):
        try:
            return load_checkpoint(self, *args, **kwargs)
        except CheckpointMismatchError:
            raise
        except Exception as err:
            cause = err.__cause__ or err.__context__
            if isinstance(cause, CheckpointMismatchError):
                raise CheckpointMismatchError(str(cause)) from cause
            raise

    wrapper.__wrapped__ = load_checkpoint
    return wrapper


# --------------------------------------------------------------------------- 5. c10d on CPU
class CPUCompatibleDDP(torch.nn.parallel.DistributedDataParallel):
    """torch's DDP, minus the ``device_ids`` fairseq passes for CPU modules.

    fairseq 0.12 always calls ``DistributedDataParallel(module, device_ids=[device_id],
    output_device=device_id, ...)``; torch refuses device ids for a CPU module ("device_ids
    and output_device arguments only work with single-device/multiple-device GPU
    modules"), so ``--cpu --ddp-backend c10d`` never started.  GPU modules are unchanged.
    """

    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        params = list(module.parameters())
        if device_ids is not None and params and all(p.device.type == "cpu" for p in params):
            device_ids, output_device = None, None
        super().__init__(module, device_ids, output_device, *args, **kwargs)
        self.deepnmt_forward_calls = 0

    def forward(self, *args, **kwargs):
        self.deepnmt_forward_calls += 1
        return super().forward(*args, **kwargs)


def _torch_ddp(model) -> Optional[CPUCompatibleDDP]:
    """The CPUCompatibleDDP inside fairseq's ModuleProxyWrapper, if any."""
    inner = getattr(model, "module", None) if not isinstance(model, CPUCompatibleDDP) else model
    return inner if isinstance(inner, CPUCompatibleDDP) else None


def _check_ddp_forward(train_step):
    """Wrap ``Trainer.train_step``: each call of ``task.train_step`` (forward + backward of
    one micro-batch) must have gone through DistributedDataParallel.forward."""

    def wrapper(self, samples, *args, **kwargs):
        ddp = _torch_ddp(self.model) if self.data_parallel_world_size > 1 else None
        if ddp is None:
            return train_step(self, samples, *args, **kwargs)
        task = self.task
        inner = task.train_step
        criterion = type(self.get_criterion()).__name__

        def checked(*a, **k):
            before = ddp.deepnmt_forward_calls
            out = inner(*a, **k)
            if ddp.deepnmt_forward_calls == before:
                raise DDPBypassError(
                    f"rank {self.data_parallel_rank}: the criterion {criterion} computed the loss without "
                    f"calling the model through DistributedDataParallel.forward (e.g. model.encoder(...) / "
                    f"model.decoder(...) directly), so --ddp-backend {self.cfg.distributed_training.ddp_backend} "
                    f"would not synchronise its gradients and the ranks would silently diverge. Use "
                    f"--ddp-backend legacy_ddp (alias no_c10d), which all-reduces the gradients explicitly."
                )
            return out

        task.train_step = checked
        try:
            return train_step(self, samples, *args, **kwargs)
        finally:
            if task.__dict__.get("train_step") is checked:
                del task.train_step

    wrapper.__wrapped__ = train_step
    return wrapper


# --------------------------------------------------------------------------- 7. prefetch thread at exit
_PREFETCH_STOP = threading.Event()
_PREFETCH_LIVE: "weakref.WeakSet" = weakref.WeakSet()
_PREFETCH_EXIT_WAIT = 60.0  # seconds: at most this long for the consumers to finish their batch


def stop_prefetch_threads(timeout: float = _PREFETCH_EXIT_WAIT) -> int:
    """Stop every live fairseq prefetch thread and join it (registered with ``atexit`` by
    :func:`_finish_prefetch_at_exit`).  Returns how many were still alive after ``timeout``."""
    _PREFETCH_STOP.set()
    deadline = time.monotonic() + timeout
    alive = [t for t in list(_PREFETCH_LIVE) if t.is_alive()]
    while alive and time.monotonic() < deadline:
        for t in alive:
            try:  # a consumer blocked in put() on a full queue returns once there is room
                while True:
                    t._queue.get_nowait()
            except queue.Empty:
                pass
            t.join(timeout=0.05)
        alive = [t for t in alive if t.is_alive()]
    return len(alive)


def _finish_prefetch_at_exit(run):
    """Wrap ``iterators.BackgroundConsumer.run`` (fix 7 of the module docstring): the thread
    iterates its source through a generator that returns once :func:`stop_prefetch_threads`
    ran, so it finishes (fairseq's own loop then queues its end sentinel) instead of being
    killed inside torch code during finalization."""

    @functools.wraps(run)
    def wrapper(self):
        source = self._source

        def until_exit():
            for item in source:
                if _PREFETCH_STOP.is_set():
                    return
                yield item

        self._source = until_exit()
        _PREFETCH_LIVE.add(self)
        return run(self)

    if not getattr(_finish_prefetch_at_exit, "registered", False):
        atexit.register(stop_prefetch_threads)
        _finish_prefetch_at_exit.registered = True
    return wrapper


# --------------------------------------------------------------------------- 8. resumed runs' batches
def _resume_with_the_starting_batches(get_batch_iterator):
    """Wrap ``FairseqTask.get_batch_iterator`` (fix 8 of the module docstring).  When fairseq
    would make frozen batches for a run that starts at ``epoch > 1`` (a resumed run: no
    ``--rebuild-batches``, an iterator it would cache and reuse across epochs), make them as
    the run would have at epoch 1 (``seed + 1``), then set the iterator's and the dataset's
    epoch to ``epoch``; ``EpochBatchIterator.load_state_dict`` then fast-forwards within it as
    before.  Any other call is fairseq's own."""
    signature = inspect.signature(get_batch_iterator)

    @functools.wraps(get_batch_iterator)
    def wrapper(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        epoch, dataset = a["epoch"], a["dataset"]
        frozen = (epoch > 1 and not getattr(self.cfg, "rebuild_batches", False)
                  and not a["disable_iterator_cache"] and not a["update_epoch_batch_itr"]
                  and self.can_reuse_epoch_itr(dataset) and dataset not in self.dataset_to_epoch_iter)
        if not frozen:
            return get_batch_iterator(*bound.args, **bound.kwargs)
        a["epoch"] = 1
        itr = get_batch_iterator(*bound.args, **bound.kwargs)
        itr.epoch = epoch  # what EpochBatchIterator(epoch=epoch) sets; its batches are epoch 1's
        dataset.set_epoch(epoch)
        return itr

    wrapper.__wrapped__ = get_batch_iterator
    return wrapper


# --------------------------------------------------------------------------- 9. --bf16 without a TPU
def _bf16_is_not_tpu(parse_args_and_arch):
    """Wrap ``fairseq.options.parse_args_and_arch`` (fix 9 of the module docstring): after
    fairseq's parsing, ``args.tpu`` is ``False`` again when only ``--bf16`` turned it on (no
    ``--tpu`` among the arguments) and torch_xla is not installed."""
    import importlib.util
    import sys

    @functools.wraps(parse_args_and_arch)
    def wrapper(parser, input_args=None, *args, **kwargs):
        out = parse_args_and_arch(parser, input_args, *args, **kwargs)
        parsed = out[0] if isinstance(out, tuple) else out
        given = sys.argv[1:] if input_args is None else list(input_args)
        if (getattr(parsed, "bf16", False) and getattr(parsed, "tpu", False) and "--tpu" not in given
                and importlib.util.find_spec("torch_xla") is None):
            parsed.tpu = False
        return out

    wrapper.__wrapped__ = parse_args_and_arch
    return wrapper


# --------------------------------------------------------------------------- 10. --patience across a resume
EARLY_STOP_KEY = "deepnmt_should_stop_early"  # in a checkpoint's extra_state: {"best": float, "num_runs": int}


def _should_stop_early():
    """fairseq_cli.train.should_stop_early, the holder of --patience's state (None outside fairseq-train).
    Under ``python -m fairseq_cli.train`` the running module is ``__main__`` (an import of
    ``fairseq_cli.train`` would be a second copy that never validates): that one is preferred."""
    import sys

    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) == "fairseq_cli.train":
        return getattr(main, "should_stop_early", None)
    return getattr(sys.modules.get("fairseq_cli.train"), "should_stop_early", None)


def _save_early_stopping(save_checkpoint):
    """Wrap ``Trainer.save_checkpoint`` (fix 10 of the module docstring): the checkpoint's
    ``extra_state`` also keeps early stopping's best value and count, once a validation set them."""

    @functools.wraps(save_checkpoint)
    def wrapper(self, filename, extra_state):
        fn = _should_stop_early()
        if fn is not None and getattr(fn, "best", None) is not None:
            extra_state = dict(extra_state, **{EARLY_STOP_KEY: {"best": float(fn.best),
                                                                "num_runs": int(getattr(fn, "num_runs", 0))}})
        return save_checkpoint(self, filename, extra_state)

    wrapper.__wrapped__ = save_checkpoint
    return wrapper


def _restore_early_stopping(load_checkpoint):
    """Wrap ``checkpoint_utils.load_checkpoint`` (fix 10 of the module docstring): after fairseq's
    load, early stopping's state is the checkpoint's where fairseq resumes the run (the conditions
    under which it restores ``save_checkpoint.best``), and fresh otherwise."""

    @functools.wraps(load_checkpoint)
    def wrapper(cfg, trainer, **passthrough_args):
        from fairseq.file_io import PathManager

        # the run resumes itself: its checkpoint_last exists, or --restore-file names the checkpoint
        # (fairseq restores save_checkpoint.best from it too); a first launch from --continue-once
        # or --finetune-from-model starts another run from another run's weights: counted afresh
        last = os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
        resumes = cfg.restore_file != "checkpoint_last.pt" or PathManager.exists(last)
        extra_state, epoch_itr = load_checkpoint(cfg, trainer, **passthrough_args)
        fn = _should_stop_early()
        if fn is not None:
            state = (extra_state or {}).get(EARLY_STOP_KEY)
            if state is not None and resumes and not (cfg.reset_optimizer or cfg.reset_meters):
                fn.best, fn.num_runs = state["best"], state["num_runs"]
                logger.info(f"early stopping resumed: best {fn.best}, {fn.num_runs} validation(s) without "
                            "improvement")
            else:
                for attr in ("best", "num_runs"):
                    if hasattr(fn, attr):
                        delattr(fn, attr)
        return extra_state, epoch_itr

    wrapper.__wrapped__ = load_checkpoint
    return wrapper


# --------------------------------------------------------------------------- 11. save on SIGUSR1
USR1_EXIT = 75  # EX_TEMPFAIL: stopped on request after saving checkpoint_last.pt; run it again to resume
_USR1: Dict[str, bool] = {"installed": False, "flag": False}


def _on_usr1(signum, frame) -> None:
    _USR1["flag"] = True


def install_usr1_handler() -> bool:
    """SIGUSR1 sets the save-and-stop flag (main thread only; once per process)."""
    import signal

    if _USR1["installed"]:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGUSR1, _on_usr1)
    _USR1["installed"] = True
    return True


def usr1_agreed(trainer) -> bool:
    """Whether any rank got SIGUSR1 (every rank calls this at the same update)."""
    flag = 1.0 if _USR1["flag"] else 0.0
    if getattr(trainer, "data_parallel_world_size", 1) > 1:
        from fairseq.distributed import utils as distributed_utils

        t = torch.tensor([flag], dtype=torch.float32, device=trainer.device)
        flag = float(distributed_utils.all_reduce(t, group=trainer.data_parallel_process_group).item())
    return flag > 0


def _save_on_usr1(validate_and_save):
    """Wrap ``fairseq_cli.train.validate_and_save`` (fix 11 of the module docstring)."""

    @functools.wraps(validate_and_save)
    def wrapper(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        install_usr1_handler()
        valid_losses, should_stop = validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
        stop = usr1_agreed(trainer)  # every rank, every update: the collective stays in step
        if not stop or should_stop:
            return valid_losses, should_stop
        from fairseq import checkpoint_utils

        updates = trainer.get_num_updates()
        logger.warning(f"SIGUSR1: saving checkpoint_last.pt at update {updates}, then stopping (exit {USR1_EXIT}); "
                       "run the same command again (or let the requeued job run) to resume from it")
        checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, valid_losses[0])
        raise SystemExit(USR1_EXIT)

    wrapper.__wrapped__ = validate_and_save
    return wrapper
