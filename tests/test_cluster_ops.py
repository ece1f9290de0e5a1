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


# ---------------------------------------------------------------------------- evaluation
def _evaluator(tmp_path, **kw):
    from deepnmt_fairseq.repro import commands
    from deepnmt_fairseq.repro.evaluate import EvalOptions, Evaluator
    from deepnmt_fairseq.repro.registry import EXPERIMENTS

    name = "transparent-wmt14-ende-6L"
    ck = tmp_path / "ck"
    (ck / name).mkdir(parents=True, exist_ok=True)
    (ck / name / "checkpoint_1_1.pt").write_bytes(b"x")
    return Evaluator(EXPERIMENTS[name], EXPERIMENTS, EvalOptions(paths=commands.Paths(tmp_path / "data", ck), **kw)), \
        ck / name


def test_evaluation_refuses_a_training_stage_without_its_done_marker(tmp_path):
    from deepnmt_fairseq.repro.commands import ReproError

    ev, stage_dir = _evaluator(tmp_path, cpu=True)
    with pytest.raises(ReproError) as err:
        ev.run()
    assert str(stage_dir / ".done") in str(err.value) and "--allow-unfinished" in str(err.value)
    # overridden on purpose, or finished: past the gate (the next complaint is the paper's checkpoint window)
    ev, _ = _evaluator(tmp_path, cpu=True, allow_unfinished=True)
    with pytest.raises(ReproError, match="mean over 21 checkpoints"):
        ev.run()
    (stage_dir / ".done").write_text("")
    ev, _ = _evaluator(tmp_path, cpu=True)
    with pytest.raises(ReproError, match="mean over 21 checkpoints"):
        ev.run()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a torch that sees no GPU (CI's)")
def test_evaluation_never_falls_back_to_the_cpu_when_gpus_were_requested(tmp_path, monkeypatch):
    from deepnmt_fairseq.repro.commands import ReproError

    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS", "DEEPNMT_REQUIRE_GPU"):
        monkeypatch.delenv(key, raising=False)
    ev, _ = _evaluator(tmp_path)
    assert ev.cpu  # nothing asked for a GPU: a local run without one decodes on the CPU (and says --cpu)
    assert "--cpu" in ev.generate_argv(tmp_path / "m.pt")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "1")  # an allocation with a GPU the job's torch cannot see
    with pytest.raises(ReproError) as err:
        _evaluator(tmp_path)
    assert "SLURM_GPUS_ON_NODE=1" in str(err.value) and "--cpu" in str(err.value) and "torch" in str(err.value)
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")
    with pytest.raises(ReproError, match=r"GPUs were requested \(--fp16\)"):
        _evaluator(tmp_path, fp16=True)
    assert _evaluator(tmp_path, cpu=True)[0].cpu  # --cpu: on purpose


def test_evaluate_sbatch_activates_the_environment_and_requires_its_gpu(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\nexport ACTIVATED=yes\n')
    (venv / "bin" / "python").write_text('#!/usr/bin/env bash\necho "env-python $ACTIVATED '
                                         'require=$DEEPNMT_REQUIRE_GPU $*"\n')
    (venv / "bin" / "python").chmod(0o755)
    env = {**os.environ, "DEEPNMT_VENV": str(venv), "DEEPNMT_REPO": str(REPO)}
    for key in ("PYTHON", "DEEPNMT_REQUIRE_GPU"):
        env.pop(key, None)
    res = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "evaluate.sbatch"), "msc-iwslt14-ende-6L", "--beam",
                          "4"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "env-python yes require=1 -m deepnmt_cli.repro evaluate msc-iwslt14-ende-6L --beam 4" in res.stdout
    bad = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "evaluate.sbatch"), "x"],
                         env={**env, "DEEPNMT_VENV": str(tmp_path / "nowhere")}, capture_output=True, text=True)
    assert bad.returncode == 2 and "DEEPNMT_VENV" in bad.stderr


# ---------------------------------------------------------------------------- devices from the job's torch
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a torch that sees no GPU (CI's)")
def test_gpus_listed_by_the_node_but_not_seen_by_the_jobs_torch_are_an_error(tmp_path, monkeypatch):
    from deepnmt_fairseq.jobs import cluster

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'GPU 0: NVIDIA H100 (UUID: a)'\n"
                                     "echo 'GPU 1: NVIDIA H100 (UUID: b)'\n")
    (bin_ / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "MASTER_ADDR": "n1"}
    launch = cluster.make_launch("slurm", env=env)
    assert launch.gpus_found == 2 and not launch.cpu  # what the node lists (the plan)
    with pytest.raises(cluster.ClusterError) as err:
        cluster.check_devices(launch)  # the job's own torch: CPU-only here
    msg = str(err.value)
    assert "sees 0 GPU(s)" in msg and "CPU-only torch" in msg and "--cpu" in msg and sys.executable in msg
    cluster.check_devices(launch, torch_count=2)  # a CUDA torch that sees both: fine
    with pytest.raises(cluster.ClusterError, match="sees 1 GPU"):
        cluster.check_devices(launch, torch_count=1)  # rank 1 uses device 1


