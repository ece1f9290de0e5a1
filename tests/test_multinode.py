"""Multi-node, simulated (issue 67 §5): two torchrun agents on localhost as two nodes of 2 ranks
each (c10d rendezvous, gloo, CPU), started through ``scripts/torchrun_example.sh`` and
``scripts/train.sh --launcher torchrun``, train a registry row's tiny variant; the result equals one
process with ``--update-freq 4``: the same logged losses and the same weights.

Why they can agree: fairseq deals the shuffled batch list round-robin to the 4 ranks and
``--update-freq 4`` groups 4 consecutive batches, so every update sees the same 4 batches, and both
normalise the summed gradient by the summed sample size (dropout off: no random masks).  Tolerance:
gloo sums the 4 ranks' gradients in its own order, and float addition is not associative, so the
weights may differ in the last bits (measured: 1.1e-13 at most); losses are logged to 3 decimals.
Cost: about 55 s on 2 shared cores (4 ranks, 2 agents and the single process start fairseq).
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

from test_preemption import ende_data  # noqa: F401  (the fixture: DEEPNMT_DATA with wmt14-en-de/bin)

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
ROW = "msc-wmt14-ende-base-6L"
TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--encoder-layers", "2", "--decoder-layers", "2", "--msc-block-layers", "1", "--dropout", "0",
        "--attention-dropout", "0", "--activation-dropout", "0", "--batch-size", "4", "--required-batch-size-multiple",
        "1", "--max-update", "3", "--disable-validation", "--log-format", "json", "--log-interval", "1"]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(data, ck, **extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "DEEPNMT_DATA": str(data),
            "DEEPNMT_CHECKPOINTS": str(ck), "PYTHON": sys.executable,
            "TORCHRUN": str(Path(sys.executable).with_name("torchrun")), **extra}


def _losses(text):
    return {int(d["num_updates"]): float(d["loss"]) for d in
            map(json.loads, re.findall(r"train_inner\W+(\{.*\})", text))}


def _weights(path):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    state = load_checkpoint(str(path))
    return state["model"], state["optimizer_history"][-1]["num_updates"]


@pytest.mark.slow
def test_two_torchrun_nodes_of_two_ranks_equal_one_process_with_update_freq_4(ende_data, tmp_path):  # noqa: F811
    start = time.time()
    port, rdzv = _port(), f"deepnmt-test-{os.getpid()}"
    nodes = []
    for node in range(2):  # two agents = two "nodes" on localhost, one c10d rendezvous
        env = _env(ende_data, tmp_path / "multi", NNODES="2", NPROC_PER_NODE="2", RDZV_HOST="127.0.0.1",
                   RDZV_PORT=str(port), RDZV_ID=rdzv)
        nodes.append(subprocess.Popen(["bash", str(SCRIPTS / "torchrun_example.sh"), ROW, "--cpu", "--max-tokens", "1024",
                                       "--", *TINY, "--update-freq", "1"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in nodes:
        try:
            outs.append(p.communicate(timeout=600)[0])
        finally:
            if p.poll() is None:
                p.kill()
    for i, (p, out) in enumerate(zip(nodes, outs)):
        assert p.returncode == 0, f"node {i}:\n{out[-5000:]}"
    text = "\n".join(outs)
    assert "--distributed-world-size 4" in text or "distributed_world_size': 4" in text, text[-3000:]
    for rank in range(4):  # every rank joined the one process group
        assert f"distributed init (rank {rank})" in text, rank
    multi = _losses(text)

    single = subprocess.run(["bash", str(SCRIPTS / "train.sh"), ROW, "--cpu", "--max-tokens", "1024", "--", *TINY,
                             "--update-freq", "4"], env=_env(ende_data, tmp_path / "single"), capture_output=True,
                            text=True, timeout=600)
    assert single.returncode == 0, single.stdout[-4000:] + single.stderr[-4000:]
    one = _losses(single.stdout + single.stderr)
    assert sorted(multi) == sorted(one) == [1, 2, 3]
    for u in one:
        assert abs(multi[u] - one[u]) <= 0.002, (u, multi[u], one[u])  # logged with 3 decimals
    a, na = _weights(tmp_path / "multi" / ROW / "checkpoint_last.pt")
    b, nb = _weights(tmp_path / "single" / ROW / "checkpoint_last.pt")
    assert na == nb == 3
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst <= 1e-5, worst
    print(f"multinode: 2 nodes x 2 ranks vs update-freq 4, max |weight diff| {worst:.3g}, "
          f"{time.time() - start:.0f} s")
