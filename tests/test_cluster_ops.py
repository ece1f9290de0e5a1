"""The cluster operator's failures (issue 82), without a cluster: fake ``srun`` / ``scontrol`` /
``nvidia-smi`` on PATH and the CPU torch of CI.

* ``scripts/slurm/train.sbatch``: SIGUSR1 reaches the step, which saves and stops, then the job is
  requeued; a failed ``scontrol requeue`` exits 4; SIGTERM without the notice (scancel) ends the job
  without a requeue; ``--max-requeues`` (default 10) stops the requeue loop (exit 5).
* The USR1 save: fairseq-train with the plugin saves ``checkpoint_last.pt`` at the next update after
  SIGUSR1 and exits 75 (the fairseq-fixes row ``save_on_usr1``).
* Evaluation refuses an unfinished training stage (``--allow-unfinished`` overrides) and never decodes
  on the CPU when GPUs were requested; evaluate.sbatch activates the environment.
* Devices are counted by the job's own torch; ``-- --fp16`` is checked like ``--fp16``.
* Rank 0's heartbeat, the shared-root token, the job lock; torchrun's per-run rendezvous id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"


# ---------------------------------------------------------------------------- train.sbatch
def _slurm(tmp_path, step: str, requeue_rc: int = 0, restart_count=None):
    """Fake srun (runs ``step`` as the job step), scontrol (requeue exits ``requeue_rc``), a venv."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls"
    (bin_ / "scontrol").write_text(f"""#!/usr/bin/env bash
echo "scontrol $*" >> {calls}
if [ "$1 $2" = "show hostnames" ]; then echo node-a; fi
[ "$1" = requeue ] && exit {requeue_rc}
exit 0
""")
    (bin_ / "srun").write_text(f"""#!/usr/bin/env bash
echo "srun $*" >> {calls}
trap 'echo step-got-USR1 >> {calls}; sleep 0.2; echo step-saved >> {calls}; exit 75' USR1
trap 'echo step-got-TERM >> {calls}; exit 143' TERM
{step}
""")
    for f in bin_.iterdir():
        f.chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "777", "SLURM_JOB_NODELIST": "n1",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "8", "DEEPNMT_VENV": str(venv), "DEEPNMT_REPO": str(REPO)}
    env.pop("SLURM_RESTART_COUNT", None)
    env.pop("DEEPNMT_MAX_REQUEUES", None)
    if restart_count is not None:
        env["SLURM_RESTART_COUNT"] = str(restart_count)
    return env, calls


