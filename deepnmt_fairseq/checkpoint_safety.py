"""Safe checkpoint loading for fairseq on torch >= 2.6.

torch >= 2.6 loads pickles with ``weights_only=True`` by default: only tensors,
primitive containers and explicitly allow-listed classes may be rebuilt, and
nothing else is ever called.  fairseq 0.12 checkpoints contain a few more
classes, so every fairseq CLI fails with "Unsupported global".  The wrong fix is
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (it lets any pickle run code).  This
module allow-lists exactly what a fairseq checkpoint holds (found by loading 53
checkpoints of 8 kinds; ``tests/test_checkpoint_safety.py`` loads checkpoints with the
Namespace, numpy and omegaconf content, and docs/reliability.md lists the classes for users):

* legacy ``--arch`` models: ``argparse.Namespace``;
* numpy values in ``extra_state`` (``--eval-bleu`` counts, numpy scalars logged
  by criterions): numpy's ``_reconstruct``/``scalar`` (under the numpy 2 and
  the numpy 1 module names), ``ndarray``, ``dtype`` and the concrete
  ``numpy.dtypes.*DType`` classes;
* distributed resume (rank 0 re-pickles the state for the other ranks):
  omegaconf containers and nodes, ``typing.Any``, ``collections.defaultdict``,
  builtins and fairseq's ``_TensorPlaceholder``.

Nothing here changes torch or fairseq by itself: the plugin's single list of fixes to
fairseq (``fairseq_fixes.py``, applied when the plugin is imported, i.e. by ``--user-dir``)
adds :func:`safe_globals` to torch's allow-list and wraps fairseq's checkpoint readers with
:func:`wrap_loader`, so that a refused file raises :class:`UnsafeCheckpointError` naming
the file, instead of torch's generic message.  Protection stays on even when
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set in the environment: the variable is ignored
for the duration of a fairseq checkpoint load (with a warning).  These "safety" fixes are
applied on every fairseq version and cannot be switched off.

:func:`load_checkpoint` is the project's own loader (used by the averaging and
student-extraction tools); it always passes ``weights_only=True`` and allow-lists
:func:`safe_globals` for the duration of the load only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import logging
import os
import pickle
import typing
import warnings

import torch

logger = logging.getLogger(__name__)

_NO_WO_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint pickles something other than weights and plain config."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file is truncated, empty or not a torch file."""


def _numpy_globals():
    import numpy as np

    out = [np.ndarray, np.dtype]
    try:  # numpy >= 2
        from numpy._core import multiarray as ma

        mod = "numpy._core.multiarray"
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray as ma  # type: ignore

        mod = "numpy.core.multiarray"
    for fn in (ma._reconstruct, ma.scalar):
        out.append(fn)
        # files written by the other numpy major version name the other module
        for other in ("numpy.core.multiarray", "numpy._core.multiarray"):
            if other != mod:
                out.append((fn, f"{other}.{fn.__name__}"))
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:  # the concrete DType classes are needed at load time
        for name in dir(dtypes):
            obj = getattr(dtypes, name)
            if isinstance(obj, type) and name.endswith("DType"):
                out.append(obj)
    return out


def _omegaconf_globals():
    out = []
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode

        out += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode]
    except ImportError:  # pragma: no cover - omegaconf is a fairseq dependency
        pass
    try:
        from fairseq.distributed.utils import _TensorPlaceholder

        out.append(_TensorPlaceholder)
    except ImportError:  # pragma: no cover
        pass
    return out


def safe_globals() -> list:
    """Everything a fairseq checkpoint may reference, and nothing else."""
    return (
        [argparse.Namespace]
        + _numpy_globals()
        + _omegaconf_globals()
        + [(typing.Any, "typing.Any"), collections.defaultdict, dict, list, int]
    )


@contextlib.contextmanager
def _weights_only_enforced():
    """Ignore TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD while a checkpoint is read."""
    value = os.environ.pop(_NO_WO_ENV, None)
    if value is not None:
        warnings.warn(
            f"{_NO_WO_ENV} is set; deepnmt_fairseq keeps weights-only loading on "
            "for fairseq checkpoints (the variable is ignored while loading).",
            stacklevel=3,
        )
    try:
        yield
    finally:
        if value is not None:
            os.environ[_NO_WO_ENV] = value


#: how a file written by torch.save begins: a zip archive (torch >= 1.6), or the legacy format's
#: pickled magic number (any pickle protocol: LONG1 after PROTO, with a FRAME from protocol 4;
#: the text LONG of protocols 0/1); the oldest tar format has "ustar" at offset 257
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = b"\x8a\x0a" + torch.serialization.MAGIC_NUMBER.to_bytes(10, "little")
_LEGACY_MAGIC_TEXT = b"L%dL\n" % torch.serialization.MAGIC_NUMBER


def _looks_like_torch_file(head: bytes) -> bool:
    if head.startswith(_ZIP_MAGIC) or head.startswith(_LEGACY_MAGIC_TEXT) or head[257:262] == b"ustar":
        return True
    if len(head) >= 2 and head[0] == 0x80:  # pickle PROTO n
        body = head[2:]
        if body[:1] == b"\x95":  # FRAME + 8-byte length
            body = body[9:]
        return body.startswith(_LEGACY_MAGIC)
    return False


