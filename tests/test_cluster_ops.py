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
