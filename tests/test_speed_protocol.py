"""The speed protocol (issue 78; the library's deepnmt_deploy/speed_protocol.py, its command line
benchmarks/speed_protocol.py): its statistics on synthetic timings, the interleaving and calibration on
real (sleeping) commands, the tuning pass, the rerun check, pinning, and that it is one module.

No speed is claimed here: the commands are ``sleep``s of known length, so the ratios are known."""

from __future__ import annotations

import json
import statistics

import pytest

import speed_protocol as sp


def test_claim_is_the_lower_bound_of_a_seeded_bootstrap_interval_of_the_median_ratio():
    ref = [10.0, 10.5, 9.8, 10.2, 10.1, 9.9, 10.3]
    cand = [1.0, 1.1, 0.9, 1.2, 0.95, 1.0, 1.05]
    res = sp.summarize(ref, cand)
    rs = [r / c for r, c in zip(ref, cand)]
    assert res["median"] == pytest.approx(statistics.median(rs), abs=1e-4)
    lo, hi = res["interval"]
    assert min(rs) - 1e-9 <= lo <= res["median"] <= hi <= max(rs) + 1e-9
    assert res["claim"] == lo and lo < res["median"]
    assert sp.summarize(ref, cand) == res  # seeded: the same timings give the same interval
    # noisier timings around the same ratio: a wider interval, a lower claim
    noisy = sp.summarize(ref, [0.6, 1.5, 0.7, 1.6, 0.95, 1.0, 1.4])
    assert noisy["interval"][1] - noisy["interval"][0] > hi - lo and noisy["claim"] < res["claim"]
    # identical ratios: a point interval
    assert sp.summarize([4.0] * 5, [1.0] * 5)["interval"] == [4.0, 4.0]


def test_bad_timings_and_too_few_repeats_are_refused():
    with pytest.raises(ValueError, match="same number"):
        sp.ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        sp.ratios([1.0], [0.0])
    with pytest.raises(ValueError, match="at least 5"):
        sp.measure(("a", "true"), [("b", "true")], repeats=3)
    with pytest.raises(ValueError, match="must differ"):
        sp.measure(("a", "true"), [("a", "true")], repeats=5)
    with pytest.raises(ValueError, match="do not exist"):
        sp.parse_cores("0,999")


def test_measure_interleaves_calibrates_the_work_and_finds_the_known_ratio(tmp_path):
    """sleep 0.4 against sleep 0.1: a ratio of about 4 (less the shell's start-up); each repeat holds
    >= min_seconds of work (the shorter command executed more times, as calibrated by its warm-up), the
    reference and the candidate alternate."""
    import math

    order = tmp_path / "order"
    ref = f"echo r >> {order}; sleep 0.4"
    cand = f"echo c >> {order}; sleep 0.1"
    rec = sp.measure(("slow", ref), [("fast", cand)], repeats=5, min_seconds=0.5, cores=[0], log=lambda *_: None)
    n_ref, n_cand = rec["executions_per_repeat"]["slow"], rec["executions_per_repeat"]["fast"]
    for name, n in (("slow", n_ref), ("fast", n_cand)):
        assert n == math.ceil(sp.CALIBRATION_MARGIN * 0.5 / rec["warm_up"][name]["wall"])
    assert n_ref == 2 and n_cand > n_ref
    walls = [r["wall"] for runs in rec["runs"].values() for r in runs]
    assert rec["short_repeats"] == sum(w < 0.5 for w in walls) <= 2  # the margin absorbs the load's noise
    # after the warm-ups (two each): r r c c c c c c, r r c c c c c c, ...
    seq = order.read_text().split()[4:]
    assert seq == (["r"] * n_ref + ["c"] * n_cand) * 5
    res = rec["results"]["fast"]
    # the ratio is that of the paired per-execution walls; each execution also pays a shell's start-up
    # (o seconds, large on a loaded CI core: 0.12 s once), so the known ratio is (0.4 + o) / (0.1 + o)
    per = {n: [r["wall"] / r["times"] for r in rec["runs"][n]] for n in ("slow", "fast")}
    assert res["median"] == pytest.approx(statistics.median(s / f for s, f in zip(per["slow"], per["fast"])),
                                          abs=1e-3)
    o = max(0.0, statistics.median(per["fast"]) - 0.1)
    assert 1.5 < res["median"] < 4.5 and res["claim"] <= res["median"]
    assert res["median"] == pytest.approx((0.4 + o) / (0.1 + o), rel=0.25)
    assert rec["machine"]["pinned_cores"] == [0] and rec["machine"]["cpu"]
    assert {"load_before", "load_after", "cpu", "wall"} <= set(rec["runs"]["fast"][0])