def _sbatch(env, calls, sig=None, args=("msc-iwslt14-ende-6L",)):
    proc = subprocess.Popen(["bash", str(SBATCH), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if sig is not None:
        deadline = time.time() + 30
        while time.time() < deadline and "srun " not in (calls.read_text() if calls.exists() else ""):
            time.sleep(0.05)
        time.sleep(0.3)  # the step's traps are set
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out, calls.read_text() if calls.exists() else ""


LOOP = "while true; do sleep 0.1; done"


def test_usr1_saves_then_requeues_and_a_failed_requeue_exits_4(tmp_path):
    (tmp_path / "a").mkdir()
    env, calls = _slurm(tmp_path / "a", LOOP)
    rc, out, log = _sbatch(env, calls, signal.SIGUSR1)
    assert rc == 0, out
    assert log.index("step-saved") < log.index("scontrol requeue 777"), log  # saved first, then requeued
    assert "requeue 1 of at most 10" in out

    (tmp_path / "b").mkdir()
    env, calls = _slurm(tmp_path / "b", LOOP, requeue_rc=1)
    rc, out, log = _sbatch(env, calls, signal.SIGUSR1)
    assert rc == 4, out
    assert "scontrol requeue 777" in log and "scontrol requeue 777 failed" in out and "NOT requeued" in out


def test_scancel_sigterm_without_notice_ends_without_requeue(tmp_path):
    env, calls = _slurm(tmp_path, LOOP)
    rc, out, log = _sbatch(env, calls, signal.SIGTERM)
    assert rc == 143, out
    assert "step-got-TERM" in log and "requeue" not in log
    assert "without the USR1 notice" in out and "not requeued" in out


def test_max_requeues_caps_the_loop(tmp_path):
    (tmp_path / "a").mkdir()
    env, calls = _slurm(tmp_path / "a", LOOP, restart_count=10)  # the default cap is 10
    rc, out, log = _sbatch(env, calls, signal.SIGUSR1)
    assert rc == 5, out
    assert "requeue" not in log.replace("step-", "") and "--max-requeues 10" in out
    (tmp_path / "b").mkdir()
    env, calls = _slurm(tmp_path / "b", LOOP, restart_count=10)
    rc, out, log = _sbatch(env, calls, signal.SIGUSR1, args=("--max-requeues", "11", "msc-iwslt14-ende-6L"))
    assert rc == 0 and "scontrol requeue 777" in log, out
    assert "srun --kill-on-bad-exit=1 bash" in log and "train.sh msc-iwslt14-ende-6L --launcher slurm" in log
    (tmp_path / "c").mkdir()
    env, calls = _slurm(tmp_path / "c", LOOP)
    rc, out, _ = _sbatch(env, calls, None, args=("--max-requeues", "many", "msc-iwslt14-ende-6L"))
    assert rc == 2 and "--max-requeues 'many'" in out


def test_a_step_that_finished_before_the_limit_is_not_requeued(tmp_path):
    # the notice came, the step still ended with 0 (every stage finished): nothing to requeue
    env, calls = _slurm(tmp_path, "trap 'echo step-got-USR1 >> " + str(tmp_path / "calls") + "; exit 0' USR1\n" + LOOP)
    rc, out, log = _sbatch(env, calls, signal.SIGUSR1)
    assert rc == 0 and "step-got-USR1" in log and "requeue" not in log.replace("step-", ""), out


# ---------------------------------------------------------------------------- the USR1 save
def test_sigusr1_saves_at_the_next_update_and_exits_75(data_bin, tmp_path):
    """fairseq-train with the plugin (fairseq-fixes row ``save_on_usr1``): SIGUSR1 mid-run saves
    checkpoint_last.pt at the next update and exits 75; the run resumes from that update."""
    import torch
    from fairseq_helpers import TINY, USER_DIR

    save = tmp_path / "ckpt"
    exe = Path(sys.executable).with_name("fairseq-train")
    argv = [str(exe), str(data_bin), "--user-dir", USER_DIR, "--arch", "deepnmt_transformer", *TINY, "--task",
            "translation", "--optimizer", "adam", "--lr", "0.001", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "10", "--max-tokens", "100", "--max-update", "100000", "--save-dir", str(save),
            "--no-progress-bar", "--log-format", "simple", "--log-interval", "1", "--seed", "1", "--cpu",
            "--num-workers", "0", "--no-epoch-checkpoints", "--disable-validation", "--criterion",
            "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "num_updates=3" in line:  # the handler is in place after the first update
                proc.send_signal(signal.SIGUSR1)
                break
        out = "".join(lines) + proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, out[-3000:]
    said = [int(x) for x in __import__("re").findall(r"SIGUSR1: saving checkpoint_last.pt at update (\d+)", out)]
    assert len(said) == 1 and 3 <= said[0] <= 5, out[-3000:]  # the next update or two, not a save interval later
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == said[0]
    assert "done training" not in out


def test_the_runner_passes_sigusr1_to_a_training_stage_and_marks_nothing_done(tmp_path):
    """deepnmt-repro's runner (what srun's task runs): SIGUSR1 goes on to the running training command;
    its exit 75 is a stop (no .done), and no later stage starts."""
    import threading

    from deepnmt_fairseq.jobs.runner import RunError, Runner
    from deepnmt_fairseq.jobs.stage import Stage

    ready = tmp_path / "ready"
    child = (f"import signal, sys, time, pathlib\n"
             f"signal.signal(signal.SIGUSR1, lambda *a: (print('child saved', flush=True), sys.exit(75)))\n"
             f"pathlib.Path({str(ready)!r}).write_text('x')\n"
             f"time.sleep(60)\nsys.exit(0)\n")
    train = Stage("train", [sys.executable, "-c", child], tmp_path / "train", marker=True, log=tmp_path / "train.log",
                  kind="train", history=True)
    later = Stage("later", [sys.executable, "-c", "open('never', 'w')"], tmp_path / "later", marker=True, kind="x")

    def notice():
        deadline = time.time() + 60
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR1)

    before = signal.getsignal(signal.SIGUSR1)
    threading.Thread(target=notice, daemon=True).start()
    t0 = time.time()
    with pytest.raises(RunError) as err:
        Runner("t", echo=None, in_process=False).run([train, later])
    assert "stopped on SIGUSR1 after saving checkpoint_last.pt" in str(err.value)
    assert time.time() - t0 < 50  # not the child's 60 s
    assert "child saved" in (tmp_path / "train.log").read_text()
    assert not (tmp_path / "train" / ".done").exists() and not (tmp_path / "later").exists()
    assert signal.getsignal(signal.SIGUSR1) == before  # the runner's handler is gone after the run
