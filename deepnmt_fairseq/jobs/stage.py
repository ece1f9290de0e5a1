"""A stage of a job, as data: its command, its inputs and outputs, its done-marker, which ranks run it.

The registry (:mod:`deepnmt_fairseq.repro.commands`), ``deepnmt-distill`` (:mod:`deepnmt_fairseq.distill`),
the quickstart and the study only *plan* lists of :class:`Stage`; :class:`deepnmt_fairseq.jobs.runner.Runner`
runs them (docs/architecture.md).
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Dict, List, Optional, TextIO, Union


class JobError(RuntimeError):
    """A clear, user-facing error of a job (a bad name, a missing input, a failed step, a launch that
    cannot work); the message names the flag, file or stage.  The runner's and the cluster policy's
    errors are kinds of it, and ``deepnmt-repro`` reports every one (its ``ReproError`` is this class)."""


def make_log(prefix: str, stream: Optional[TextIO] = None, echo: Optional[Callable[[str], None]] = None,
             stdout: bool = False):
    """The one timestamped log line of the project's runners: ``[prefix HH:MM:SS] message``, to
    ``stream``, through ``echo``, or to stderr (``stdout``: stdout), looked up when called."""

    def log(msg: str) -> None:
        line = f"[{prefix} {time.strftime('%H:%M:%S')}] {msg}"
        if echo is not None:
            echo(line)
            sys.stdout.flush()
        else:
            print(line, file=stream or (sys.stdout if stdout else sys.stderr), flush=True)

    return log


def quote(argv) -> str:
    """A command as one shell line."""
    return " ".join(shlex.quote(str(a)) for a in argv)


ArgvOrFn = Union[List[str], Callable[[], List[str]]]


@dataclass
class Action:
    """What a stage does: ``argv`` (a console script by name, then its arguments; or a function
    returning them, for a stage whose flags are read from an earlier stage's output when it starts:
    the extracted student's architecture), or ``call``, a Python step instead of a command (the
    report); ``log``: where the command's output goes; ``rank0_only``: in a job of several processes
    (torchrun / Slurm ranks) rank 0 runs it while the other ranks wait for its done-marker."""

    argv: ArgvOrFn
    call: Optional[Callable[[], None]] = field(default=None, repr=False, compare=False)
    log: Optional[Path] = None
    rank0_only: bool = False

    def command(self) -> List[str]:
        return [str(c) for c in (self.argv() if callable(self.argv) else self.argv)]


@dataclass
class Completion:
    """When a stage counts as finished.  ``marker``: ``output`` is a directory that the runner marks
    complete with a ``.done`` file after the command succeeds (fairseq-train's save directory, the
    exported model); otherwise the command itself writes ``output`` only when it is complete
    (averaging, extraction write atomically; deepnmt-skd writes ``.done`` last: ``done`` names that
    file, when it is neither ``output`` nor ``output/.done``).  ``ok_if_output``: a failing command
    still counts when its output appeared meanwhile (another job averaged); ``refresh``: run by rank 0
    before the done check (an averaged model older than its checkpoints is set aside)."""

    output: Path
    marker: bool = False
    done: Optional[Path] = None
    ok_if_output: bool = False
    refresh: Optional[Callable[[], None]] = field(default=None, repr=False, compare=False)

    def done_file(self) -> Path:
        if self.done is not None:
            return self.done
        return self.output / ".done" if self.marker else self.output

    def failed_file(self) -> Path:
        """Where rank 0 says that this stage failed (the other ranks stop waiting)."""
        d = self.done_file()
        return d.with_name(d.name + ".failed")

    def is_done(self) -> bool:
        return self.done_file().exists()


@dataclass
class Inputs:
    """What a stage reads: ``needs``, the done-markers of the stages whose outputs it reads (a rank
    other than 0 waits for those this run makes); ``preflight``, checks run for every unfinished stage
    before the first stage starts (a missing dataset)."""

    needs: List[Path] = field(default_factory=list)
    preflight: Optional[Callable[[], None]] = field(default=None, repr=False, compare=False)


@dataclass
class Training:
    """What a training stage adds: ``batch``, its batch arithmetic (tokens per update over the
    processes), for messages; ``history``: append the command to ``output/commands.jsonl`` and note a
    changed command."""

    batch: Optional[Dict[str, int]] = None
    history: bool = False


#: a stage's parts: attribute -> class
PARTS = {"action": Action, "completion": Completion, "inputs": Inputs, "training": Training}


def _read_through(cls):
    """Every field of every part reads as the stage's own: ``stage.output`` is ``stage.completion.output``."""

    def view(part: str, name: str) -> property:
        return property(lambda self: getattr(getattr(self, part), name), doc=f"``{part}.{name}``")

    for part, kind in PARTS.items():
        for f in fields(kind):
            setattr(cls, f.name, view(part, f.name))
    return cls


@_read_through
@dataclass(init=False)
class Stage:
    """One step of a job: a ``name``, its ``kind`` (train, average, skd, extract, export, report) and
    ``what`` it does in words (for messages), and four small parts: :class:`Action` (the command, its
    log, which ranks run it), :class:`Completion` (what it writes and the file that says it finished),
    :class:`Inputs` (the markers it needs, its preflight check) and :class:`Training` (the batch
    arithmetic and command history of a training stage).

    It is built from the flat keywords of every part, ``Stage(name, argv, output, marker=..., ...)``;
    the parts' fields read as the stage's own (``stage.output``, ``stage.needs``, ...)."""

    name: str
    kind: str
    what: str
    action: Action
    completion: Completion
    inputs: Inputs
    training: Training

    def __init__(self, name: str, argv: ArgvOrFn, output: Path, marker: bool = False, log: Optional[Path] = None,
                 what: str = "", call: Optional[Callable[[], None]] = None, done: Optional[Path] = None,
                 kind: str = "", rank0_only: bool = False, needs: Optional[List[Path]] = None,
                 batch: Optional[Dict[str, int]] = None, history: bool = False, ok_if_output: bool = False,
                 preflight: Optional[Callable[[], None]] = None, refresh: Optional[Callable[[], None]] = None):
        self.name, self.kind, self.what = name, kind, what
        self.action = Action(argv, call, log, rank0_only)
        self.completion = Completion(output, marker, done, ok_if_output, refresh)
        self.inputs = Inputs(needs if needs is not None else [], preflight)
        self.training = Training(batch, history)

    def done_file(self) -> Path:
        return self.completion.done_file()

    def failed_file(self) -> Path:
        """Where rank 0 says that this stage failed (the other ranks stop waiting)."""
        return self.completion.failed_file()

    def is_done(self) -> bool:
        return self.completion.is_done()

    def command(self) -> List[str]:
        return self.action.command()

    def resolved(self) -> List[str]:
        """:meth:`command` with the console script resolved to this environment's
        (:func:`deepnmt_fairseq.console.exe`), for callers that start it themselves."""
        from ..console import exe

        argv = self.command()
        return [exe(argv[0]), *argv[1:]] if argv else argv

    def command_line(self) -> str:
        if callable(self.argv):
            return f"({self.what}: its flags are read when it starts)"
        return quote(self.argv) if self.argv else f"(in-process: {self.what})"

    def shell(self) -> str:
        return quote(self.command())
