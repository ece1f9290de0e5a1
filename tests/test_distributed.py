"""2-process data-parallel training on CPU (gloo), both DDP backends, every stochastic feature.

Each rank is its own process running fairseq-train's ``cli_main`` (what the console script
runs) with ``--distributed-world-size 2 --distributed-rank R --distributed-init-method
tcp://127.0.0.1:PORT --distributed-no-spawn --distributed-backend gloo`` (see
shared/notes/fairseq-on-modern-python.md: ``--cpu`` with a world size alone does not start).

fairseq saves checkpoints on rank 0 only and its cross-rank consistency check
(``Trainer._check_grad_norms``) runs only on CUDA.  The launcher therefore wraps
``fairseq.checkpoint_utils.save_checkpoint`` (called on every rank after every update with
``--save-interval-updates 1``) so that each rank also dumps its own model weights; the test
compares the ranks' weights after every update, bitwise.

The launcher calls ``deepnmt_fairseq.fairseq_fixes.install()``: fairseq's c10d backend passes
``device_ids=[0]`` to torch's DDP, which torch refuses for CPU modules; the guard drops it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fairseq_helpers import USER_DIR, TINY


# every stochastic feature at once: SSL (encoder + decoder sub-layers), GP (both sides), CAD,
# LayerDrop, and the collapse-reducing criterion's DDR (second decoder pass) and ALD (UNK
# sampling, two more passes)
STOCHASTIC = {
    "top": ["--encoder-layers", "4", "--decoder-layers", "2", "--ssl-rate", "0.4", "--ssl-decoder",
            "--gp-group-size", "2", "--gp-decoder-group-size", "2", "--cad-drop-depth", "1", "--cad-drop-ratio",
            "0.5", "--encoder-layerdrop", "0.25", "--decoder-layerdrop", "0.25", "--dropout", "0.1"],
    "msc": ["--deep-memory", "msc", "--msc-block-layers", "2", "--decoder-layers", "2", "--ssl-rate", "0.5",
            "--ssl-mode", "layer", "--gp-group-size", "2", "--cad-drop-depth", "1", "--cad-drop-ratio", "0.5",
            "--encoder-layerdrop", "0.25", "--rpr-max-relative-position", "2", "--dropout", "0.1"],
    # Admin profiles on each rank's own first batch: the ranks' omegas (buffers, compared below) agree
    # only because the profile's variances are averaged over the ranks
    "admin": ["--admin", "--encoder-layers", "4", "--decoder-layers", "2", "--ssl-rate", "0.4", "--gp-group-size", "2",
              "--cad-drop-depth", "1", "--cad-drop-ratio", "0.5", "--dropout", "0.1"],
}
CRT = ["--criterion", "collapse_reducing", "--label-smoothing", "0.1", "--ddr-alpha", "1.0", "--ald-alpha", "0.5"]
LS = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]

LAUNCHER = r"""
import os, sys, torch
import deepnmt_fairseq
from deepnmt_fairseq import fairseq_fixes
fairseq_fixes.install()
from fairseq import checkpoint_utils
_save = checkpoint_utils.save_checkpoint
DUMP = os.environ["DEEPNMT_TEST_DUMP"]

def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
    # every rank: its own weights after this update (fairseq writes checkpoints on rank 0 only)
    weights = {k: v.detach().clone() for k, v in trainer.get_model().state_dict().items()}
    torch.save(weights, os.path.join(DUMP, f"rank{trainer.data_parallel_rank}-{trainer.get_num_updates()}.pt"))
    return _save(cfg, trainer, epoch_itr, val_loss)

checkpoint_utils.save_checkpoint = save_checkpoint
from fairseq_cli.train import cli_main
sys.argv = ["fairseq-train"] + sys.argv[1:]
cli_main()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _argv(data_bin, save, flags, crit, max_update, extra=()):
    return [str(data_bin), "--user-dir", USER_DIR, "--task", "translation", "--arch", "deepnmt_transformer",
            *TINY, *flags, *crit, "--optimizer", "adam", "--lr", "0.002", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "4", "--batch-size", "30", "--max-tokens", "4000", "--required-batch-size-multiple",
            "1", "--max-update", str(max_update), "--save-dir", str(save), "--save-interval-updates", "1",
            "--no-epoch-checkpoints", "--disable-validation", "--seed", "1", "--cpu", "--num-workers", "0",
            "--no-progress-bar", "--log-format", "json", "--log-interval", "1", *extra]


