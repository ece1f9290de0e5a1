"""Every change the plugin makes to fairseq (and torch) at import time, in one table.

Importing ``deepnmt_fairseq`` (what ``--user-dir`` does) calls :func:`install`, which applies
the rows of :data:`FIXES`; nothing else in the package replaces a fairseq attribute.  Each
row names the attribute it replaces, the fairseq 0.12.3 bug it fixes and the test that fails
without it.  The implementations live in ``checkpoint_safety.py`` (kind ``"safety"``) and
``behaviour_fixes.py`` (kind ``"behaviour"``); docs/reliability.md has the measurements.

Two kinds:

* ``"safety"``: weights-only checkpoint loading (torch's allow-list of the classes fairseq
  checkpoints contain, and fairseq's checkpoint readers wrapped to give clear errors and to
  ignore torch's weights-only opt-out variable, ``checkpoint_safety._NO_WO_ENV``).  Always applied, on every fairseq version;
  without it fairseq 0.12 cannot load its own checkpoints under torch >= 2.6.
* ``"behaviour"``: changes of what fairseq does (atomic checkpoint copies, the last batch,
  clear errors, c10d DDP on CPU).  Applied only on the fairseq they were written for
  (:data:`FAIRSEQ_VERSION`: ``ve-fairseq`` 0.12.3 or ``fairseq-fixed`` 0.12.3.x, whose
  ``fairseq.__version__`` is 0.12.3...).  On another version fairseq's behaviour is left as it
  is and a :class:`FairseqVersionWarning` says so.

The environment variable ``DEEPNMT_FAIRSEQ_FIXES`` (read by every :func:`install` call that
is not told otherwise) chooses the behaviour fixes, never the safety:

* unset, ``1`` or ``on``: all of them, on fairseq 0.12.3 only;
* ``0`` or ``off``: none (fairseq's own behaviour);
* ``-name,-name``: all but the named rows (e.g. ``-keep_last_batch``);
* ``force``: apply them on another fairseq version too (untested there); combines with
  ``-name`` entries.

:func:`uninstall` puts back every original object (fairseq's attributes by identity, and
torch's allow-list without the entries :func:`install` added).  What it cannot undo: objects
fairseq created while a fix was active (a ``CPUCompatibleDDP`` wrapper of a running trainer,
the batches already made) keep their class/content, and code that copied a patched attribute
into its own namespace (``from fairseq.checkpoint_utils import load_checkpoint_to_cpu`` after
the import of the plugin) keeps the wrapper.  :func:`active` lists what is applied;
``python -m deepnmt_fairseq --fixes`` prints the table with each row's state.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch

from . import checkpoint_safety as _cs
from . import behaviour_fixes as _bf

logger = logging.getLogger(__name__)

ENV_VAR = "DEEPNMT_FAIRSEQ_FIXES"
FAIRSEQ_VERSION = "0.12.3"  # the fairseq the behaviour fixes were written and tested for
_MARKER = "_deepnmt_fairseq_fix"  # set on every replacement: the row's name


class FairseqVersionWarning(UserWarning):
    """The installed fairseq is not the version the behaviour fixes were written for."""


@dataclass(frozen=True)
class Fix:
    """One change to fairseq (or torch) made when the plugin is imported."""

    name: str  # the id used in DEEPNMT_FAIRSEQ_FIXES=-name
    module: str  # the module that owns the patched attribute
    attribute: Optional[str]  # "function" or "Class.method"; None: torch's allow-list (not an attribute)
    kind: str  # "safety" (always on) or "behaviour"
    bug: str  # the fairseq 0.12.3 bug, one line
    test: str  # tests/<file>.py::<test function>[<parameters>] that fails without the fix
    make: Optional[Callable[[Any], Any]] = field(default=None, repr=False, compare=False)  # original -> new

    @property
    def target(self) -> str:
        if self.attribute is None:
            return f"{self.module}.add_safe_globals([...])"  # a call, not a replaced attribute
        return f"{self.module}.{self.attribute}"


def _is(obj):
    return lambda original: obj


def _ngram_block_up_to_step(original):
    """fairseq 0.12's CPU n-gram blocker reads the last n-1 entries of the whole (pad-filled)
    token buffer instead of the last n-1 generated tokens, so it never bans anything; give it
    the generated prefix ``tokens[:, :step + 1]`` (what the CUDA kernel looks at)."""
    import functools

    @functools.wraps(original)
    def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        return original(self, tokens[:, : step + 1], lprobs, bsz, beam_size, step)

    return _no_repeat_ngram


FIXES: Tuple[Fix, ...] = (
    Fix("weights_only_allowlist", "torch.serialization", None, "safety",
        "torch >= 2.6 loads with weights_only=True and refuses fairseq's own checkpoints "
        "('Unsupported global: GLOBAL argparse.Namespace', numpy values, omegaconf configs)",
        "tests/test_checkpoint_safety.py::test_plain_fairseq_checkpoint_loads_weights_only"),
    Fix("safe_load_checkpoint", "fairseq.checkpoint_utils", "load_checkpoint_to_cpu", "safety",
        "a refused or truncated checkpoint gives torch's message without the file name, and "
        "torch's weights-only opt-out variable (set to 1) lets a checkpoint run code",
        "tests/test_checkpoint_safety.py::test_malicious_checkpoint_is_refused_and_nothing_runs",
        _cs.wrap_loader),
    Fix("safe_load_ema", "fairseq.checkpoint_utils", "load_ema_from_checkpoint", "safety",
        "the same for the EMA reader (--ema-start-update with --restore-file): torch's message, "
        "torch's weights-only opt-out variable obeyed",
        "tests/test_checkpoint_safety.py::test_ema_reader_refuses_code_and_loads_weights",
        _cs.wrap_loader),
    Fix("atomic_checkpoint_copy", "fairseq.checkpoint_utils", "PathManager", "behaviour",
        "checkpoint_last.pt/checkpoint_best.pt are copies made in place (shutil.copyfile): "
        "a SIGTERM during the copy leaves a truncated checkpoint_last.pt",
        "tests/test_faults.py::test_sigterm_during_a_save_keeps_the_previous_checkpoint_last[copy]",
        _is(_bf.AtomicCopyPathManager)),
    Fix("keep_last_batch", "fairseq.data.data_utils", "batch_by_size", "behaviour",
        "drops the last batch unless its size is a multiple of --required-batch-size-multiple "
        "(default 8): fairseq-generate translates 8 of 10 sentences without a word",
        "tests/test_faults.py::test_generation_keeps_the_last_partial_batch",
        _bf._keep_last_batch),
    Fix("empty_split_error", "fairseq.data.indexed_dataset", "make_dataset", "behaviour",
        "an empty split (preprocessed from an empty file) fails with 'cannot mmap an empty file'",
        "tests/test_faults.py::test_empty_training_split_gives_a_clear_error",
        _bf._refuse_empty_file),
    Fix("unusable_split_error", "fairseq.trainer", "Trainer.get_train_iterator", "behaviour",
        "a training split whose every pair exceeds the length limits fails with "
        "'IndexError: list index out of range'",
        "tests/test_faults.py::test_training_split_filtered_out_by_length_gives_a_clear_error",
        _bf._explain_empty_train),
    Fix("explain_mismatch", "fairseq.models.fairseq_model", "BaseFairseqModel.load_state_dict", "behaviour",
        "a checkpoint of another shape or dictionary gives torch's list of missing keys and "
        "size mismatches",
        "tests/test_faults.py::test_generate_with_another_dictionary_names_the_sizes",
        _bf._explain_mismatch),
    Fix("unwrap_mismatch", "fairseq.trainer", "Trainer.load_checkpoint", "behaviour",
        "replaces any error of --restore-file/--finetune-from-model by 'please ensure that "
        "the architectures match'",
        "tests/test_faults.py::test_restore_file_with_another_layer_count_names_the_mismatch",
        _bf._unwrap_mismatch),
    Fix("cpu_c10d_ddp", "fairseq.models.distributed_fairseq_model", "DistributedDataParallel", "behaviour",
        "--ddp-backend c10d (the default) passes device_ids=[0] to torch's DDP, which torch "
        "refuses for a CPU model",
        "tests/test_distributed.py::test_two_ranks_train_every_stochastic_feature_and_stay_identical[msc-c10d]",
        _is(_bf.CPUCompatibleDDP)),
    Fix("ddp_bypass_check", "fairseq.trainer", "Trainer.train_step", "behaviour",
        "under c10d a criterion that calls model.encoder/decoder directly skips DDP.forward: "
        "gradients are not synchronised and the ranks silently diverge",
        "tests/test_fairseq_fixes.py::test_c10d_criterion_that_bypasses_ddp_forward_is_stopped",
        _bf._check_ddp_forward),
    Fix("cpu_ngram_blocking", "fairseq.ngram_repeat_block", "NGramRepeatBlock._no_repeat_ngram", "behaviour",
        "--no-repeat-ngram-size does nothing without the CUDA extension (CPU decoding): the "
        "blocker compares the pad-filled end of the token buffer, not the last generated tokens",
        "tests/test_summarization.py::test_trigram_blocking_works_on_the_cpu",
        _ngram_block_up_to_step),
    Fix("finish_prefetch_at_exit", "fairseq.data.iterators", "BackgroundConsumer.run", "behaviour",
        "a run stopped by --max-update mid-epoch can abort after 'done training' (SIGABRT, 'terminate "
        "called without an active exception'): the daemon prefetch thread is killed inside torch code "
        "during interpreter finalization",
        "tests/test_fairseq_fixes.py::test_prefetch_thread_does_not_abort_the_exit",
        _bf._finish_prefetch_at_exit),
    Fix("resume_same_batches", "fairseq.tasks.fairseq_task", "FairseqTask.get_batch_iterator", "behaviour",
        "a run resumed from checkpoint_last.pt after its first epoch cuts its batches with another "
        "tie-breaking seed (seed + epoch) than the uninterrupted run (seed + 1) and trains another model",
        "tests/test_fairseq_fixes.py::test_a_resumed_run_is_the_uninterrupted_run[1]",
        _bf._resume_with_the_starting_batches),
    Fix("bf16_on_gpu", "fairseq.options", "parse_args_and_arch", "behaviour",
        "--bf16 sets --tpu: a CUDA run with --bf16 builds a TPU trainer and fails with "
        "\"'NoneType' object has no attribute 'xla_device'\" (no torch_xla)",
        "tests/test_fairseq_fixes.py::test_bf16_does_not_turn_on_tpu_mode",
        _bf._bf16_is_not_tpu),
    Fix("save_patience", "fairseq.trainer", "Trainer.save_checkpoint", "behaviour",
        "--patience's state (best valid value, validations since) is in no checkpoint: a resumed run "
        "counts afresh from its first validation and stops later than the uninterrupted run",
        "tests/test_fairseq_fixes.py::test_a_resumed_run_stops_early_where_the_uninterrupted_run_stops",
        _bf._save_early_stopping),
    Fix("resume_patience", "fairseq.checkpoint_utils", "load_checkpoint", "behaviour",
        "the same bug, on loading: the state is not put back when a run resumes (and an earlier run's "
        "count in the same process is kept when a new run starts)",
        "tests/test_fairseq_fixes.py::test_a_resumed_run_stops_early_where_the_uninterrupted_run_stops",
        _bf._restore_early_stopping),
    Fix("save_on_usr1", "fairseq_cli.train", "validate_and_save", "behaviour",
        "fairseq-train has no save on a signal: a cluster's SIGUSR1 notice before the time limit is lost work "
        "back to the last save (up to the save interval)",
        "tests/test_cluster_ops.py::test_sigusr1_saves_at_the_next_update_and_exits_75",
        _bf._save_on_usr1),
)

_BY_NAME: Dict[str, Fix] = {fix.name: fix for fix in FIXES}
assert len(_BY_NAME) == len(FIXES), "duplicate fix name"

# name -> (owner, attribute, original, replacement, owner had its own attribute)
_APPLIED: Dict[str, Tuple[Any, str, Any, Any, bool]] = {}
# allow_listed: what install() added to torch's allow-list (None: the row is not applied)
_STATE: Dict[str, Any] = {"version_warned": False, "allow_listed": None}


# --------------------------------------------------------------------------- policy
def fairseq_version() -> Optional[str]:
    """``fairseq.__version__`` (None without fairseq)."""
    try:
        import fairseq
    except ImportError:  # pragma: no cover - the plugin needs fairseq
        return None
    return str(getattr(fairseq, "__version__", "unknown"))


def version_supported(version: Optional[str]) -> bool:
    """0.12.3 (ve-fairseq) and 0.12.3.x / 0.12.3+local (fairseq-fixed and local builds)."""
    return version is not None and re.fullmatch(re.escape(FAIRSEQ_VERSION) + r"([.+-].*)?", version) is not None


def _parse_env(value: Optional[str]) -> Tuple[bool, bool, frozenset]:
    """(behaviour fixes wanted, apply on another fairseq version, excluded names)."""
    on, force, excluded = True, False, set()
    for token in (t.strip().lower() for t in (value or "").split(",")):
        if token in ("", "1", "on", "true", "yes"):
            continue
        if token in ("0", "off", "false", "no", "none"):
            on = False
        elif token == "force":
            force = True
        elif token.startswith("-") and token[1:] in _BY_NAME and _BY_NAME[token[1:]].kind == "behaviour":
            excluded.add(token[1:])
        else:
            behaviour = ", ".join(f.name for f in FIXES if f.kind == "behaviour")
            warnings.warn(f"{ENV_VAR}: ignored {token!r}; use 0, 1, force or -name with a name of a behaviour "
                          f"fix ({behaviour}); the safety fixes cannot be switched off", stacklevel=4)
    return on, force, frozenset(excluded)


def wanted(behaviour: Optional[bool] = None) -> Tuple[Fix, ...]:
    """The rows :func:`install` applies: the safety rows, and the behaviour rows that
    ``behaviour`` (True: all, False: none) or else ``DEEPNMT_FAIRSEQ_FIXES`` and the fairseq
    version allow.  Warns once per process when the version keeps the behaviour fixes off."""
    safety = tuple(f for f in FIXES if f.kind == "safety")
    if behaviour is not None:
        return safety + (tuple(f for f in FIXES if f.kind == "behaviour") if behaviour else ())
    on, force, excluded = _parse_env(os.environ.get(ENV_VAR))
    if not on:
        return safety
    version = fairseq_version()
    if not version_supported(version) and not force:
        if not _STATE["version_warned"]:
            _STATE["version_warned"] = True
            warnings.warn(
                f"deepnmt_fairseq: fairseq {version} is not the version its fixes to fairseq were written and "
                f"tested for ({FAIRSEQ_VERSION}: ve-fairseq 0.12.3 or fairseq-fixed 0.12.3.x), so fairseq's behaviour "
                f"is left unchanged (atomic checkpoint copies, the kept last batch, the clear errors and CPU c10d "
                f"are off); only weights-only checkpoint loading is made safe. Set {ENV_VAR}=force to apply them "
                f"anyway (untested), or {ENV_VAR}=0 to silence this warning. See docs/reliability.md.",
                FairseqVersionWarning, stacklevel=3)
        return safety
    return safety + tuple(f for f in FIXES if f.kind == "behaviour" and f.name not in excluded)


# --------------------------------------------------------------------------- resolution
def _import_quietly(module: str):
    """Import ``module`` without letting it configure the process's logging (``fairseq_cli.train``
    calls ``logging.basicConfig`` at import: in a process that is not fairseq-train that would turn
    on fairseq's INFO lines on stdout)."""
    import sys

    if module in sys.modules:
        return sys.modules[module]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return importlib.import_module(module)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def resolve(fix: Fix) -> Tuple[Any, str]:
    """(owner object, attribute name) of an attribute row; imports the module."""
    owner = _import_quietly(fix.module)
    *path, attr = fix.attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def _current(owner, attr):
    """The object stored for ``attr`` (a class's own entry, not a bound or inherited lookup)."""
    if isinstance(owner, type) and attr in vars(owner):
        return vars(owner)[attr]
    return getattr(owner, attr)