def test_half_precision_given_raw_after_the_double_dash_is_checked(tmp_path):
    from deepnmt_fairseq.jobs import cluster
    from deepnmt_fairseq.repro import commands
    from deepnmt_fairseq.repro.registry import EXPERIMENTS

    launch = cluster.make_launch("local", env={"CUDA_VISIBLE_DEVICES": ""})
    for flag in ("--fp16", "--bf16", "--amp", "--memory-efficient-fp16"):
        with pytest.raises(cluster.ClusterError) as err:
            cluster.check_devices(launch, None, ["--max-update", "5", flag])
        assert f"-- {flag} (a fairseq flag after --) needs a GPU" in str(err.value)
    cluster.check_devices(launch, None, ["--max-update", "5"])  # the CPU on purpose, no half precision
    opts = commands.RunOptions(paths=commands.Paths(tmp_path / "d", tmp_path / "c"), launch=launch,
                               extra=["--fp16"])
    planner = commands.Planner(EXPERIMENTS, EXPERIMENTS["msc-iwslt14-ende-6L"], opts)
    with pytest.raises(commands.ReproError, match="-- --fp16"):
        planner.preflight()  # what every training stage runs first (deepnmt-repro train NAME -- --fp16)


# ---------------------------------------------------------------------------- rank 0: heartbeat, shared root, lock
def _rank(rank, monkeypatch, job="SLURM_JOB_ID", value="900"):
    from deepnmt_fairseq.jobs import cluster

    for key in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "SLURM_RESTART_COUNT",
                "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    if job:
        monkeypatch.setenv(job, value)
    return cluster.make_launch("torchrun", cpu=True, env={"WORLD_SIZE": "2", "RANK": str(rank),
                                                           "LOCAL_RANK": str(rank), "CUDA_VISIBLE_DEVICES": ""})


def _rank0_stage(tmp_path):
    from deepnmt_fairseq.jobs.stage import Stage

    return Stage("avg", [sys.executable, "-c", "pass"], tmp_path / "exp" / "avg.pt", kind="average", rank0_only=True)


def test_a_waiting_rank_stops_when_rank_0s_heartbeat_is_stale(tmp_path, monkeypatch):
    """Rank 0 killed (OOM, say) writes no .failed: the waiting rank stops after the stale limit, not a day."""
    import json

    from deepnmt_fairseq.jobs import runner as job_runner
    from deepnmt_fairseq.jobs.runner import RunError, Runner

    monkeypatch.setattr(job_runner, "WAIT_POLL", 0.05)
    monkeypatch.setenv("DEEPNMT_RANK0_STALE", "1")
    launch = _rank(1, monkeypatch)
    state = tmp_path / "exp"
    state.mkdir()
    (state / ".rank0-token").write_text(json.dumps({"job": "SLURM_JOB_ID=900", "restart": "0"}))  # rank 0 started
    (state / ".rank0-heartbeat").write_text(json.dumps({"job": "SLURM_JOB_ID=900", "time": 1.0}))  # then died
    t0 = time.time()
    with pytest.raises(RunError) as err:
        Runner("r1", echo=None, launch=launch, state_dir=state).run([_rank0_stage(tmp_path)])
    msg = str(err.value)
    assert "rank 0's heartbeat" in msg and str(state / ".rank0-heartbeat") in msg and "limit 1 s" in msg
    assert "DEEPNMT_RANK0_STALE" in msg and time.time() - t0 < 30

    # a live rank 0 (its heartbeat changing) is waited for until its marker appears
    import threading

    stop = threading.Event()

    def rank0():
        for i in range(60):
            (state / ".rank0-heartbeat").write_text(json.dumps({"job": "SLURM_JOB_ID=900", "time": float(i)}))
            if i == 40:
                (state / "avg.pt").write_text("done")
            if stop.wait(0.1):
                return

    t = threading.Thread(target=rank0, daemon=True)
    t.start()
    try:
        Runner("r1", echo=None, launch=launch, state_dir=state).run([_rank0_stage(tmp_path)])  # 4 s > the limit
    finally:
        stop.set()
    assert (state / "avg.pt").exists()