def _launch(argv, dump, log):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", DEEPNMT_TEST_DUMP=str(dump))
    dump.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, *argv], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, env=env)


def _wait(procs, logs, timeout=300):
    deadline = time.time() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:  # one rank failing leaves the other waiting in gloo: end it
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, Path(log).read_text()) for p, log in zip(procs, logs)]


def train_distributed(data_bin, work, flags, crit, ddp_backend, max_update=3):
    """Two ranks; returns [(returncode, log)] and the dump directory."""
    dump = work / "dump"
    for _attempt in range(2):  # another process may take the free port before rank 0 binds it
        port = _free_port()
        procs, logs = [], []
        for rank in range(2):
            log = work / f"rank{rank}.log"
            argv = _argv(data_bin, work / "ckpt", flags, crit, max_update, [
                "--distributed-world-size", "2", "--distributed-rank", str(rank), "--distributed-init-method",
                f"tcp://127.0.0.1:{port}", "--distributed-no-spawn", "--distributed-backend", "gloo",
                "--ddp-backend", ddp_backend])
            procs.append(_launch(argv, dump, log))
            logs.append(log)
        results = _wait(procs, logs)
        if not any("Address already in use" in log for _rc, log in results):
            break
    return results, dump


def train_single(data_bin, work, flags, crit, max_update=3, extra=()):
    log = work / "single.log"
    dump = work / "dump"
    (rc, text), = _wait([_launch(_argv(data_bin, work / "ckpt", flags, crit, max_update, extra), dump, log)], [log])
    return rc, text, dump


def _per_update(log):
    return {int(d["num_updates"]): d for d in map(json.loads, re.findall(r"train_inner\W+(\{.*\})", log))}


def _dumped(dump, rank, update):
    return torch.load(dump / f"rank{rank}-{update}.pt", weights_only=True)


def _assert_ok(results):
    for rank, (rc, log) in enumerate(results):
        assert rc == 0, f"rank {rank} failed ({rc}):\n{log[-4000:]}"
    assert "'find_unused_parameters': False" in results[0][1]  # DDP is not told to tolerate unused parameters


# ---------------------------------------------------------------------------- tests
def _check_identical_ranks(results, dump, crit_terms=()):
    _assert_ok(results)
    log0 = results[0][1]
    assert "distributed init (rank 1)" in results[1][1] and "distributed init (rank 0)" in log0
    stats = _per_update(log0)
    assert sorted(stats) == [1, 2, 3]
    for term in crit_terms:
        assert all(term in s for s in stats.values()), term
    for update in (1, 2, 3):
        w0, w1 = _dumped(dump, 0, update), _dumped(dump, 1, update)
        assert w0.keys() == w1.keys()
        differ = [k for k in w0 if not torch.equal(w0[k], w1[k])]
        assert not differ, f"update {update}: ranks differ in {differ[:5]} ({len(differ)} tensors)"
    # and they did train: the weights moved between updates
    first, last = _dumped(dump, 0, 1), _dumped(dump, 0, 3)
    assert any(not torch.equal(first[k], last[k]) for k in first if k.endswith("weight"))


@pytest.mark.slow
@pytest.mark.parametrize("memory, ddp_backend", [
    ("msc", "c10d"),  # MSC + SSL layers + GP + CAD + LayerDrop + RPR + DDR + ALD, torch DDP without find_unused
    ("top", "legacy_ddp"),  # SSL sub-layers (both sides) + GP (both sides) + CAD + LayerDrop (both) + DDR + ALD
    ("admin", "c10d"),  # Admin's profile on the first batch, all-reduced; with SSL, GP, CAD, DDR, ALD
])
def test_two_ranks_train_every_stochastic_feature_and_stay_identical(data_bin, tmp_path, memory, ddp_backend):
    results, dump = train_distributed(data_bin, tmp_path, STOCHASTIC[memory], CRT, ddp_backend)
    _check_identical_ranks(results, dump, ("ald_loss", "ddr_loss"))
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").exists()  # rank 0 saved as usual


