"""The ``deepnmt-*`` console scripts: argument parsing only.

Every command here is a module with ``build_parser()`` and ``main(argv=None)``.  Parsing
imports nothing but the standard library, so ``--help`` and argument errors answer at once
(importing torch and fairseq takes 4-20 s on a small CPU); the work itself is a library
function, ``deepnmt_fairseq.<module>.run(args)``, imported only after the arguments parsed.
This package is outside ``deepnmt_fairseq`` on purpose: importing ``deepnmt_fairseq`` registers
the plugin in fairseq (what ``--user-dir`` needs), which imports torch and fairseq.

Nothing in ``deepnmt_fairseq``, ``deepnmt_data`` or ``deepnmt_deploy`` imports this package (by an
import or by a module name; tests/test_import_cycles.py): the arrows run from here to the library.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Callable, Optional, Sequence, Union

from deepnmt_deploy.help_format import HelpFormatter

#: the mistakes a user makes (a missing path, a file that is not what it should be): one line
#: naming the problem, no traceback.  The library raises these with messages that name the flag.
#: A command adds its library's own error classes (and ValueError where its library raises it for
#: bad input) through ``run(..., errors=...)``.
USER_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
               # a file that is not a checkpoint, or one that pickles code (checkpoint_safety)
               "deepnmt_fairseq.checkpoint_safety:CorruptCheckpointError",
               "deepnmt_fairseq.checkpoint_safety:UnsafeCheckpointError")


#: the quick commands the job runner may run in its own process instead of starting an interpreter
#: (:data:`deepnmt_fairseq.jobs.runner.IN_PROCESS`; the library cannot name them: it never imports
#: this package): console script -> "module:main"
IN_PROCESS = {"deepnmt-average-checkpoints": "deepnmt_cli.average_checkpoints:main",
              "deepnmt-extract-student": "deepnmt_cli.extract_student:main"}


def in_process_commands() -> None:
    """Hand the job runner :data:`IN_PROCESS` (imports the library: call it once arguments parsed)."""
    from deepnmt_fairseq.jobs import runner

    for name, target in IN_PROCESS.items():
        runner.IN_PROCESS.setdefault(name, _resolve(target))


#: the one --help layout (deepnmt_deploy/help_format.py)
Formatter = HelpFormatter


def parser(prog: str, description: str, **kw) -> argparse.ArgumentParser:
    """An argument parser for command ``prog`` with the project's help layout."""
    return argparse.ArgumentParser(prog=prog, description=description.strip("\n"), formatter_class=Formatter,
                                   **kw)


def subparsers(p: argparse.ArgumentParser, **kw):
    """Sub-commands whose parsers share the project's help layout."""
    sub = p.add_subparsers(**kw)
    real_add = sub.add_parser

    def add_parser(name, **kw2):
        kw2.setdefault("formatter_class", Formatter)
        return real_add(name, **kw2)

    sub.add_parser = add_parser
    return sub


def run(prog: str, target: str, args: argparse.Namespace, errors: Sequence[Union[type, str]] = (),
        code: int = 1) -> int:
    """Import ``target`` ("module:function", under ``deepnmt_fairseq``) now that the arguments
    parsed, and call it with ``args``.  A user mistake (:data:`USER_ERRORS`, and ``errors``)
    ends in one line, ``PROG: error: MESSAGE``, exit code ``code``; anything else is a bug and keeps
    its traceback.  An entry of ``errors`` may be a class or "module:Class" (imported now)."""
    from deepnmt_fairseq.console import quiet_known_warnings

    quiet_known_warnings()  # known-harmless hydra/torch/fairseq warnings (deepnmt_fairseq/console.py)
    in_process_commands()  # the job runner's quick commands (deepnmt-distill runs averaging in-process)
    fn: Callable[[argparse.Namespace], Optional[int]] = _resolve(target)
    caught = tuple(_resolve(e) if isinstance(e, str) else e for e in (*USER_ERRORS, *errors))
    try:
        return int(fn(args) or 0)
    except caught as err:
        return fail(prog, str(err) or type(err).__name__, code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def fail(prog: str, message: str, code: int = 1) -> int:
    """Print ``PROG: error: MESSAGE`` to stderr and return ``code``."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