def _not_a_torch_file(path) -> str:
    """Why ``path`` cannot be a file written by torch.save (its first bytes), or "" if it may be
    one (or cannot be read here: a URL, a directory, an empty file - that is a truncated save)."""
    try:
        if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path) or os.path.getsize(path) == 0:
            return ""
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return ""
    if _looks_like_torch_file(head):
        return ""
    return (f"it begins with {head[:12]!r}, where a file written by torch.save begins with a zip header "
            f"({_ZIP_MAGIC!r}) or torch's legacy magic number")


def _not_readable(path, why: str) -> "CorruptCheckpointError":
    return CorruptCheckpointError(
        f"Cannot read checkpoint {path}: it is not a readable checkpoint ({why}). Nothing from it "
        f"was executed. Check that the path names a checkpoint written by fairseq-train "
        f"(checkpoint_best.pt, checkpoint_last.pt, ...)."
    )


def _explain(path, err: BaseException) -> Exception:
    msg = str(err)
    # not a torch file at all (random bytes, text, another format): whatever the reader tripped
    # on - an "Unsupported global" made of random bytes included - the honest message is that the
    # file is not a checkpoint, not that it pickles code
    why = _not_a_torch_file(path)
    if why:
        return _not_readable(path, why)
    if isinstance(err, pickle.UnpicklingError) and "Unsupported operand" in msg:
        # an opcode outside the weights-only reader's set: not an object it refused (that is
        # "Unsupported global") but bytes it cannot parse (measured: pickle_protocol=4 gives 149)
        op = next((ln.strip() for ln in msg.splitlines() if "Unsupported operand" in ln), "an unknown opcode")
        return _not_readable(path, f"the weights-only reader stopped at {op}: the file is corrupted, or torch.save "
                                   f"wrote it with a pickle_protocol that reader does not support; the default, "
                                   f"2, is supported")
    if isinstance(err, pickle.UnpicklingError) and (
        "weights_only" in msg or "Unsupported global" in msg or "Weights only load failed" in msg
    ):
        first = next((ln.strip() for ln in msg.splitlines() if "GLOBAL" in ln or "global" in ln), "")
        return UnsafeCheckpointError(
            f"Refusing to load checkpoint {path}: it pickles objects other than "
            f"weights and fairseq configuration, which could run arbitrary code. "
            f"Nothing from it was executed. ({first or msg.splitlines()[0]}) "
            f"If you trust this file and know the class is harmless, allow-list it "
            f"with torch.serialization.add_safe_globals([...]) before loading."
        )
    if isinstance(err, (EOFError, RuntimeError, pickle.UnpicklingError)) and any(
        k in msg
        for k in ("PytorchStreamReader", "failed finding central directory", "Ran out of input",
                  "invalid load key", "unexpected EOF", "not a zip", "truncated")
    ) or isinstance(err, EOFError):
        return CorruptCheckpointError(
            f"Cannot read checkpoint {path}: the file is truncated or corrupted "
            f"({msg.splitlines()[0] if msg else type(err).__name__}). If a save was "
            f"interrupted, use the previous checkpoint (e.g. checkpoint_last.pt is "
            f"written atomically by fairseq only after the save completed)."
        )
    return err


def _path_of(args, kwargs, name="path"):
    if args:
        return args[0]
    return kwargs.get(name, kwargs.get("fpath", "<checkpoint>"))


_LAST_LOADED = {"path": None}  # the file the last wrapped fairseq loader read


def last_loaded_path():
    """The checkpoint file fairseq's (wrapped) loader read last, or None (named in
    behaviour_fixes' CheckpointMismatchError)."""
    return _LAST_LOADED["path"]


def wrap_loader(fn):
    """``fn`` (a fairseq checkpoint reader taking the path first) with weights-only loading
    enforced and clear errors; a reader that is already wrapped is returned as is."""
    if getattr(fn, "_deepnmt_safe", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        path = _path_of(args, kwargs)
        _LAST_LOADED["path"] = str(path)
        with _weights_only_enforced():
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - re-raised unchanged unless _explain knows it
                new = _explain(path, err)
                if new is err:
                    raise
                raise new from err

    wrapper._deepnmt_safe = True
    return wrapper


@contextlib.contextmanager
def _allow_listed():
    """:func:`safe_globals` in torch's allow-list while the block runs; afterwards the list
    is what it was (torch's own ``safe_globals`` context manager would also remove entries
    that were there before)."""
    before = set(torch.serialization.get_safe_globals())
    added = [g for g in safe_globals() if g not in before]
    torch.serialization.add_safe_globals(added)
    try:
        yield
    finally:
        if added:
            keep = [g for g in torch.serialization.get_safe_globals() if g not in set(added)]
            torch.serialization.clear_safe_globals()
            torch.serialization.add_safe_globals(keep)


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Load a fairseq checkpoint with ``weights_only=True``; clear errors on refusal."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with open(path, "rb") as f, _allow_listed():
            return torch.load(f, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - re-raised unchanged unless _explain knows it
        new = _explain(path, err)
        if new is err:
            raise
        raise new from err
