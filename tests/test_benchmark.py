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


def test_deploy_benchmark_reports_targets_with_their_flop_ceiling(tmp_path, monkeypatch):
    """benchmarks/deploy_speed.py end to end at toy size: every engine, setting and model is
    measured, every target is checked, and the 48-1 vs 48-6 rows carry the FLOP-implied ceiling
    that explains a miss (the analytic count of speed.forward_flops on the same sources)."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed: pip install '.[deploy]'")
    import deploy_speed

    monkeypatch.setattr(deploy_speed, "SHAPE", dict(d=32, f=64, h=2, vocab=200, rpr=4))
    monkeypatch.setattr(deploy_speed, "MODELS", {"student 6-6": (2, 2), "DESDAR 48-1": (6, 1), "deep 48-6": (6, 2)})
    assert deploy_speed.main(["--sentences", "3", "--single", "1", "--repeat", "1", "--length", "3", "--threads", "1",
                              "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "deploy-speed-cpu.json").read_text())
    measured = {(r["setting"], r["model"], r["engine"]) for r in report["rows"]}
    assert len(measured) == 4 * 3 * 3 and all(r["tok_s"] > 0 for r in report["rows"])
    checks = {c["what"]: c for c in report["checks"]}
    assert len(checks) == 4 + 3 * 2
    for engine in ("fairseq", "ct2 int8", "ct2 float32"):
        beam4 = checks[f"48-1 vs 48-6, {engine}, beam 4, batched"]
        greedy = checks[f"48-1 vs 48-6, {engine}, greedy, batched"]
        # the protocol's statistics (issue 78): a target is met by the claim, the interval's lower bound
        assert beam4["target"] == 2.0 and beam4["met"] == (beam4["claim"] >= 2.0) and greedy["met"] is None
        assert beam4["claim"] == beam4["interval"][0] <= beam4["ratio"] + 0.005
        ceilings = [float(c["measured_reason"].split("FLOP-implied ceiling ")[1].split("x")[0]) for c in (beam4, greedy)]
        assert ceilings[0] > ceilings[1] > 1.0  # beam 4 runs 4 hypotheses through the decoder, greedy one
    assert "FLOP-implied ceiling" in (tmp_path / "deploy-speed-cpu.md").read_text()


def test_the_benchmark_modules_import_each_other_one_way():
    """benchmarks/ modules import each other as top-level modules (the script's directory is on
    sys.path); every import of a sibling counts, also one inside a function, and they form no cycle
    (issue 33: the study's entry and its report imported each other; the study has its own room now,
    study/, checked by tests/test_import_cycles.py)."""
    import ast

    here = REPO / "benchmarks"
    modules = {f.stem for f in here.glob("*.py")}
    graph = {}
    for name in modules:
        tree = ast.parse((here / f"{name}.py").read_text(encoding="utf-8"))
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                deps.add(node.module.split(".")[0])
        graph[name] = deps & modules - {name}
    order, seen = [], set()

    def visit(name, path):
        assert name not in path, f"import cycle: {' -> '.join(path + (name,))}"
        if name not in seen:
            for dep in sorted(graph[name]):
                visit(dep, path + (name,))
            seen.add(name)
            order.append(name)

    for name in sorted(graph):
        visit(name, ())
