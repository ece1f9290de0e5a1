"""The evidence study's command launcher (study/launcher.py): commands forked from a
pre-imported interpreter or run as subprocesses, with their argv, environment and exit status, and
stopped with their children at the study's deadline.

benchmarks/ is importable through the pythonpath option of pytest (pyproject.toml)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("fork", [True, False])
def test_launcher_runs_the_command_with_its_argv_environment_and_exit_code(tmp_path, fork):
    """The study's commands run forked from a pre-imported interpreter (or as subprocesses) with
    exactly their argv and environment; output is appended, the exit code returned."""
    import os
    import sys

    from study import launcher as launcher_mod
    from deepnmt_fairseq.console import exe

    script = tmp_path / "probe.py"
    script.write_text("import os, sys, torch\n"
                      "print(sys.argv[1:], os.environ['PROBE'], torch.get_num_threads(), flush=True)\n"
                      "print('to stderr', file=sys.stderr)\n"
                      "sys.exit(int(sys.argv[1]))\n")
    launcher = launcher_mod.Launcher(dict(os.environ, PROBE="seen", OMP_NUM_THREADS="1"), threads=1, fork=fork)
    assert launcher.fork == fork
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    out.write_text("earlier\n")
    assert launcher.run([sys.executable, script, "3", "a b"], out, err) == 3
    assert launcher.run([sys.executable, script, "0", "c"], out, err) == 0
    assert out.read_text() == "earlier\n['3', 'a b'] seen 1\n['0', 'c'] seen 1\n"
    assert err.read_text() == "to stderr\nto stderr\n"
    # a console script by its entry point, as fairseq-train is run
    assert launcher.run([exe("deepnmt-extract-student"), "--help"], out) == 0
    assert "--encoder-group-size" in out.read_text()
    assert "PROBE" not in os.environ  # the study's own environment is left as it was


@pytest.mark.parametrize("fork", [True, False])
def test_tick_is_called_while_the_command_runs_and_not_after(tmp_path, monkeypatch, fork):
    """``run(..., tick=f)`` calls ``f`` every TICK seconds while the command runs (the study prunes a
    curve run's epoch checkpoints so), and not once the command has ended."""
    import os
    import sys
    import time

    from study import launcher as launcher_mod

    monkeypatch.setattr(launcher_mod, "TICK", 0.3)
    launcher = launcher_mod.Launcher(dict(os.environ), threads=1, fork=fork)
    calls = []
    script = tmp_path / "sleep.py"
    script.write_text("import sys, time\ntime.sleep(float(sys.argv[1]))\n")
    cmd = [sys.executable, script, "2.5"]
    assert launcher.run(cmd, tmp_path / "out.txt", tick=lambda: calls.append(time.time())) == 0
    ended, n = time.time(), len(calls)
    assert n >= 3, calls  # about 2.5 s / 0.3 s, less the start
    assert all(b - a >= 0.29 for a, b in zip(calls, calls[1:])), calls
    time.sleep(0.7)
    assert len(calls) == n and calls[-1] <= ended
    assert launcher.run([sys.executable, script, "0"], tmp_path / "out.txt") == 0  # tick is optional

    def failing():  # a tick that fails is reported; the command is still watched to its end
        calls.append(time.time())
        raise PermissionError("checkpoint3.pt")
    del calls[:]
    assert launcher.run([sys.executable, script, "1.2"], tmp_path / "out.txt", tick=failing) == 0
    assert len(calls) >= 2, calls


def test_a_command_started_while_another_ends_does_not_steal_its_exit_code(tmp_path, monkeypatch):
    """Two study threads: one waits for its command to end while the other starts one.  A
    forkserver child's exit status is read once from a pipe, and ``Process.start()`` reads it for
    every finished child; unguarded, the two reads raced and the loser reported exit code 255 for
    a run that had succeeded (the tiny study lost a finished run under load).  The patched read
    holds both readers at a barrier and lets the second in read first, so the race, when it can
    happen, always has a loser."""
    import os
    import sys
    import threading
    import time
    from multiprocessing import forkserver

    from study import launcher as launcher_mod

    script = tmp_path / "exit.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    read_signed, barrier = forkserver.read_signed, threading.Barrier(2, timeout=3)
    waiting = threading.Event()

    def racing_read(fd):
        if sys._getframe(1).f_code.co_name == "poll":  # an exit status (the first read is the pid)
            waiting.set()
            try:
                if barrier.wait() == 0:
                    time.sleep(0.3)
            except threading.BrokenBarrierError:  # alone at the barrier: no race to lose
                pass
        return read_signed(fd)

    monkeypatch.setattr(forkserver, "read_signed", racing_read)
    launcher = launcher_mod.Launcher(dict(os.environ), threads=1)
    assert launcher.fork
    codes = {}
    first = threading.Thread(target=lambda: codes.setdefault(
        "first", launcher.run([sys.executable, script, "0"], tmp_path / "first.txt")))
    first.start()
    assert waiting.wait(60)  # the first command has ended and its exit status is being read
    codes["second"] = launcher.run([sys.executable, script, "4"], tmp_path / "second.txt")
    first.join()
    assert codes == {"first": 0, "second": 4}


@pytest.mark.parametrize("fork", [True, False])
def test_the_deadline_stops_a_command_with_its_children_and_nothing_new_starts(tmp_path, fork):
    """--deadline-minutes (machines lent by the 10 minutes): at the deadline the running command
    and its own children (deepnmt-skd's fairseq-generate shards) are stopped, Deadline is raised,
    and no command starts after it."""
    import os
    import sys
    import time

    from study import launcher as launcher_mod

    script = tmp_path / "parent.py"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                      "open(sys.argv[1], 'w').write(str(child.pid))\n"
                      "time.sleep(120)\n")
    pid_file, out = tmp_path / "child.pid", tmp_path / "out.txt"
    launcher = launcher_mod.Launcher(dict(os.environ), threads=1, fork=fork)
    if fork:  # the fork server's preload (torch, fairseq: 6.5 s on a 2-core Xeon) is not the command's time
        launcher._ensure_server()
    launcher.deadline = time.time() + 3
    t0 = time.time()
    with pytest.raises(launcher_mod.Deadline):
        launcher.run([sys.executable, script, pid_file], out)
    assert time.time() - t0 < 20
    child = int(pid_file.read_text())
    for _ in range(50):  # the grandchild got SIGTERM with its group; wait for its parent to reap it
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the command's child {child} outlived the deadline")
    with pytest.raises(launcher_mod.Deadline):  # nothing starts after the deadline
        launcher.run([sys.executable, "-c", f"open({str(tmp_path / 'late')!r}, 'w')"], out)
    assert not (tmp_path / "late").exists()


