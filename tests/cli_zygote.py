"""A warm interpreter for the tests' console-script runs (``fairseq_helpers.run_cli``).

A fresh ``fairseq-train`` spends about 6 CPU-seconds importing torch and fairseq (fairseq's
task and criterion registries pull in scikit-learn and scipy.stats) before it reads its first
argument; the suite starts a few hundred such commands (measured: 237 processes, a quarter to a
third of the suite's CPU time on 2 cores).  For each console script of :data:`SCRIPTS`, this
module keeps one interpreter per test process that has imported the script's entry point, and
forks every run of that script from it, the way ``study/launcher.py`` runs the
evidence study's commands.

What a forked command shares with the warm interpreter, and how it is kept honest:

* the import of its own entry point's module, exactly as a fresh process does it first (import
  order matters: fairseq's modules call ``logging.basicConfig`` at import, so whichever runs first
  decides where a command's log goes), then ``torch._dynamo`` (which torch.optim imports at the
  first optimizer anyway); *not* ``deepnmt_fairseq`` (a command without ``--user-dir`` must not see
  the plugin's models or fixes, as in a fresh process);
* the environment read at interpreter start-up: a command whose start-up variables
  (:data:`STARTUP_PREFIXES`: ``PYTHONWARNINGS``, thread counts, ...) differ from the warm
  interpreter's runs as a plain subprocess instead (:meth:`Zygote.can_run`);
* ``sys.path``: the warm interpreter's first entry is the console scripts' directory, as a fresh
  ``fairseq-train`` has it (not this tests/ directory);
* import-time warnings are printed once, by the warm interpreter, not by each command: a test of
  what a command prints at start-up (tests/test_console_warnings.py) runs real processes
  (``run_cli(..., fork=False)``).

The command itself runs as in a fresh process: its argv, environment and working directory, its
own process group, stdin from /dev/null, stdout and stderr to files, and Python's own handling of
its exit (``sys.exit(entry_point())``: an exception prints its traceback and exits 1, atexit
handlers run).

Protocol (one JSON object per line): the client writes ``{argv, env, cwd, out, err}`` to the
server's stdin; the server forks, writes ``{"pid": ...}``, waits, writes ``{"code": ...}``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional

#: the console scripts served (most of the suite's commands); any other runs as a fresh process
SCRIPTS = ("fairseq-train", "fairseq-generate", "fairseq-preprocess", "fairseq-validate")
#: environment variables read when an interpreter (or torch, fairseq) starts: a command whose
#: values differ from the warm interpreter's cannot be forked from it
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "CUDA", "FAIRSEQ", "HYDRA", "LOGLEVEL", "LD_")


def startup_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


# ------------------------------------------------------------------ server (the warm interpreter)
def _serve(script: str) -> None:
    sys.path[0] = os.path.dirname(sys.executable)  # as in a fresh console script, not tests/
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in pytest: the client stops the commands
    import importlib

    from importlib.metadata import entry_points

    (ep,) = entry_points(group="console_scripts", name=script)
    main = ep.load()  # the entry point's module first, as the console script's wrapper imports it
    importlib.import_module("torch._dynamo")
    reply = sys.stdout
    reply.write(json.dumps({"ready": True}) + "\n")
    reply.flush()
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req, main)  # raises SystemExit: the command's exit, through Python's own handling
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
        reply.flush()


def _child(req: dict, main) -> None:
    os.setsid()  # its own process group: a timeout stops the command with its children
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the command's stdin, as subprocess.run gives it)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)  # the server's reply pipe (fd 1) is not the command's
        os.close(opened)
    sys.argv = list(req["argv"])
    sys.exit(main())


# ------------------------------------------------------------------ client (the test process)
class Zygote:
    """The warm interpreter of one console script in this test process (:func:`get`)."""

    def __init__(self, script: str, env: Dict[str, str]):
        import tempfile

        self.startup = startup_env(env)
        self.forked = 0  # commands run here (the rest ran as fresh processes)
        self.lock = threading.Lock()  # one command at a time; a second one meanwhile runs as a subprocess
        # its own stderr (import-time warnings, a crash) goes to a log, not into a test's output
        self.log = Path(tempfile.mkstemp(prefix="cli-zygote-", suffix=".log")[1])
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, script], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=env, text=True, bufsize=1)
        if not self.proc.stdout.readline():
            raise RuntimeError("the tests' warm interpreter (tests/cli_zygote.py) did not start:\n"
                               + self.log.read_text(errors="replace")[-3000:])

    def can_run(self, env: Dict[str, str]) -> bool:
        """Running, and with the command's start-up variables."""
        return self.proc.poll() is None and startup_env(env) == self.startup

    def run(self, argv: List[str], env: Dict[str, str], cwd: Optional[str], timeout: float, tmp: Path
            ) -> subprocess.CompletedProcess:
        out, err = tmp / "stdout", tmp / "stderr"
        req = {"argv": argv, "env": env, "cwd": str(cwd or os.getcwd()), "out": str(out), "err": str(err)}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        self.forked += 1
        box: List[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():  # as subprocess.run's timeout: the command (and its group) is killed
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            reader.join()
            raise subprocess.TimeoutExpired(argv, timeout, out.read_bytes(), err.read_bytes())
        if not box or not box[0]:
            raise RuntimeError("the tests' warm interpreter (tests/cli_zygote.py) stopped:\n"
                               + self.log.read_text(errors="replace")[-3000:])
        code = json.loads(box[0])["code"]
        return subprocess.CompletedProcess(argv, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.unlink(missing_ok=True)


_ZYGOTES: Dict[str, Zygote] = {}


def get(argv: List[str], env: Dict[str, str]) -> Optional[Zygote]:
    """The warm interpreter of the console script ``argv[0]`` in this process, started with
    ``env`` (the test process's environment), or None for a command that is not one of
    :data:`SCRIPTS` of this environment.  It is started again when the test process's start-up
    variables have changed since: fairseq's data iterators set ``PYTHONWARNINGS`` in the process
    that builds one with workers (an in-process test), and every later command inherits it."""
    script = Path(argv[0]).name
    if script not in SCRIPTS or Path(argv[0]).parent != Path(sys.executable).parent:
        return None
    z = _ZYGOTES.get(script)
    if z is None or z.proc.poll() is not None or z.startup != startup_env(env):
        import atexit

        if z is not None:
            z.close()
        z = _ZYGOTES[script] = Zygote(script, env)
        atexit.register(z.close)
    return z


if __name__ == "__main__":
    _serve(sys.argv[1])