def test_c10d_step_that_bypasses_ddp_forward_is_refused(tmp_path):
    """In-process (gloo, world size 1): the guard lets a step through DDP.forward pass and
    refuses one whose loss came from model.encoder/decoder directly (what collapse_reducing did
    before it ran all its passes inside one model call; under c10d the ranks then diverged
    silently from update 2)."""
    import torch.distributed as dist
    from fairseq.distributed import ModuleProxyWrapper
    from fairseq_helpers import build_model, random_batch
    from types import SimpleNamespace

    from deepnmt_fairseq import behaviour_fixes, fairseq_fixes

    fairseq_fixes.install()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model = build_model("deepnmt_transformer", TINY + ["--encoder-layers", "1", "--decoder-layers", "1"])
        wrapped = ModuleProxyWrapper(behaviour_fixes.CPUCompatibleDDP(model))
        src, lens, tgt = random_batch(model)

        def through_ddp(m):
            return m(src, lens, tgt)[0].sum()

        def bypass(m):
            return m.decoder(tgt, encoder_out=m.encoder(src, lens))[0].sum()

        class Task:
            def train_step(self, loss_fn):
                loss = loss_fn(wrapped)
                loss.backward()
                return loss

        fake = SimpleNamespace(model=wrapped, data_parallel_world_size=2, data_parallel_rank=0, task=Task(),
                               get_criterion=lambda: SimpleNamespace(),
                               cfg=SimpleNamespace(distributed_training=SimpleNamespace(ddp_backend="c10d")))
        step = behaviour_fixes._check_ddp_forward(lambda self, fn: self.task.train_step(fn))
        step(fake, through_ddp)
        with pytest.raises(behaviour_fixes.DDPBypassError, match="--ddp-backend legacy_ddp"):
            step(fake, bypass)
        assert "train_step" not in fake.task.__dict__  # the per-step wrapper is removed again
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("ddp_backend", ["c10d"])
def test_two_ranks_match_one_process_with_update_freq_2(data_bin, tmp_path, ddp_backend):
    """Without dropout or stochastic layers, 2 ranks x 1 batch = 1 process x 2 accumulated batches.

    fairseq shards the shuffled batch list round-robin over ranks (rank r gets batches r, r+2,
    ...) and ``--update-freq 2`` groups consecutive batches, so each update sees the same two
    batches, and both normalise the summed gradient by the summed sample size.

    Tolerance: none (bitwise).  Each batch's gradient is computed by the same kernels on the
    same shapes in both runs; the only differing step is how two gradients are combined:
    autograd adds the second to the first (g0 + g1), gloo's all-reduce adds them across ranks
    (g0 + g1 or g1 + g0, equal since IEEE addition is commutative), DDP then divides by the world
    size 2 and fairseq multiplies by 2 / sample_size instead of 1 / sample_size -- scalings by
    powers of two, which are exact.  Identical gradients give identical Adam updates.
    (Measured: bitwise equal weights for both c10d and legacy_ddp.)
    """
    flags = ["--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0", "--attention-dropout", "0",
             "--rpr-max-relative-position", "2"]
    dist, dump = train_distributed(data_bin, tmp_path / "dist", flags, LS, ddp_backend)
    _assert_ok(dist)
    rc, single_log, single_dump = train_single(data_bin, tmp_path / "single", flags, LS, extra=["--update-freq", "2"])
    assert rc == 0, single_log[-4000:]
    a, b = _per_update(dist[0][1]), _per_update(single_log)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for u in a:
        for key in ("loss", "nll_loss", "gnorm", "wpb", "bsz", "lr"):  # same batches, same numbers
            assert a[u][key] == b[u][key], (u, key, a[u][key], b[u][key])
    for u in (1, 2, 3):
        wd, ws = _dumped(dump, 0, u), _dumped(single_dump, 0, u)
        worst = max((wd[k].float() - ws[k].float()).abs().max().item() for k in wd)
        assert worst == 0.0, f"update {u}: max |difference| {worst}"
    moved = max((_dumped(dump, 0, 1)[k].float() - _dumped(dump, 0, 3)[k].float()).abs().max().item() for k in wd)
    assert moved > 1e-4  # the models did train
