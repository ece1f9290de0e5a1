"""The evidence study's command launcher (``python -m study``): every fairseq-train, evaluation,
SKD and extraction command of the study runs through :class:`Launcher`, forked from one
interpreter that has imported torch and fairseq, each in its own process group, stopped together
at the study's deadline.  It is how the job runner starts the study's stages
(``Runner(start=...)``, :meth:`study.run.Study.runner`).  Imports nothing of the study's other modules."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence


# imported once by the launcher's fork server; every command then starts without these imports
# torch._dynamo: torch.optim imports it when the first optimizer is built (2 CPU-seconds in every
# fairseq-train, measured with cProfile); sacremoses: study/evaluate.py's detokenizer, the one import
# left in every evaluation (1.2-1.7 CPU-seconds of its 3, measured with python -X importtime)
# the scorer's own imports are lazy (deepnmt_fairseq/scoring.py): sacremoses and sacrebleu by name
PRELOAD = ("torch", "torch._dynamo", "fairseq_cli.train", "fairseq_cli.generate", "deepnmt_fairseq", "sacremoses",
           "sacrebleu", "deepnmt_fairseq.scoring")
_FORKSERVER_LOCK = threading.Lock()
TICK = 60.0  # seconds between the calls of Launcher.run's tick while its command runs


class Deadline(Exception):
    """``--deadline-minutes`` has passed: the commands that were running are stopped (an interrupted
    run resumes from its last checkpoint), nothing new starts, and the same command goes on."""


class Launcher:
    """Runs the study's commands (console scripts, or ``python SCRIPT.py ...``) with exactly their
    argv and environment, as children forked from one interpreter that has imported :data:`PRELOAD`
    (multiprocessing's fork server).  A fresh ``fairseq-train`` spends about 6 CPU-seconds in
    imports; the study starts a few hundred commands.  ``fork=False`` runs them as subprocesses.

    Each command runs in its own process group; at ``deadline`` (``time.time()``) the group is sent
    SIGTERM (SIGKILL :data:`GRACE` seconds later), so a command's own children (``deepnmt-skd``'s
    shards) stop with it, and :class:`Deadline` is raised.  Under :meth:`stopping_on_signals`, a SIGTERM or SIGINT to
    the study is that deadline, now."""

    def __init__(self, env: Dict[str, str], threads: int, fork: bool = True, deadline: Optional[float] = None):
        import multiprocessing

        self.env, self.threads, self.deadline = dict(env), threads, deadline
        self.signalled: Optional[int] = None  # the signal that stopped the study (stopping_on_signals)
        self._running: set = set()  # pids of the running commands, each its process group's leader
        self.fork = fork and "forkserver" in multiprocessing.get_all_start_methods()
        if self.fork:
            self.ctx = multiprocessing.get_context("forkserver")
            self.ctx.set_forkserver_preload(list(PRELOAD))

    def _ensure_server(self):
        # the fork server starts (once per process) with the commands' environment, so that what
        # is read at interpreter start (PYTHONWARNINGS) is theirs
        from multiprocessing import forkserver

        with _FORKSERVER_LOCK:
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(self.env)
            try:
                forkserver.ensure_running()
            finally:
                os.environ.clear()
                os.environ.update(saved)

    def run(self, cmd: Sequence[str], out: Path, err: Optional[Path] = None,
            tick: Optional[Callable[[], None]] = None) -> int:
        """Run ``cmd``, appending its stdout to ``out`` and its stderr to ``err`` (default: ``out``);
        returns the exit code.  ``tick()`` is called every :data:`TICK` seconds while the command
        runs and no deadline or signal is stopping it (the study prunes a curve run's epoch
        checkpoints with it); an exception in it is printed, and the command goes on."""
        cmd = [str(c) for c in cmd]
        err = err or out
        self.check()
        if not self.fork:
            with open(out, "a") as fo, open(err, "a") as fe:
                proc = subprocess.Popen(cmd, stdout=fo, stderr=fe if err != out else subprocess.STDOUT,
                                        env=self.env, start_new_session=True)

                def wait(seconds: float) -> Optional[int]:
                    try:
                        return proc.wait(timeout=seconds)
                    except subprocess.TimeoutExpired:
                        return None
                return self._wait(proc.pid, wait, tick)
        self._ensure_server()
        proc = self.ctx.Process(target=_launched, args=(cmd, self.env, self.threads, str(out), str(err)))
        with _FORKSERVER_LOCK:  # Process.start() reads the exit status of every finished child: see _reap
            proc.start()
        code = self._wait(proc.pid, lambda seconds: self._reap(proc, seconds), tick)
        return code if code >= 0 else 128 - code

    def _wait(self, pid: int, wait, tick: Optional[Callable[[], None]] = None) -> int:
        """The exit code of the command whose process group ``pid`` leads; ``wait(seconds)`` waits
        for it to end (None: still running).  The wait is sliced into seconds that re-read the
        deadline, so that a deadline a signal moved reaches a wait already under way (a command that
        ignores SIGTERM included); a command that the deadline stopped, or that ended with an error
        after a signal, is stopped with its group (:meth:`_stop`, which raises :class:`Deadline`)."""
        self._running.add(pid)
        next_tick = time.time() + TICK
        try:
            while True:
                left = self.left()
                until_tick = max(0.0, next_tick - time.time()) if tick is not None else 1.0
                code = wait(min(1.0, until_tick) if left is None else min(1.0, until_tick, left))
                if (code is None and tick is not None and time.time() >= next_tick
                        and not self.signalled and self.left() != 0.0):  # stopping comes first
                    try:
                        tick()
                    except Exception as e:  # housekeeping: it never leaves the command unwatched
                        print(f"[launcher] tick failed ({type(e).__name__}: {e}); the command goes on",
                              file=sys.stderr, flush=True)
                    next_tick = time.time() + TICK
                if code is not None:
                    if self.signalled and code:  # ended by the signal, not finished
                        self._stop(pid, wait, reaped=True)
                    return code
                if self.left() == 0.0:
                    self._stop(pid, wait)
        finally:
            self._running.discard(pid)

    @staticmethod
    def _reap(proc, timeout: Optional[float]) -> Optional[int]:
        """``proc.join(timeout)``, safe with other threads starting commands.  A forkserver child's
        exit status is a few bytes in a pipe, read once; ``Process.start()`` in another thread polls
        every live child (multiprocessing's ``process._cleanup``), so a join that read at the same
        time found the pipe empty and reported exit code 255 for a command that had succeeded
        (measured: 2-6 of 300 two-thread launches of a one-line script).  The wait for the exit is
        unlocked; the read is under the lock that ``start()`` is called under."""
        from multiprocessing.connection import wait

        wait([proc.sentinel], timeout)
        with _FORKSERVER_LOCK:
            proc.join(0)
        return proc.exitcode

    def left(self) -> Optional[float]:
        """Seconds to the deadline (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    @contextlib.contextmanager
    def stopping_on_signals(self, signals=(signal.SIGTERM, signal.SIGINT)):
        """Within the block (the main thread's), SIGTERM or SIGINT (``kill``, ``kill -- -PGID``,
        Ctrl-C) stops the study as ``--deadline-minutes`` does, within a second: the running
        commands' process groups get SIGTERM (SIGKILL :data:`GRACE` seconds later, or at a second
        signal), each waiting :meth:`run` raises :class:`Deadline` (so the study keeps an
        interrupted run's wall time and partial record, and the same command resumes), and nothing
        new starts.  Without it, a killed study lost both, and its training child, in a process
        group of its own, trained on as an orphan.  The handler only signals and records: raising
        from it could interrupt the study's own writes.  ``signalled`` is the first signal; the
        handlers are restored on leaving, so a signal after the block acts as usual."""
        def stop(signum, frame):
            again = self.signalled is not None
            self.signalled = self.signalled or signum
            self.deadline = time.time()
            for pid in list(self._running):  # a command not yet in its own group: _wait's next slice
                self._kill(pid, signal.SIGKILL if again else signal.SIGTERM, group_only=True)

        saved = {sig: signal.getsignal(sig) for sig in signals}
        # the fork server (and multiprocessing's resource tracker), in the study's process group,
        # start ignoring the signals (a disposition that exec keeps; _launched restores SIGTERM's
        # in each command), so that a ``kill -- -PGID`` leaves them to report the exit codes of the
        # commands the handler stops: a dead fork server reports 255 at once, and a command waited
        # for in a worker thread (--jobs 2) ended as failed before the main thread's handler ran.
        # The signals are blocked meanwhile: one that comes is kept for the handler, not ignored.
        try:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
            try:
                if self.fork:
                    for sig in signals:
                        signal.signal(sig, signal.SIG_IGN)
                    self._ensure_server()
                for sig in signals:
                    signal.signal(sig, stop)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            yield self
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    def check(self) -> None:
        if self.deadline is not None and time.time() >= self.deadline:
            raise Deadline()

    #: seconds from a stopped command's SIGTERM to its SIGKILL
    GRACE = 30.0

    @staticmethod
    def _kill(pid: int, sig: int, group_only: bool = False) -> bool:
        """``sig`` to the process group of ``pid``, or (unless ``group_only``: the leader has been
        reaped, and its pid may have been reused) to ``pid`` alone while a forked command has not yet
        called os.setsid(); False when neither exists."""
        for kill in (os.killpg,) if group_only else (os.killpg, os.kill):
            try:
                kill(pid, sig)
                return True
            except ProcessLookupError:
                continue
        return False

    @staticmethod
    def _gone(pid: int) -> bool:
        try:
            os.killpg(pid, 0)
            return False
        except ProcessLookupError:
            return True

    @classmethod
    def _stop(cls, pid: int, wait, reaped: bool = False) -> None:
        """SIGTERM to the command's process group, SIGKILL after :data:`GRACE` seconds; then
        :class:`Deadline`.  ``wait(seconds)`` waits for the group's leader (``Popen.wait``, or
        :meth:`_reap` for a forked command); ``reaped``: it has ended, only the rest of its group
        (its own children) may be left."""
        for sig, grace in ((signal.SIGTERM, cls.GRACE), (signal.SIGKILL, 10.0)):
            if not cls._kill(pid, sig, group_only=reaped):
                break
            end = time.time() + grace
            try:
                wait(grace)
            except subprocess.TimeoutExpired:  # Popen.wait itself
                pass
            while not cls._gone(pid) and time.time() < end:  # the leader has ended; its children?
                time.sleep(0.1)
            if cls._gone(pid):
                break
        raise Deadline()


def _launched(cmd: List[str], env: Dict[str, str], threads: int, out: str, err: str) -> None:
    """The child of :class:`Launcher`: the command's environment, threads, argv and output files,
    then its console-script entry point (or ``runpy`` for ``python SCRIPT.py``)."""
    import runpy
    from importlib.metadata import entry_points

    import torch

    os.setsid()  # its own process group: the launcher stops the command and its children together
    # the fork server ignores both (see stopping_on_signals); the command gets Python's usual handling
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)
    sys.stdout.flush(), sys.stderr.flush()
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    if Path(cmd[0]).name.startswith("python") and cmd[1].endswith(".py"):
        sys.argv = cmd[1:]
        runpy.run_path(cmd[1], run_name="__main__")
        return
    sys.argv = cmd
    (ep,) = entry_points(group="console_scripts", name=Path(cmd[0]).name)
    sys.exit(ep.load()())