def test_every_rank_must_see_rank_0s_token_in_the_checkpoint_root(tmp_path, monkeypatch):
    """A node-local checkpoint root: rank 0's token is not visible on the other node: a clear error."""
    import json

    from deepnmt_fairseq.jobs.runner import RunError, Runner

    monkeypatch.setenv("DEEPNMT_SHARED_ROOT_WAIT", "0.3")
    launch = _rank(1, monkeypatch)
    state = tmp_path / "exp"
    with pytest.raises(RunError) as err:
        Runner("r1", echo=None, launch=launch, state_dir=state).run([_rank0_stage(tmp_path)])
    msg = str(err.value)
    assert str(state / ".rank0-token") in msg and "shared by every node" in msg and "does not exist" in msg
    state.mkdir()
    (state / ".rank0-token").write_text(json.dumps({"job": "SLURM_JOB_ID=899", "restart": "0"}))  # another job's
    with pytest.raises(RunError, match="it holds SLURM_JOB_ID=899"):
        Runner("r1", echo=None, launch=launch, state_dir=state).run([_rank0_stage(tmp_path)])
    # rank 0 of this job writes it (and the lock and heartbeat), and rank 1 then passes
    done = []
    r0 = Runner("r0", echo=None, launch=_rank(0, monkeypatch), state_dir=state)
    monkeypatch.setattr(Runner, "tee", lambda self, cmd, log: done.append(cmd) or 0)
    (state / "avg.pt").write_text("x")  # the stage is done: nothing runs
    r0.run([_rank0_stage(tmp_path)])
    token = json.loads((state / ".rank0-token").read_text())
    assert token["job"] == "SLURM_JOB_ID=900" and token["restart"] == "0"
    assert json.loads((state / ".rank0-heartbeat").read_text())["job"] == "SLURM_JOB_ID=900"
    assert not (state / ".job.lock").exists()  # released at the end
    Runner("r1", echo=None, launch=_rank(1, monkeypatch), state_dir=state).run([_rank0_stage(tmp_path)])
    launch = _rank(1, monkeypatch)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued job: rank 0's token of this restart is needed
    with pytest.raises(RunError, match="restart 1"):
        Runner("r1", echo=None, launch=launch, state_dir=state).run([_rank0_stage(tmp_path)])


def test_one_job_per_experiment_folder_unless_it_is_the_same_job_requeued(tmp_path, monkeypatch):
    import json

    from deepnmt_fairseq.jobs.runner import RunError, Runner

    state = tmp_path / "exp"
    state.mkdir()
    (state / "avg.pt").write_text("x")
    lock = state / ".job.lock"
    held = {"job": "SLURM_JOB_ID=5", "host": "n7", "pid": 1, "time": time.time()}
    lock.write_text(json.dumps(held))
    (state / ".rank0-heartbeat").write_text(json.dumps({"job": "SLURM_JOB_ID=5", "time": time.time()}))
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    launch = _rank(0, monkeypatch, value="6")  # another job, single rank 0
    with pytest.raises(RunError) as err:
        Runner("r0", echo=None, launch=launch, state_dir=state).run([_rank0_stage(tmp_path)])
    assert "in use by job SLURM_JOB_ID=5" in str(err.value) and str(lock) in str(err.value)
    assert json.loads(lock.read_text())["job"] == "SLURM_JOB_ID=5"  # untouched
    # the same job requeued takes its own lock back
    Runner("r0", echo=None, launch=_rank(0, monkeypatch, value="5"), state_dir=state).run([_rank0_stage(tmp_path)])
    assert not lock.exists()
    # a holder whose heartbeat is stale is gone (a lost node): taken over
    lock.write_text(json.dumps(held))
    (state / ".rank0-heartbeat").write_text(json.dumps({"job": "SLURM_JOB_ID=5", "time": time.time() - 3600}))
    Runner("r0", echo=None, launch=_rank(0, monkeypatch, value="6"), state_dir=state).run([_rank0_stage(tmp_path)])
    # one local run after another killed one on this host (its process gone): taken over
    import socket

    lock.write_text(json.dumps({"job": f"local:{socket.gethostname()}:999999999", "host": socket.gethostname(),
                                "pid": 999999999, "time": time.time()}))
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    Runner("r0", echo=None, state_dir=state).run([_rank0_stage(tmp_path)])
    assert not lock.exists()


def test_torchrun_example_gets_a_rendezvous_id_per_run(tmp_path):
    fake = tmp_path / "torchrun"
    fake.write_text("#!/usr/bin/env bash\necho \"$*\"\n")
    fake.chmod(0o755)
    env = {**os.environ, "TORCHRUN": str(fake), "NPROC_PER_NODE": "1"}
    for key in ("RDZV_ID", "NNODES", "SLURM_JOB_ID"):
        env.pop(key, None)
    script = str(REPO / "scripts" / "torchrun_example.sh")
    ids = []
    for _ in range(2):
        out = subprocess.run(["bash", script, "msc-iwslt14-ende-6L"], env=env, capture_output=True, text=True).stdout
        ids.append(out.split("--rdzv-id ")[1].split()[0])
    assert ids[0] != ids[1] and "deepnmt" not in ids  # one local run: its own id each time
    multi = subprocess.run(["bash", script, "x"], env={**env, "NNODES": "2"}, capture_output=True, text=True)
    assert multi.returncode == 2 and "RDZV_ID" in multi.stderr  # several nodes: the same id on each, given
    out = subprocess.run(["bash", script, "x"], env={**env, "NNODES": "2", "RDZV_ID": "job42"}, capture_output=True,
                         text=True).stdout
    assert "--rdzv-id job42" in out
