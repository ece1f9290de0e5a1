"""The speed/memory benchmark runs as a user runs it and its measures mean what they say.

No timing is asserted (timings belong to the benchmark's own report, not to a unit
test); what is checked is that every requested row is produced with its ratios, and
that the activation-memory measure responds to what it should: activation
checkpointing shrinks it, a bigger batch grows it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]  # benchmarks/: importable via pytest's pythonpath option


def test_saved_activation_bytes_scales_with_batch_and_ignores_parameters():
    import speed

    import deepnmt_fairseq  # noqa: F401

    p = dict(speed.PRESETS["tiny"])
    model = speed.build("deepnmt_transformer", ["--encoder-layers", "2", "--decoder-layers", "1"], p,
                        speed.torch.device("cpu"))
    small = speed.saved_activation_bytes(model, speed.batch(p, speed.torch.device("cpu")))
    big = speed.saved_activation_bytes(model, speed.batch(dict(p, bsz=4 * p["bsz"]), speed.torch.device("cpu")))
    # 4x the sentences -> ~4x the bytes; counting the (batch-independent) parameters as well,
    # which are about as large here, would give well under 3.5x
    assert small > 0 and 3.5 < big / small < 4.5, (small, big)


@pytest.mark.slow
def test_benchmark_script_writes_the_table_and_json(tmp_path):
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "speed.py"), "--preset", "tiny", "--repeat", "1",
                          "--warmup", "1", "--out", str(tmp_path), "--only", "RPR", "DESDAR", "checkpointing",
                          "MSC 6x12 decoding", "--profile"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "speed-tiny-cpu.json").read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert set(rows) == {"RPR (k 8)", "DESDAR 48-1 decoding (vs 48-6)", "MSC 6x12 memory, activation checkpointing",
                         "MSC 6x12 decoding"}
    rpr = rows["RPR (k 8)"]
    assert rpr["time_ratio"] > 0 and rpr["flop_ratio"] >= 1.0 and rpr["memory_ratio"] > 0
    desdar = rows["DESDAR 48-1 decoding (vs 48-6)"]
    assert desdar["ours_tok_per_s"] > 0 and desdar["speed_ratio_single"] > 0
    assert 0 < desdar["ours_encoder_share"] < 1 and desdar["search_time_ratio"] > 0
    ckpt = rows["MSC 6x12 memory, activation checkpointing"]
    assert 0 < ckpt["memory_ours"] < 0.6 * ckpt["memory_without"] and ckpt["met"]
    msc = rows["MSC 6x12 decoding"]  # issue 17's measure, and the profile that explains it
    assert msc["flop_efficiency"] == pytest.approx(msc["speed_ratio"] * msc["decode_flop_ratio"])
    assert msc["decode_flop_ratio"] > 1 and msc["met"] == (msc["flop_efficiency"] >= 0.95)
    for prof in (msc["profile_ours"], msc["profile_stock"]):
        assert set(prof) == {"matmul", "copies", "other operators", "outside operators"}
        assert prof["matmul"] > 0 and prof["copies"] > 0 and prof["other operators"] > 0
    table = (tmp_path / "speed-tiny-cpu.md").read_text()
    assert "| MSC 6x12 decoding | profile: matmul s |" in table
    assert "| RPR (k 8) | train s/update |" in table and "DESDAR 48-1" in table