def _is_ours(obj, fix: Fix) -> bool:
    return getattr(obj, _MARKER, None) == fix.name


# --------------------------------------------------------------------------- install
def install(behaviour: Optional[bool] = None) -> Tuple[Fix, ...]:
    """Apply the rows of :data:`FIXES` that :func:`wanted` selects and that are not applied yet
    (idempotent; it never removes one).  Returns :func:`active`."""
    for fix in wanted(behaviour):
        if fix.name in _APPLIED or (fix.attribute is None and _STATE["allow_listed"] is not None):
            continue
        if fix.attribute is None:
            before = set(torch.serialization.get_safe_globals())
            added = [g for g in _cs.safe_globals() if g not in before]
            torch.serialization.add_safe_globals(added)
            _STATE["allow_listed"] = added
            continue
        try:
            owner, attr = resolve(fix)
            original = _current(owner, attr)
        except (ImportError, AttributeError):  # another fairseq version may lack the target
            logger.info("fairseq fix %s not applied: %s does not exist", fix.name, fix.target)
            continue
        if _is_ours(original, fix):  # applied by another copy of the plugin in this process
            continue
        new = fix.make(original)
        if new is original:
            continue
        try:
            setattr(new, _MARKER, fix.name)
        except (AttributeError, TypeError):  # pragma: no cover - all replacements accept it
            pass
        had_own = not isinstance(owner, type) or attr in vars(owner)
        setattr(owner, attr, new)
        _APPLIED[fix.name] = (owner, attr, original, new, had_own)
    return active()


