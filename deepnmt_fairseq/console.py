"""Known-harmless third-party warnings, hidden in the project's own entry points only.

fairseq 0.12 on hydra 1.3 and torch 2.x prints about 30 lines of warnings before its first
log line, none of which a user can act on.  This module is the one list of them
(:data:`KNOWN`), measured on ``fairseq-train``/``fairseq-generate --user-dir deepnmt_fairseq``
(ve-fairseq 0.12.3, hydra-core 1.3, torch 2.13 CPU), each entry with what it is and why it is
harmless.  Two ways to apply it:

* :func:`quiet_known_warnings` installs the filters in the current process: the first call
  of every ``deepnmt-*`` console script's ``main()``;
* :func:`child_env` returns an environment whose ``PYTHONWARNINGS`` carries the same filters,
  for the fairseq processes the project starts (``deepnmt-skd``, ``scripts/quickstart.py``,
  ``scripts/gpkd_pipeline.py``).  The user's own ``PYTHONWARNINGS`` is kept, ours come last.

Nothing here runs on import: ``import deepnmt_fairseq`` (what ``--user-dir`` does) leaves
``warnings.filters`` as it is, so whoever runs ``fairseq-train --user-dir ...`` directly
sees every warning.  ``DEEPNMT_SHOW_WARNINGS=1`` turns the filtering off in our entry points
too.

Every filter names the warning's category and the start of its message (or, where
``PYTHONWARNINGS`` cannot express the message, the module and line that raise it); there is no
blanket ignore.  Deliberately *not* filtered:

* torch's ``Support for mismatched key_padding_mask and attn_mask is deprecated`` (the decoder
  self-attention gets a bool padding mask and a float future mask; a real, fixable mismatch);
* fairseq's ``torch.jit.script is deprecated`` DeprecationWarnings at import: Python hides
  DeprecationWarnings raised outside ``__main__`` by default, so they never reach the console
  unless a user asks for them (``-W default``), and then they should see them.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, Type

ENV_VAR = "DEEPNMT_SHOW_WARNINGS"


@dataclass(frozen=True)
class KnownWarning:
    name: str
    category: Type[Warning]
    #: regular expression matched at the start of the message (the in-process filter)
    message: str
    #: the same filter as ``PYTHONWARNINGS`` entries (``action:message:category:module:lineno``);
    #: their message field is a literal prefix and cannot hold ``:``, ``,`` or leading blanks
    pythonwarnings: Tuple[str, ...]
    #: where it is raised (file:line in hydra/torch/fairseq), for messages and docs
    source: str


KNOWN: Tuple[KnownWarning, ...] = (
    # fairseq 0.12 builds its config with hydra's old `hydra.experimental.initialize/compose`
    # (fairseq/dataclass/utils.py, convert_namespace_to_omegaconf: every fairseq CLI, and
    # loading a checkpoint saved with argparse args).  hydra 1.3 kept them as aliases of
    # hydra.initialize/compose that only add this notice; pyproject pins hydra-core < 1.4.
    KnownWarning(
        "hydra-experimental-initialize", UserWarning,
        r"hydra\.experimental\.initialize\(\) is no longer experimental",
        ("ignore:hydra.experimental.initialize() is no longer experimental:UserWarning:hydra.experimental.initialize",),
        "hydra/experimental/initialize.py:43",
    ),
    # Hydra14MigrationWarning (a UserWarning): fairseq passes no `version_base`, so hydra keeps
    # its 1.1 behaviour, which is what fairseq's configs are written for; it would only change
    # in hydra 1.4 (excluded by the pin).  The message starts with a newline, which
    # PYTHONWARNINGS cannot match: the filter names the module, whose other warnings are the
    # "no longer experimental" notices above.  (The category itself is not named there:
    # resolving hydra.errors.Hydra14MigrationWarning would import hydra at every start-up.)
    KnownWarning(
        "hydra-version-base", UserWarning,
        r"\s*The version_base parameter is not specified",
        ("ignore::UserWarning:hydra.experimental.initialize",),
        "hydra/experimental/initialize.py:45 (hydra/version.py)",
    ),
    # The compose half of the hydra.experimental alias (see above).
    KnownWarning(
        "hydra-experimental-compose", UserWarning,
        r"hydra\.experimental\.compose\(\) is no longer experimental",
        ("ignore:hydra.experimental.compose() is no longer experimental:UserWarning:hydra.experimental.compose",),
        "hydra/experimental/compose.py:25",
    ),
    # fairseq's own YAML configs (fairseq/config/config.yaml, model/*.yaml) start with
    # `# @package _group_`, hydra 1.0 syntax that hydra 1.1-1.3 still read the same way.
    # The message contains ':', so PYTHONWARNINGS names hydra's line instead (line 124 of
    # hydra-core 1.3.x's default_element.py raises only this one).
    KnownWarning(
        "hydra-package-group", UserWarning,
        r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'",
        ("ignore::UserWarning:hydra.core.default_element:124",),
        "hydra/core/default_element.py:124",
    ),
    # fairseq registers its dataclass config as 'config' in hydra's ConfigStore and composes
    # the YAML of the same name: hydra 1.1+ still validates one against the other
    # ("automatic schema matching"), which is exactly what fairseq relies on.  Its message
    # starts with a newline, and hydra raises it with stacklevel=11, i.e. at the top of the
    # stack: fairseq-train's stack is shallower, so Python reports "sys:1"; fairseq-generate's
    # reaches line 8 of the console script pip writes (`sys.exit(cli_main())`, module
    # __main__).  PYTHONWARNINGS can only name those two locations; they would also hide
    # another UserWarning raised with a stacklevel that points at the very top of the stack
    # (one that shows no useful source line either).
    KnownWarning(
        "hydra-schema-matching", UserWarning,
        r"\s*'[^']*' is validated against ConfigStore schema with the same name",
        ("ignore::UserWarning:sys:1", "ignore::UserWarning:__main__:8"),
        "hydra/_internal/config_loader_impl.py:441 (reported as sys:1 or fairseq-generate:8)",
    ),
    # fairseq calls hydra.compose(..., strict=False), a no-op flag since hydra 1.0.  The message
    # starts with a newline: PYTHONWARNINGS names the module, hydra/compose.py, whose only
    # warning this is.
    KnownWarning(
        "hydra-strict-flag", UserWarning,
        r"\s*The strict flag in the compose API is deprecated",
        ("ignore::UserWarning:hydra.compose",),
        "hydra/compose.py:56",
    ),
    # fairseq's batch iterators (fairseq/data/iterators.py) always build their DataLoader with
    # pin_memory=True.  Without a GPU torch skips the pinning; pinned memory only speeds up
    # host-to-GPU copies, so nothing is lost on a CPU.  (Older torch words the rest of the
    # message differently: the filter keeps to its common start.)
    KnownWarning(
        "pin-memory-no-accelerator", UserWarning,
        r"'pin_memory' argument is set as true but",
        ("ignore:'pin_memory' argument is set as true but:UserWarning:torch.utils.data.dataloader",),
        "torch/utils/data/dataloader.py (fairseq/data/iterators.py passes pin_memory=True)",
    ),
    # fairseq's FairseqTask.train_step wraps the forward pass in
    # torch.cuda.amp.autocast(enabled=<--amp>), the old spelling of
    # torch.amp.autocast("cuda", ...): same behaviour (off unless --amp).
    KnownWarning(
        "cuda-amp-autocast", FutureWarning,
        r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated",
        ("ignore:`torch.cuda.amp.autocast(args...)` is deprecated:FutureWarning:fairseq.tasks.fairseq_task",),
        "fairseq/tasks/fairseq_task.py:531",
    ),
)


def _shown(env: Mapping[str, str]) -> bool:
    return env.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def quiet_known_warnings() -> None:
    """Ignore the warnings of :data:`KNOWN` in this process (idempotent; no-op with
    ``DEEPNMT_SHOW_WARNINGS=1``).  For the project's own entry points only: never call it on
    import."""
    if _shown(os.environ):
        return
    for known in reversed(KNOWN):  # each insert goes first: keep the list's order
        warnings.filterwarnings("ignore", message=known.message, category=known.category)


def pythonwarnings_entries() -> Tuple[str, ...]:
    """The ``PYTHONWARNINGS`` entries of :data:`KNOWN`, without repeats."""
    return tuple(dict.fromkeys(e for k in KNOWN for e in k.pythonwarnings))


def child_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """A copy of ``env`` (default: ``os.environ``) whose ``PYTHONWARNINGS`` also ignores
    :data:`KNOWN`, for the fairseq processes the project starts.

    The user's own entries stay first; ours are appended (for ``PYTHONWARNINGS`` the later
    entry wins), once, however often the environment is passed down.  With
    ``DEEPNMT_SHOW_WARNINGS=1`` the environment is returned unchanged."""
    out = dict(os.environ if env is None else env)
    if _shown(out):
        return out
    ours = pythonwarnings_entries()
    theirs = [e for e in out.get("PYTHONWARNINGS", "").split(",") if e.strip() and e.strip() not in ours]
    out["PYTHONWARNINGS"] = ",".join([*theirs, *ours])
    return out


def exe(name: str) -> str:
    """The console script ``name`` of this interpreter's environment (beside ``sys.executable``),
    else ``name`` as found on ``PATH``: the one command resolver of every tool that starts the
    project's or fairseq's commands (``deepnmt-repro``, ``deepnmt-skd``, the scripts, the benchmarks)."""
    import sys
    from pathlib import Path

    cand = Path(sys.executable).with_name(name)
    return str(cand) if cand.exists() else name
