"""Preemption and walltime (issue 67 §3).

* The save-interval rule (``deepnmt_fairseq.repro.spec.checkpoint_rule``): on one 8-GPU node at
  20 TFLOP/s each (6 FLOPs per parameter and token), every registry training stage writes
  ``checkpoint_last.pt`` at least every 30 minutes: an epoch-saving stage because its epochs are
  that short or because its recipe adds ``checkpoint_updates``, an interval-saving stage because
  its interval is that short.  Parameters are counted on the meta device.
* A run killed in mid-epoch (SIGKILL, what walltime or a preemption does) and started again through
  the wrapper (``scripts/train.sh``) ends with the same logged losses and bitwise the same weights
  as the uninterrupted run (CPU, one thread; the exact-resume contract of tests/test_exactness.py,
  through the wrappers and a kill instead of --max-update).
* ``scripts/slurm/train.sbatch`` without Slurm: fake ``scontrol`` and ``srun`` on PATH; SIGUSR1 to
  the batch script reaches the step (which saves and stops), then the job is requeued (issue 82:
  tests/test_cluster_ops.py has scancel, the cap and a failed requeue); without a signal it waits for srun; the
  environment comes from ``DEEPNMT_VENV``; ``scripts/train.sh`` runs the environment's python.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"

_COUNT_FREE = {"--max-epoch", "--ssl-rate", "--encoder-layerdrop", "--decoder-layerdrop"}  # no parameters


def _params(stage, cache={}):
    key = (stage.arch, stage.model_flags)
    if key not in cache:
        try:
            from deepnmt_fairseq.analysis.param_counts import build_model
        except ImportError:  # pragma: no cover - before the move
            from deepnmt_fairseq.cli.param_counts import build_model
        flags, it = [], iter(stage.model_flags)
        for f in it:
            if f in _COUNT_FREE:
                next(it)
                continue
            flags.append(f)
        with torch.device("meta"):  # no memory, no initialisation
            model = build_model(stage.arch, 37000, flags)
        cache[key] = sum(p.numel() for p in model.parameters())
    return cache[key]


def _gaps():
    """(experiment, stage, seconds between two checkpoint_last.pt writes under the rule)."""
    from deepnmt_fairseq.repro.registry import EXPERIMENTS
    from deepnmt_fairseq.repro.spec import checkpoint_rule

    out = []
    for name, exp in EXPERIMENTS.items():
        for st in exp.train_stages:
            r = st.recipe
            t, epoch, _n = checkpoint_rule(_params(st), r.tokens_per_update, exp.dataset)
            if r.save_interval_updates:
                gap = r.save_interval_updates * t
            else:
                gap = min(epoch, r.checkpoint_updates * t) if r.checkpoint_updates else epoch
            out.append((name, st.name, gap, t, epoch))
    return out


@pytest.mark.slow
def test_every_registry_stage_saves_checkpoint_last_at_least_every_30_minutes():
    from deepnmt_fairseq.repro.spec import RULE_MAX_SECONDS

    gaps = _gaps()
    assert len(gaps) > 250
    late = [(n, s, round(g / 60)) for n, s, g, _t, _e in gaps if g > RULE_MAX_SECONDS]
    assert not late, f"checkpoint_last.pt less often than every 30 min (minutes): {late}"
    by = {(n, s): (g, t, e) for n, s, g, t, e in gaps}
    # the rule bites where it should (the test can fail): DeepNet 100L-100L's old 1000-update interval
    # and the 18L big MSC model's epochs would be hours / ~45 min apart
    g, t, _e = by[("deepnet-wmt-ende-100L-100L", "train")]
    assert 1000 * t > 2 * RULE_MAX_SECONDS and g <= RULE_MAX_SECONDS
    g, t, e = by[("msc-wmt14-ende-big-18L", "train")]
    assert e > RULE_MAX_SECONDS >= g


def test_epoch_recipes_with_checkpoint_updates_keep_their_epoch_checkpoints():
    """The mid-epoch saves add checkpoint_last.pt (and one rolling checkpoint_E_U.pt); the epoch
    checkpoints the evaluation averages are still written and kept."""
    from deepnmt_fairseq.jobs.fairseq_argv import recipe_flags
    from deepnmt_fairseq.repro.registry import EXPERIMENTS

    seen = 0
    for exp in EXPERIMENTS.values():
        for st in exp.train_stages:
            r = st.recipe
            flags = recipe_flags(r)
            if r.checkpoint_updates:
                seen += 1
                assert r.save == "epoch"
                assert "--no-epoch-checkpoints" not in flags
                assert flags[flags.index("--keep-last-epochs") + 1] == str(r.keep)
                assert flags[flags.index("--save-interval-updates") + 1] == str(r.checkpoint_updates)
                assert flags[flags.index("--keep-interval-updates") + 1] == "1"
            elif r.save == "epoch":
                assert "--save-interval-updates" not in flags
    assert seen >= 6


# ---------------------------------------------------------------------------- kill in mid-epoch, resume
ROW = "msc-wmt14-ende-big-18L"  # epoch checkpoints + checkpoint_updates (the rule's mid-epoch saves)
TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--encoder-layers", "2", "--decoder-layers", "2", "--msc-block-layers", "1", "--dropout", "0.1"]
UPDATES, EVERY, EPOCH = 28, 3, 25  # 200 pairs / batches of 8: 25 updates an epoch; the kill lands in epoch 1


@pytest.fixture(scope="module")
def ende_data(tmp_path_factory):
    from fairseq_helpers import make_parallel_text, run_cli

    root = tmp_path_factory.mktemp("preempt-data")
    raw = make_parallel_text(root / "raw", n_train=200, n_valid=12, n_test=10)
    for split in ("train", "valid", "test"):
        (raw / f"{split}.en").write_text((raw / f"{split}.src").read_text())
        (raw / f"{split}.de").write_text((raw / f"{split}.tgt").read_text())
    run_cli("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", raw / "train",
            "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", root / "data" / "wmt14-en-de" / "bin",
            "--joined-dictionary", "--workers", "1")
    return root / "data"


def _train_sh(data, ck, **popen):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "DEEPNMT_DATA": str(data),
           "DEEPNMT_CHECKPOINTS": str(ck), "PYTHON": sys.executable}
    argv = ["bash", str(SCRIPTS / "train.sh"), ROW, "--cpu", "--max-tokens", "1024", "--", *TINY,
            "--batch-size", "8", "--update-freq", "1", "--required-batch-size-multiple", "1", "--max-update", str(UPDATES),
            "--save-interval-updates", str(EVERY), "--disable-validation", "--log-format", "json",
            "--log-interval", "1"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **popen)


def _losses(text):
    return {int(d["num_updates"]): d["loss"] for d in map(json.loads, re.findall(r"train_inner\W+(\{.*\})", text))}


def _model(path):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    state = load_checkpoint(str(path))
    return state["model"], state["optimizer_history"][-1]["num_updates"]


@pytest.mark.slow
def test_a_run_killed_in_mid_epoch_resumes_through_the_wrapper_to_the_uninterrupted_result(ende_data, tmp_path):
    straight = _train_sh(ende_data, tmp_path / "straight")
    out, _ = straight.communicate(timeout=600)
    assert straight.returncode == 0, out[-4000:]
    straight_losses = _losses(out)
    assert sorted(straight_losses) == list(range(1, UPDATES + 1))

    # the same command, SIGKILLed (process group: the wrapper and fairseq-train) once a mid-epoch
    # checkpoint exists and before the run ends
    ck = tmp_path / "killed"
    proc = _train_sh(ende_data, ck)
    save = ck / ROW
    deadline = time.time() + 600
    while time.time() < deadline and not (save / "checkpoint_last.pt").exists() and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.communicate()[0][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    first_out, _ = proc.communicate(timeout=60)
    _w, at = _model(save / "checkpoint_last.pt")
    assert EVERY <= at < EPOCH and at % EVERY == 0  # killed mid-epoch
    assert not (save / ".done").exists()

    again = _train_sh(ende_data, ck)
    out2, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out2[-4000:]
    assert f"@ {at} updates)" in out2  # fairseq: "Loaded checkpoint ... (epoch 1 @ N updates)"
    resumed = _losses(out2)
    assert sorted(resumed) == list(range(at + 1, UPDATES + 1))
    assert {u: straight_losses[u] for u in resumed} == resumed
    assert {u: v for u, v in _losses(first_out).items() if u <= at} == {u: straight_losses[u] for u in
                                                                        range(1, at + 1)}
    a, na = _model(tmp_path / "straight" / ROW / "checkpoint_last.pt")
    b, nb = _model(save / "checkpoint_last.pt")
    assert na == nb == UPDATES
    for k in a:  # bitwise: same ops, same order, same RNG draws (fairseq re-seeds every update), one thread
        assert torch.equal(a[k], b[k]), k
    # the epoch checkpoint the averaging reads is still written; one rolling mid-epoch checkpoint is kept
    assert (save / "checkpoint1.pt").exists() and len(list(save.glob("checkpoint_*_*.pt"))) == 1


# ---------------------------------------------------------------------------- sbatch without Slurm
def _fake_slurm(tmp_path, srun_body):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls"
    (bin_ / "scontrol").write_text(f"""#!/usr/bin/env bash
