"""A stage of a job, as data: its command, its inputs and outputs, its done-marker, which ranks run it.

The registry (:mod:`deepnmt_fairseq.repro.commands`), ``deepnmt-distill`` (:mod:`deepnmt_fairseq.distill`),
the quickstart and the study only *plan* lists of :class:`Stage`; :class:`deepnmt_fairseq.jobs.runner.Runner`
runs them (docs/architecture.md).
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, TextIO


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


@dataclass
class Stage:
    """One step: ``argv`` (a console script by name, then its arguments) makes ``output``.

    ``marker``: ``output`` is a directory that the runner marks complete with a ``.done`` file
    after the command succeeds (fairseq-train's save directory, the exported model); otherwise
    the command itself writes ``output`` only when it is complete (averaging, extraction write
    atomically; deepnmt-skd writes ``.done`` last: ``done`` names that file).  ``call``: a Python
    step instead of a command (the report).

    For jobs of several processes (torchrun / Slurm ranks): ``rank0_only`` stages run on rank 0
    while the other ranks wait for their done-marker (:class:`~deepnmt_fairseq.jobs.runner.Runner`);
    ``needs`` are the done-markers of the stages whose outputs this one reads."""

    name: str
    #: the command; or a function returning it, for a stage whose flags are read from an earlier
    #: stage's output when it starts (the extracted student's architecture)
    argv: "List[str] | Callable[[], List[str]]"
    output: Path
    marker: bool = False
    log: Optional[Path] = None
    what: str = ""
    call: Optional[Callable[[], None]] = field(default=None, repr=False, compare=False)
    #: the file that says the stage finished, when it is neither ``output`` nor ``output/.done``
    done: Optional[Path] = None
    #: the kind of step, for messages (train, average, skd, extract, export, report)
    kind: str = ""
    rank0_only: bool = False
    needs: List[Path] = field(default_factory=list)
    #: the batch arithmetic of a training stage (tokens per update over the processes), for messages
    batch: Optional[Dict[str, int]] = None
    #: append the command to ``output/commands.jsonl`` and note a changed command (training stages)
    history: bool = False
    #: a failing command still counts when its output appeared meanwhile (another job averaged)
    ok_if_output: bool = False
    #: checks run for every unfinished stage before the first stage starts (a missing dataset)
    preflight: Optional[Callable[[], None]] = field(default=None, repr=False, compare=False)
    #: run by rank 0 before the done check (an averaged model older than its checkpoints is set aside)
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

    def command(self) -> List[str]:
        return [str(c) for c in (self.argv() if callable(self.argv) else self.argv)]

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