def test_the_deadline_reaches_a_command_stopped_before_it_had_its_own_process_group():
    """A forked command calls os.setsid() first thing; a deadline in the instant before that finds
    no process group of that id, and the command itself is stopped instead."""
    import subprocess
    import sys

    from study import launcher as launcher_mod

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # in our own group
    try:
        with pytest.raises(launcher_mod.Deadline):
            launcher_mod.Launcher._stop(proc.pid, proc.wait)
        assert proc.poll() is not None
    finally:
        proc.kill()
        proc.wait()


def _signalled_study(tmp_path, fork, send, ignore_term=False, grace=None, late_handler=False):
    """A study process (``Launcher.stopping_on_signals`` around two ``run`` calls: a command that
    starts a child and sleeps, then one that would write a file) signalled by ``send(proc)`` once
    the command's child runs.  Returns (stdout lines, stderr, exit code, the command's and its
    child's pids, seconds from the signal to the study's end)."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from study import launcher as launcher_mod

    command, late_cmd = tmp_path / "parent.py", tmp_path / "late.py"
    command.write_text("import os, signal, subprocess, sys, time\n"
                       f"if {ignore_term}: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                       "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                       "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {child.pid}')\n"
                       "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
                       "time.sleep(120)\n")
    late_cmd.write_text("import sys\nopen(sys.argv[1], 'w').write('started')\n")
    study = tmp_path / "driver.py"  # (not study.py: that would hide the study's package)
    study.write_text("import os, signal, sys, threading, time\n"
                     "import study.launcher as L\n"
                     "def first(launcher, cmd, pids):\n"
                     "    try:\n"
                     "        print('finished', launcher.run([sys.executable, cmd, pids], pids + '.log'), flush=True)\n"
                     "    except L.Deadline:\n"
                     "        print('stopped', launcher.signalled, flush=True)\n"
                     "def main(cmd, late_cmd, pids, late, fork, grace, late_handler):\n"
                     "    if grace != 'None':\n"
                     "        L.Launcher.GRACE = float(grace)\n"
                     "    launcher = L.Launcher(dict(os.environ), threads=1, fork=fork == 'fork')\n"
                     "    with launcher.stopping_on_signals():\n"
                     "        if late_handler == 'late':  # --jobs 2: the command waited for in a worker thread\n"
                     "            worker = threading.Thread(target=first, args=(launcher, cmd, pids))\n"
                     "            worker.start()\n"
                     "            # the main thread, which runs the handler, is busy until 3 s after the signal\n"
                     "            sigs = {signal.SIGTERM, signal.SIGINT}\n"
                     "            signal.pthread_sigmask(signal.SIG_BLOCK, sigs)\n"
                     "            while not os.path.exists(pids):\n"
                     "                time.sleep(0.1)\n"
                     "            time.sleep(3)\n"
                     "            signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)\n"
                     "            worker.join()\n"
                     "        else:\n"
                     "            first(launcher, cmd, pids)\n"
                     "        try:\n"
                     "            launcher.run([sys.executable, late_cmd, late], pids + '.log')\n"
                     "        except L.Deadline:\n"
                     "            print('nothing new', flush=True)\n"
                     "if __name__ == '__main__':  # the fork server imports this module\n"
                     "    main(*sys.argv[1:])\n")
    pids, late = tmp_path / "pids", tmp_path / "late"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(launcher_mod.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, study, command, late_cmd, pids, late, "fork" if fork else "exec",
                             str(grace), "late" if late_handler else "soon"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        for _ in range(600):  # the command runs and has started its own child
            if pids.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert pids.exists(), proc.communicate()[1]
        t0 = time.time()
        send(proc)
        out, err = proc.communicate(timeout=90)
        seconds = time.time() - t0
    finally:
        proc.kill()
    stopped = [int(p) for p in pids.read_text().split()]
    assert not late.exists(), "a command started after the signal"
    alive = []
    for pid in stopped:  # the command and its child were stopped with it
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, 9)
            alive.append(pid)
    assert not alive, f"processes {alive} of the command outlived the signal to the study"
    return out.splitlines(), err, proc.returncode, seconds


@pytest.mark.parametrize("fork", [True, False])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_study_stops_it_as_the_deadline_does(tmp_path, fork, signame):
    """``kill`` or Ctrl-C to a study under ``stopping_on_signals``: the running command and its own
    children are stopped (a forked training child has a process group of its own and used to train
    on as an orphan), the waiting ``run`` raises Deadline (so the study keeps the run's wall time
    and partial record), ``signalled`` names the signal and nothing new starts.  The signal is real,
    sent to a separate study process."""
    import signal

    sig = getattr(signal, signame)
    out, err, code, _ = _signalled_study(tmp_path, fork, lambda proc: proc.send_signal(sig))
    assert out == [f"stopped {int(sig)}", "nothing new"] and code == 0, err


@pytest.mark.parametrize("fork", [True, False])
def test_a_kill_of_the_study_s_process_group_stops_it_as_the_deadline_does(tmp_path, fork):
    """``kill -- -PGID`` reaches every process of the study's group, the fork server among them.
    Its death made a command waited for in a worker thread (``--jobs 2``) end at once with exit code
    255, before the main thread's handler had run: the run was recorded as failed, without its
    partial record, and the training child (in a group of its own) trained on.  The fork server
    blocks SIGTERM, so the wait goes on until the handler stops the command; here the handler runs
    3 s late."""
    import os
    import signal

    out, err, code, _ = _signalled_study(tmp_path, fork, lambda proc: os.killpg(proc.pid, signal.SIGTERM),
                                         late_handler=True)
    assert out == [f"stopped {int(signal.SIGTERM)}", "nothing new"] and code == 0, err


@pytest.mark.parametrize("second_signal", [False, True])
def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_or_at_a_second_signal(tmp_path, second_signal):
    """A command that ignores SIGTERM (with no deadline, the study's wait had no end) gets SIGKILL
    ``GRACE`` seconds after the signal, or at once at a second signal (a second Ctrl-C)."""
    import signal
    import time

    def send(proc):
        proc.send_signal(signal.SIGINT)
        if second_signal:
            time.sleep(1)
            proc.send_signal(signal.SIGINT)

    grace = 120 if second_signal else 2
    out, err, code, seconds = _signalled_study(tmp_path, True, send, ignore_term=True, grace=grace)
    assert out == [f"stopped {int(signal.SIGINT)}", "nothing new"] and code == 0, err
    assert seconds < 30


def test_a_forked_evaluation_finds_its_imports_loaded(tmp_path):
    """What study/evaluate.py imports is in the fork server (PRELOAD), so that none of the
    study's few hundred evaluations pays for it again (sacremoses alone: 1.2-1.7 CPU-seconds); the
    imports are read from study/evaluate.py itself, so a new one that is not preloaded fails here."""
    import ast
    import os
    import sys
    from pathlib import Path

    from study import launcher as launcher_mod

    source = Path(launcher_mod.__file__).with_name("evaluate.py")
    tree = ast.parse(source.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    local = {"study"}  # the study's own small modules (study.stats)
    wanted = set(names - set(sys.stdlib_module_names) - local - {"__future__"})
    assert {"torch", "fairseq", "deepnmt_fairseq"} <= wanted
    # the scoring goes through the one scorer (deepnmt_fairseq/scoring.py), whose sacreBLEU and Moses
    # imports are lazy: they are what a fresh evaluation would pay for
    assert "deepnmt_fairseq.scoring" in {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    wanted = sorted(wanted | {"sacremoses", "sacrebleu"})
    probe = tmp_path / "probe.py"
    probe.write_text(f"import sys\nprint(sorted(m for m in {wanted!r} if m not in sys.modules))\n")
    launcher = launcher_mod.Launcher(dict(os.environ), threads=1, fork=True)
    out = tmp_path / "out.txt"
    assert launcher.run([sys.executable, probe], out) == 0
    assert out.read_text() == "[]\n"