echo "scontrol $*" >> {calls}
# a long node list (more than a pipe holds): a reader that stops early would SIGPIPE this under pipefail
if [ "$1 $2" = "show hostnames" ]; then echo node-a; seq -f "node-%g" 20000; fi
""")
    (bin_ / "srun").write_text(f"""#!/usr/bin/env bash
echo "srun $*" >> {calls}
echo "srun python: $(command -v python)" >> {calls}
{srun_body}
""")
    for f in bin_.iterdir():
        f.chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export VIRTUAL_ENV={venv}\nexport PATH="{venv}/bin:$PATH"\n')
    (venv / "bin" / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "16", "DEEPNMT_VENV": str(venv), "DEEPNMT_REPO": str(REPO)}
    env.pop("VIRTUAL_ENV", None)
    return env, calls, venv


def test_sbatch_requeues_on_sigusr1_and_ends_the_step(tmp_path):
    # the step as the training does it (issue 82): on USR1 it saves at its next update and exits 75
    env, calls, venv = _fake_slurm(tmp_path, 'trap "echo srun-got-USR1 >> ' + str(tmp_path / "calls") +
                                   '; exit 75" USR1\nwhile true; do sleep 0.1; done')
    proc = subprocess.Popen(["bash", str(SCRIPTS / "slurm" / "train.sbatch"), "msc-iwslt14-ende-6L", "--fp16"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    while time.time() < deadline and "srun " not in (calls.read_text() if calls.exists() else ""):
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@... sends before the walltime
    out, _ = proc.communicate(timeout=30)
    log = calls.read_text()
    assert "scontrol requeue 4242" in log, out + log
    assert "srun-got-USR1" in log  # the step was told (to save), and it ended before the requeue
    assert log.index("srun-got-USR1") < log.index("scontrol requeue 4242")
    assert f"srun python: {venv}/bin/python" in log  # DEEPNMT_VENV was activated
    assert re.search(r"srun .*scripts/train.sh msc-iwslt14-ende-6L --launcher slurm --fp16", log)
    assert "rendezvous tcp://node-a:" in out  # the first node of the allocation
    assert proc.returncode == 0, out  # requeued: the job ends cleanly and runs again later


def test_sbatch_without_signal_returns_the_step_status_and_names_a_missing_environment(tmp_path):
    env, calls, _venv = _fake_slurm(tmp_path, "exit 3")
    res = subprocess.run(["bash", str(SCRIPTS / "slurm" / "train.sbatch"), "msc-iwslt14-ende-6L"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "requeue" not in calls.read_text()
    bad = subprocess.run(["bash", str(SCRIPTS / "slurm" / "train.sbatch"), "msc-iwslt14-ende-6L"],
                         env={**env, "DEEPNMT_VENV": str(tmp_path / "nowhere")}, capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode != 0 and "DEEPNMT_VENV" in bad.stderr


def test_train_sh_runs_the_environments_python(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"#!/usr/bin/env bash\necho env-python \"$@\"\n")
    (venv / "bin" / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv}/bin:{env['PATH']}")
    res = subprocess.run(["bash", str(SCRIPTS / "train.sh"), "NAME", "--dry-run"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert res.stdout.startswith("env-python -m deepnmt_cli.repro train NAME --dry-run"), res.stdout + res.stderr
