"""The one runner: executes a list of :class:`~deepnmt_fairseq.jobs.stage.Stage` for every caller.

* a stage whose done-marker exists is skipped (every command resumes: fairseq-train from its
  ``checkpoint_last.pt``, deepnmt-skd from its first unfinished shard);
* before the first stage, every unfinished stage's ``preflight`` runs (a missing dataset is an
  error before any process group starts);
* each command's output is teed to the stage's log (all of it to the console with
  ``echo_all``, else its progress lines), ``.done`` written for ``marker`` stages;
* :func:`settings_guard` ties a work directory to the settings it was made with;
* several processes (a :class:`~deepnmt_fairseq.jobs.cluster.Launch` with a rank): every rank
  walks the same stages; ``rank0_only`` stages run on rank 0 while the others wait for their
  done-marker, at most :func:`~deepnmt_fairseq.jobs.cluster.rank0_timeout` seconds.  A rank-0
  stage that fails writes ``<done-marker>.failed`` (with this job's id) and every waiting rank
  exits with its error; a rank waiting for an input rank 0 writes checks it first and fails at
  once if none of this run's stages makes it.
* a ``state_dir`` (the experiment's folder) adds the cluster guards (issue 82): rank 0 takes the
  folder's lock (``.job.lock``, its job id: a second job on the same folder is refused unless it is
  the same job requeued, or the holder is gone), writes a token (``.rank0-token``) that every other
  rank must see there within :func:`~deepnmt_fairseq.jobs.cluster.shared_root_wait` seconds (else the
  checkpoint root is not shared), and refreshes a heartbeat (``.rank0-heartbeat``) while it works; a
  rank waiting for rank 0 stops when that heartbeat has not changed for
  :func:`~deepnmt_fairseq.jobs.cluster.rank0_stale` seconds (rank 0 died, OOM-killed say).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Type, Union

from .stage import JobError, Stage, make_log, quote

# lines of a stage's log echoed to the console: fairseq-train's progress and validation, deepnmt-skd's
# progress, fairseq-generate's summary, errors
PROGRESS = re.compile(r"\bepoch \d+|done training|valid on|\[skd |Translated \d|error|Error|Traceback|exported ")

#: the package's own quick commands that may run in this process (no second interpreter and fairseq
#: import, which take half a minute on a loaded 2-core machine): console script -> its ``main(argv)``.
#: The command-line layer fills it (:func:`deepnmt_cli.in_process_commands`) before it calls the
#: library; the library never imports that layer, and without it every command runs as a process.
IN_PROCESS: Dict[str, Callable[[List[str]], Optional[int]]] = {}

#: seconds between looks at rank 0's markers
WAIT_POLL = 30.0

#: fairseq-train's exit status after it saved checkpoint_last.pt on SIGUSR1 (the plugin's fix
#: ``save_on_usr1``; :data:`deepnmt_fairseq.behaviour_fixes.USR1_EXIT`)
USR1_EXIT = 75


class RunError(JobError):
    """A stage failed; the message names the stage, its command and its log."""


LOCK, TOKEN, HEARTBEAT = ".job.lock", ".rank0-token", ".rank0-heartbeat"


def _me(launch=None) -> str:
    """This job's id (the ranks' shared one; else their rendezvous), else this process on this host
    (one local run)."""
    import socket

    from .cluster import job_id

    if job_id():
        return job_id()
    if launch is not None and launch.rank is not None:
        return f"init:{launch.init_method}"
    return f"local:{socket.gethostname()}:{os.getpid()}"


def _read_json(path: Path) -> Optional[Dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a reader in another thread or process never sees half of it
    (the temporary file is named by the process, so two processes never share one)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_json(path: Path, data: Dict) -> None:
    write_atomic(path, json.dumps(data) + "\n")


def settings_guard(work: Path, settings: Dict, name: str = "settings.json", flag: str = "--work-dir",
                   error: Type[Exception] = RunError,
                   missing_as_default: Union[bool, Mapping[str, object]] = False) -> None:
    """Tie ``work`` to ``settings``: the first run writes them, a run with other settings is refused
    (the outputs in ``work`` were made with the old ones).  ``missing_as_default``: a setting absent
    from the stamp (added to the tool later) compares as ``None`` (``True``) or as the mapping's value
    for it (a mapping: e.g. the dataclass defaults, or the current value of a setting that only new
    runs use), and the stamp is rewritten."""
    work.mkdir(parents=True, exist_ok=True)
    stamp = work / name
    settings = json.loads(json.dumps(settings))  # the JSON view (tuples as lists, paths as strings)
    if stamp.exists():
        old = json.loads(stamp.read_text())
        absent = json.loads(json.dumps(dict(missing_as_default))) if isinstance(missing_as_default, Mapping) else {}
        keys = settings if missing_as_default else sorted(set(old) | set(settings))
        diff = {k: {"then": old.get(k, absent.get(k)), "now": settings.get(k)} for k in keys
                if old.get(k, absent.get(k)) != settings.get(k)}
        if diff:
            raise error(f"{work} holds a run with other settings ({stamp}): {json.dumps(diff)}; "
                        f"use another {flag}, or the same settings to resume")
        if not missing_as_default:
            return
    write_atomic(stamp, json.dumps(settings, indent=2, sort_keys=True) + "\n")


def _resolve(name: str) -> str:
    from ..console import exe

    return name if os.sep in name else exe(name)


class Runner:
    """Runs stages (module doc).  ``prefix``: the log lines' ``[prefix HH:MM:SS]``; ``echo``: where
    they go (a function; default stderr); ``echo_all``: every output line of a command to the
    console (else its progress lines); ``in_process``: the package's quick commands
    (:data:`IN_PROCESS`) run in this process; ``launch``: the ranks of a multi-process job;
    ``error``: the exception class of failures (a caller's own, e.g. ReproError); ``start``: how a
    stage's command is started, ``start(cmd, log) -> exit status`` (default :meth:`tee`): the evidence
    study hands its launcher's (a fork server that has imported torch and fairseq, a process group
    per command, the study's deadline), so that its runs are stages of this runner too.  The exit
    status of the last command is :attr:`returncode` (a caller that records a failure reads it)."""

    def __init__(self, prefix: str = "distill", env: Optional[Dict[str, str]] = None,
                 echo: Optional[Callable[[str], None]] = print, echo_all: bool = False, in_process: bool = True,
                 launch=None, error: Type[Exception] = RunError, numbered: bool = True,
                 state_dir: Optional[Path] = None,
                 start: Optional[Callable[[List[str], Optional[Path]], int]] = None):
        from ..console import child_env

        self.prefix = prefix
        self.env = child_env(dict(env if env is not None else os.environ, PYTHONUNBUFFERED="1"))
        self.echo = echo
        self.echo_all = echo_all
        self.in_process = in_process
        self.launch = launch
        self.error = error
        self.numbered = numbered
        self.log = make_log(prefix, echo=echo)
        self.ran: List[str] = []  # names of the stages run (not skipped) by this runner
        self.started = time.time()
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.start = start
        self.returncode: Optional[int] = None  # the exit status of the last command started
        self.notice = False  # SIGUSR1 came (a cluster's notice before its time limit)
        self._child: Optional[subprocess.Popen] = None
        self._forward = False  # pass SIGUSR1 on to the running command (a training stage)

    # ---------------------------------------------------------------- SIGUSR1
    def _on_usr1(self, signum, frame) -> None:
        """The notice: a running training stage gets it too (fairseq saves at its next update and
        exits 75); any other command finishes, and no further stage starts."""
        self.notice = True  # (no printing here: the handler may interrupt a print of the main thread)
        child = self._child
        if self._forward and child is not None and child.poll() is None:
            child.send_signal(signal.SIGUSR1)

    def _stop_on_notice(self) -> None:
        if self.notice:
            raise self.error("stopped on SIGUSR1 (the cluster's notice before its time limit) before the next stage; "
                             "the same command (or the requeued job) resumes: finished stages are skipped")

    @property
    def is_rank0(self) -> bool:
        return self.launch is None or self.launch.is_rank0

    # ---------------------------------------------------------------- the loop
    def run(self, stages: Iterable[Stage]) -> None:
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGUSR1, self._on_usr1) if main else None
        try:
            if self.state_dir is None:
                self._run(list(stages))
            else:
                self._guarded(list(stages))
        finally:
            if main:
                signal.signal(signal.SIGUSR1, previous if previous is not None else signal.SIG_DFL)

    # ---------------------------------------------------------------- the cluster guards
    @property
    def _several(self) -> bool:
        return self.launch is not None and self.launch.rank is not None and self.launch.world_size > 1

    def _guarded(self, stages: List[Stage]) -> None:
        from .cluster import heartbeat_every

        state = self.state_dir
        if not self.is_rank0:
            self._check_shared_root()
            self._run(stages)
            return
        # an input from outside this run that is missing fails before the folder, its lock or its
        # heartbeat exist (nothing is left behind by a job that could not start)
        produced = {st.done_file() for st in stages}
        pending = next((st for st in stages if not st.is_done()), None)
        if pending is not None:
            self.check_inputs([n for n in pending.inputs.needs if n not in produced])
        state.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(stop, heartbeat_every()), daemon=True,
                                name="rank0-heartbeat")
        try:
            self._beat()
            if self._several:
                from .cluster import restart_count

                _write_json(state / TOKEN, {"job": _me(self.launch), "restart": restart_count(), "time": time.time()})
            beat.start()
            self._run(stages)
        finally:
            stop.set()
            if beat.is_alive():
                beat.join(timeout=5)
            lock = _read_json(state / LOCK)
            if lock is not None and lock.get("job") == _me(self.launch):
                (state / LOCK).unlink(missing_ok=True)

    def _beat(self) -> None:
        try:
            _write_json(self.state_dir / HEARTBEAT, {"job": _me(self.launch), "time": time.time(), "pid": os.getpid()})
        except OSError:
            pass  # a full disk fails the stage itself; the heartbeat is only a hint

    def _heartbeat(self, stop: threading.Event, every: float) -> None:
        while not stop.wait(every):
            self._beat()

    def _take_lock(self) -> None:
        """One job per experiment folder: the lock holds the job id; the same job (requeued) takes it
        back; a holder that is gone (its process on this host ended, or its heartbeat stale) loses it."""
        import socket

        from .cluster import rank0_stale

        path = self.state_dir / LOCK
        me = {"job": _me(self.launch), "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _read_json(path) or {}
            why = self._stale_lock(other, rank0_stale())
            if other.get("job") != me["job"] and why is None:
                raise self.error(
                    f"{self.state_dir} is in use by job {other.get('job', '?')} (lock {path}, host "
                    f"{other.get('host', '?')}, since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(other.get('time', 0)))}): "
                    "one job per experiment folder. Wait for it, cancel it, or, if it is gone, delete the lock; a "
                    "requeued job (the same job id) takes its own lock back")
            if other.get("job") != me["job"]:
                self.log(f"taking over the lock {path} of job {other.get('job')}: {why}")
            _write_json(path, me)
            return
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me) + "\n")

    def _stale_lock(self, other: Dict, stale: float) -> Optional[str]:
        """Why the lock ``other`` is no longer held (None: it is)."""
        import socket

        job = str(other.get("job", ""))
        if job.startswith("local:") and other.get("host") == socket.gethostname():
            try:
                os.kill(int(other.get("pid", -1)), 0)
            except (ProcessLookupError, ValueError):
                return f"its process {other.get('pid')} has ended"
            except PermissionError:
                pass
            return None
        beat = _read_json(self.state_dir / HEARTBEAT) or {}
        if beat.get("job") != job:
            return "its heartbeat is gone" if time.time() - float(other.get("time", 0)) > stale else None
        age = time.time() - float(beat.get("time", 0))
        return f"its heartbeat is {age:.0f} s old (limit {stale:.0f} s)" if age > stale else None

    def _check_shared_root(self) -> None:
        """A rank other than 0: rank 0's token of this job must be visible in the checkpoint root."""
        from .cluster import restart_count, shared_root_wait

        path = self.state_dir / TOKEN
        wait = shared_root_wait()
        want = {"job": _me(self.launch), "restart": restart_count()}
        start = time.time()
        while True:
            token = _read_json(path) or {}
            if {k: token.get(k) for k in want} == want:
                return
            if time.time() - start > wait:
                seen = f"it holds {token.get('job')} (restart {token.get('restart')})" if token else "it does not exist"
                raise self.error(
                    f"rank {self.launch.rank}: rank 0's token {path} of this job ({want['job']}, restart "
                    f"{want['restart']}) is not visible here after {wait:.0f} s ($DEEPNMT_SHARED_ROOT_WAIT; {seen}): "
                    "the checkpoint root ($DEEPNMT_CHECKPOINTS / --checkpoint-root) must be one filesystem shared "
                    "by every node (on a node-local disk a requeue onto another node silently starts from scratch)")
            time.sleep(min(1.0, max(0.05, wait / 20)))

    def _rank0_gone(self, seen: Dict) -> Optional[str]:
        """While waiting: rank 0's heartbeat unchanged for longer than the limit (None: it lives)."""
        from .cluster import rank0_stale

        if self.state_dir is None:
            return None
        path = self.state_dir / HEARTBEAT
        beat = _read_json(path)
        now = time.time()
        key = json.dumps(beat, sort_keys=True) if beat is not None and beat.get("job") == _me(self.launch) else None
        if key != seen.get("key"):
            seen["key"], seen["since"] = key, now
        limit = rank0_stale()
        if now - seen["since"] > limit:
            what = "has not changed" if key is not None else "of this job has not appeared"
            return (f"rank 0's heartbeat {path} {what} for {now - seen['since']:.0f} s (limit {limit:.0f} s, "
                    "$DEEPNMT_RANK0_STALE): rank 0 died or hangs (killed for memory? look at its log)")
        return None

    def _run(self, stages: List[Stage]) -> None:
        for st in stages:
            if st.inputs.preflight is not None and not st.is_done():
                st.inputs.preflight()
        # markers written by rank 0 in this run: a non-zero rank may get to a stage before rank 0 wrote them
        produced = {st.done_file(): st for st in stages}
        for i, st in enumerate(stages, 1):
            head = f"stage {i}/{len(stages)} {st.name}" if self.numbered else st.name
            self._stop_on_notice()
            if self.is_rank0:
                try:
                    self._stage(st, head, stages, produced)
                except BaseException as err:
                    if self.launch is not None and self.launch.rank is not None:
                        self._mark_failed(st, err)
                    raise
            else:
                self._stage(st, head, stages, produced)

    def _stage(self, st: Stage, head: str, stages: Sequence[Stage], produced: Dict[Path, Stage]) -> None:
        if self.is_rank0:
            if st.completion.refresh is not None:
                st.completion.refresh()
            st.failed_file().unlink(missing_ok=True)
        if st.is_done():
            self.log(f"{head}: done earlier ({st.done_file()})" +
                     ("; skipping - delete that .done file to train further" if st.training.history else ""))
            return
        if not self.is_rank0:
            # inputs from outside this run (another experiment, a stage not selected) exist or never will;
            # the others are rank 0's to write, maybe still under way: wait for them, then check
            self.check_inputs([n for n in st.inputs.needs if n not in produced])
            if st.action.rank0_only:  # rank 0 runs it; here only its result counts
                self.wait_for(st, st, stages)
                return
            for n in st.inputs.needs:
                if n in produced and not n.exists():
                    self.wait_for(produced[n], st, stages)
        self.check_inputs(st.inputs.needs)
        b = st.training.batch
        if b and b["effective_tokens_per_update"] > 1.25 * b["tokens_per_update"]:
            self.log(f"warning: {b['world_size']} processes x {b['max_tokens']} tokens exceed the paper's "
                     f"{b['tokens_per_update']} tokens per update; use fewer GPUs or --max-tokens")
        self.log(f"{head}: {st.what}")
        t0 = time.time()
        self.execute(st, t0)
        self.ran.append(st.name)
        self.log(f"{head}: finished in {time.time() - t0:.0f} s")

    def execute(self, st: Stage, t0: Optional[float] = None) -> None:
        t0 = time.time() if t0 is None else t0
        argv: List[str] = []
        if st.action.call is not None:
            st.action.call()
        else:
            argv = st.command()
            if st.training.history and self.is_rank0:
                record_command(st.completion.output, argv, st.training.batch, self.log)
            self._forward = bool(st.training.history)
            try:
                self.command(argv, st.action.log if self.is_rank0 else None, st.name)
            except self.error:
                if not (st.completion.ok_if_output and st.done_file().exists()):
                    raise
        if st.completion.marker and self.is_rank0:
            st.completion.output.mkdir(parents=True, exist_ok=True)
            st.done_file().write_text(json.dumps({"finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                                                  "argv": argv,
                                                  "seconds": round(time.time() - t0, 1)}) + "\n")
        if self.is_rank0 and not st.is_done():
            raise self.error(f"stage {st.name}: finished without writing {st.done_file()}")

    # ---------------------------------------------------------------- commands
    def command(self, argv, log: Optional[Path] = None, name: str = "") -> None:
        """Run ``argv`` (a console script by name first); its output goes to ``log`` (appended:
        a resumed stage keeps its history) and to the console (all of it, or its progress lines)."""
        argv = [str(a) for a in argv]
        main = IN_PROCESS.get(argv[0]) if self.in_process else None
        if main is not None:
            self.log("$ " + quote(argv))
            rc = self.returncode = main(argv[1:])
            if rc:
                raise self.error(f"stage {name}: {argv[0]} failed (exit {rc})")
            return
        cmd = [_resolve(argv[0]), *argv[1:]]
        self._stop_on_notice()
        self.log("$ " + quote(argv))
        self.returncode = None
        rc = self.returncode = self.tee(cmd, log) if self.start is None else self.start(cmd, log)
        if rc == USR1_EXIT and self.notice:
            raise self.error(f"stage {name}: stopped on SIGUSR1 after saving checkpoint_last.pt at its last update "
                             f"({argv[0]} exit {rc}); the same command (or the requeued job) resumes from it")
        if rc:
            tail = ""
            if log is not None and not self.echo_all and log.exists():
                tail = f"; end of {log}:\n" + log.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise self.error(f"stage {name}: {argv[0]} failed (exit {rc}); fix the cause and re-run the same "
                             f"command: finished stages are skipped and every command resumes{tail}")

    def tee(self, cmd: List[str], log: Optional[Path]) -> int:
        """Start ``cmd``; its output goes to ``log`` (if any) and to the console; its exit status."""
        fh = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            fh = open(log, "a", encoding="utf-8")
            fh.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} $ {quote(cmd)}\n")
            fh.flush()
        try:
            try:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env, text=True,
                                        errors="replace", bufsize=1)
            except FileNotFoundError as err:
                raise self.error(f"cannot start {cmd[0]}: {err} (is the environment activated?)") from None
            self._child = proc
            try:
                for line in proc.stdout:
                    if fh:
                        fh.write(line)
                    if self.echo_all:
                        sys.stdout.write(line)
                        sys.stdout.flush()
                    elif PROGRESS.search(line) and self.echo is not None:
                        self.echo(f"  {line.rstrip()}")
                return proc.wait()
            except BaseException:
                proc.terminate()
                proc.wait()
                raise
        finally:
            self._child, self._forward = None, False
            if fh:
                fh.close()

    # ---------------------------------------------------------------- ranks
    def check_inputs(self, needs: Sequence[Path]) -> None:
        missing = [n for n in needs if not n.exists()]
        if missing:
            raise self.error("missing input(s): " + ", ".join(map(str, missing)) +
                             " - run the experiment(s) they belong to first (deepnmt-repro train NAME, "
                             "or scripts/train.sh NAME)")

    def _mark_failed(self, st: Stage, err: BaseException) -> None:
        from .cluster import job_id

        try:
            path = st.failed_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"job": job_id(), "stage": st.name,
                                        "error": f"{type(err).__name__}: {err}"}) + "\n")
        except OSError:
            pass  # the original error matters more

    def _failure(self, stages: Sequence[Stage]) -> Optional[str]:
        """Rank 0's failure in this job, if any of ``stages`` has one (markers of other jobs ignored)."""
        from .cluster import job_id

        me = job_id()
        for st in stages:
            path = st.failed_file()
            try:
                if path.stat().st_mtime < self.started - 120:
                    continue  # older than this job
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if info.get("job", "") == me:
                return f"rank 0 failed at stage {info.get('stage')}: {info.get('error')}"
        return None

    def wait_for(self, producer: Stage, waiter: Stage, stages: Sequence[Stage], poll: Optional[float] = None) -> None:
        """Wait for rank 0 to finish ``producer`` (``waiter`` needs it); an error naming the stage when
        rank 0 failed or after :func:`~deepnmt_fairseq.jobs.cluster.rank0_timeout` seconds."""
        from . import runner as _self
        from .cluster import rank0_timeout

        poll = _self.WAIT_POLL if poll is None else poll
        timeout = rank0_timeout()
        marker = producer.done_file()
        what = producer.name + (f" (input of {waiter.name})" if waiter is not producer else "")
        start = time.time()
        seen: Dict = {}
        while not marker.exists():
            failure = self._failure(stages) or self._rank0_gone(seen)
            if failure:
                raise self.error(f"rank {self.launch.rank}: {failure}; this rank stops too")
            waited = time.time() - start
            if waited > timeout:
                raise self.error(f"rank {self.launch.rank}: rank 0's step {what} did not finish within "
                                 f"{timeout:.0f} s ($DEEPNMT_RANK0_TIMEOUT); its marker {marker} never appeared - "
                                 "look at rank 0's log")
            self.log(f"waiting for rank 0: {what} ({marker}); {waited:.0f} s")
            time.sleep(min(poll, max(0.01, timeout - waited + 0.01)))


def record_command(stage_dir: Path, argv: List[str], batch=None, log=None) -> None:
    """Append the command to <stage>/commands.jsonl and note when it differs from the last run's."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    path = stage_dir / "commands.jsonl"
    entry = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": argv, "batch": batch}
    if path.exists():
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if lines and log is not None:
            prev = json.loads(lines[-1]).get("argv", [])
            if prev != argv:
                changed = sorted(set(prev) ^ set(argv))
                log(f"note: {stage_dir} was started with a different command; fairseq resumes from its "
                    f"checkpoint_last.pt with the new one (differences: {' '.join(changed[:12])})")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