def test_tune_picks_the_fastest_setting_and_measure_uses_it_frozen(tmp_path):
    rec = sp.tune("x", "sleep {s}", {"s": ["0.12", "0.03"]}, min_seconds=0.15, log=lambda *_: None)
    assert rec["choice"] == {"s": "0.03"} and len(rec["timings"]) == 2
    assert sp.frozen("sleep {s}", rec) == "sleep 0.03"
    with pytest.raises(ValueError, match="no field"):
        sp.expand_grid("sleep {t}", {"s": ["1"]})
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(rec))
    out = tmp_path / "m.json"
    assert sp.main(["measure", "--reference", "ref", "sleep 0.1", "--candidate", "x", "sleep {s}",
                    "--tuned", f"x={path}", "--min-seconds", "0.1", "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["candidates"][0]["command"] == "sleep 0.03" and m["tuned"] == {"x": {"s": "0.03"}}


def test_compare_checks_that_two_reruns_claim_within_ten_percent(tmp_path):
    def rec(claim):
        return {"results": {"student": {"claim": claim}}}

    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(rec(10.0)))
    b.write_text(json.dumps(rec(9.2)))
    c.write_text(json.dumps(rec(8.5)))
    assert sp.rerun_agreement(rec(10.0), rec(9.2))["student"]["within_10_percent"]
    assert sp.main(["compare", str(a), str(b)]) == 0
    assert sp.main(["compare", str(a), str(c)]) == 1


def test_one_protocol_in_the_library_used_by_the_command_line_and_the_report():
    """One concept, one place: the command line and deepnmt-distill's report use the library's
    functions (no second copy of the statistics), and the library imports no torch or fairseq."""
    import subprocess
    import sys

    from deepnmt_deploy import speed_protocol as lib

    for name in ("summarize", "bootstrap_interval", "ratios", "measure", "tune", "machine", "executions_for"):
        assert getattr(sp, name) is getattr(lib, name), name
    code = ("import sys, deepnmt_deploy.speed_protocol as p; "
            "assert not {'torch', 'fairseq', 'deepnmt_fairseq'} & set(sys.modules); print(p.machine()['cpu'])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip(), res.stderr[-2000:]
    from deepnmt_fairseq import machine

    assert machine.cpu_model is lib.cpu_model  # the CPU model read in one place
    assert all(isinstance(x, str) for x in lib.vector_extensions())


def test_calibration_and_pinning():
    import os

    from deepnmt_deploy import speed_protocol as lib

    # a pass shorter than the minimum is repeated: 1.25 x 10 s at 3 s a pass = 5 passes; a long one once
    assert lib.executions_needed(3.0, 10.0) == 5 and lib.executions_needed(20.0, 10.0) == 1
    assert lib.executions_needed(0.5, 0.0) == 1
    if hasattr(os, "sched_setaffinity"):
        before = os.sched_getaffinity(0)
        with lib.pinned([0]) as cores:
            assert cores == [0] and os.sched_getaffinity(0) == {0}
        assert os.sched_getaffinity(0) == before
    with lib.pinned(None) as cores:
        assert cores is None
    assert lib.meets_protocol(5, 10.0) and not lib.meets_protocol(4, 10.0) and not lib.meets_protocol(5, 2.0)
    assert not lib.meets_protocol(5, 10.0, short_repeats=1)
