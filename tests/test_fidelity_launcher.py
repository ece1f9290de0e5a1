"""The evidence study's command launcher (benchmarks/fidelity_launcher.py): commands forked from a
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

    import fidelity_launcher as launcher_mod
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

    import fidelity_launcher as launcher_mod

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

    import fidelity_launcher as launcher_mod

    script = tmp_path / "parent.py"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                      "open(sys.argv[1], 'w').write(str(child.pid))\n"
                      "time.sleep(120)\n")
    pid_file, out = tmp_path / "child.pid", tmp_path / "out.txt"
    launcher = launcher_mod.Launcher(dict(os.environ), threads=1, fork=fork, deadline=time.time() + 3)
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

    import fidelity_launcher as launcher_mod

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # in our own group
    try:
        with pytest.raises(launcher_mod.Deadline):
            launcher_mod.Launcher._stop(proc.pid, proc.wait)
        assert proc.poll() is not None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("fork", [True, False])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_study_stops_it_as_the_deadline_does(tmp_path, fork, signame):
    """``kill`` or Ctrl-C to a study under ``stopping_on_signals``: the running command and its own
    children are stopped (a forked training child has a process group of its own and used to train
    on as an orphan), the waiting ``run`` raises Deadline (so the study keeps the run's wall time
    and partial record), ``signalled`` names the signal and nothing new starts.  The signal is real,
    sent to a separate study process."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import fidelity_launcher as launcher_mod

    command = tmp_path / "parent.py"
    command.write_text("import os, subprocess, sys, time\n"
                       "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                       "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {child.pid}')\n"
                       "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
                       "time.sleep(120)\n")
    study = tmp_path / "study.py"
    study.write_text("import os, sys\n"
                     "import fidelity_launcher as L\n"
                     "def main(cmd, pids, late, fork):\n"
                     "    launcher = L.Launcher(dict(os.environ), threads=1, fork=fork == 'fork')\n"
                     "    with launcher.stopping_on_signals():\n"
                     "        try:\n"
                     "            launcher.run([sys.executable, cmd, pids], pids + '.log')\n"
                     "            print('finished', flush=True)\n"
                     "        except L.Deadline:\n"
                     "            print('stopped', launcher.signalled, flush=True)\n"
                     "        try:\n"
                     "            launcher.run([sys.executable, '-c', f'open({late!r}, \"w\")'], pids + '.log')\n"
                     "        except L.Deadline:\n"
                     "            print('nothing new', flush=True)\n"
                     "if __name__ == '__main__':  # the fork server imports this module\n"
                     "    main(*sys.argv[1:5])\n")
    pids, late = tmp_path / "pids", tmp_path / "late"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(launcher_mod.__file__).parent),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, study, command, pids, late, "fork" if fork else "exec"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(600):  # the command runs and has started its own child
            if pids.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert pids.exists(), proc.communicate()[1]
        sig = getattr(signal, signame)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.splitlines() == [f"stopped {int(sig)}", "nothing new"], err
    assert proc.returncode == 0 and not late.exists()
    for pid in map(int, pids.read_text().split()):  # the command and its child were stopped with it
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"process {pid} of the command outlived the signal to the study")