def uninstall(kinds: Iterable[str] = ("safety", "behaviour"), names: Optional[Iterable[str]] = None) -> None:
    """Put back fairseq's original objects (and torch's allow-list) for the applied rows of
    these kinds (or these names), in reverse order.  A row whose attribute was replaced again
    by someone else after us is left alone (with a warning) and forgotten."""
    kinds, names = set(kinds), (set(names) if names is not None else None)
    for fix in reversed(FIXES):
        if fix.kind not in kinds or (names is not None and fix.name not in names):
            continue
        if fix.attribute is None:
            added, _STATE["allow_listed"] = _STATE["allow_listed"], None
            if added:
                keep = [g for g in torch.serialization.get_safe_globals() if g not in set(added)]
                torch.serialization.clear_safe_globals()
                torch.serialization.add_safe_globals(keep)
            continue
        if fix.name not in _APPLIED:
            continue
        owner, attr, original, new, had_own = _APPLIED.pop(fix.name)
        if _current(owner, attr) is not new:
            warnings.warn(f"deepnmt_fairseq: {fix.target} was replaced again after the plugin's fix "
                          f"{fix.name}; left as it is", stacklevel=2)
            continue
        if had_own:
            setattr(owner, attr, original)
        else:
            delattr(owner, attr)


def active() -> Tuple[Fix, ...]:
    """The rows applied by this copy of the plugin, in table order."""
    return tuple(f for f in FIXES if f.name in _APPLIED or (f.attribute is None and _STATE["allow_listed"] is not None))


def original(name: str):
    """fairseq's object that an applied row replaced."""
    return _APPLIED[name][2]


# --------------------------------------------------------------------------- listing
def markdown_table() -> str:
    """The table of docs/reliability.md (``tests/test_fairseq_fixes.py`` keeps them equal)."""
    rows = ["| patched | fairseq 0.12.3 bug | kind | test that fails without it |", "|---|---|---|---|"]
    for f in FIXES:
        rows.append(f"| `{f.target}` | {f.bug} | {f.kind} | `{f.test}` |")
    return "\n".join(rows)


def describe() -> str:
    """One line per row with its state (``python -m deepnmt_fairseq --fixes``)."""
    on = {f.name for f in active()}
    version = fairseq_version()
    lines = [f"fairseq {version} ({'supported' if version_supported(version) else 'not ' + FAIRSEQ_VERSION}); "
             f"{ENV_VAR}={os.environ.get(ENV_VAR, '')!r}"]
    width = max(len(f.name) for f in FIXES)
    for f in FIXES:
        lines.append(f"{'on ' if f.name in on else 'off'}  {f.kind:<9}  {f.name:<{width}}  {f.target}")
    return "\n".join(lines)


def main(argv=None) -> int:
    print(describe())
    return 0
