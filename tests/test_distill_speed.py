"""deepnmt-distill's report measures speed by the project's protocol (issue 78,
:mod:`deepnmt_deploy.speed_protocol`): a tuning pass over grids fixed in code (the teacher's with
--batch-size and --max-tokens points and thread counts), recorded and then frozen; timed runs
interleaved teacher/student, the input repeated to the minimum of work; the median ratio, its
interval and the claim (its lower bound) from the protocol's statistics; the quickstart's line
states the claim.  Engines are faked with synthetic timings: no speed is measured here."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from pathlib import Path

import pytest

from deepnmt_deploy import speed_protocol as protocol
from deepnmt_fairseq.distill import report

REPO = Path(__file__).resolve().parents[1]


class FakeSplit:
    """A BinarizedSplit stand-in: records the copies asked for."""

    def __init__(self, n):
        self.sizes = list(range(1, n + 1))
        self.copies = []

    def __len__(self):
        return len(self.sizes)

    def copy(self, out, ids):
        self.copies.append((Path(out).name, list(ids)))
        return Path(out)


def _inputs(tmp_path, **kw):
    return report.ReportInputs(out=tmp_path / "rep", data=tmp_path / "data", teacher=tmp_path / "t.pt",
                               student=tmp_path / "s.pt", ct2=tmp_path / "ct2", test_source=tmp_path / "src",
                               test_reference=tmp_path / "ref", **kw)


def test_timed_runs_interleave_teacher_and_student_repeat_the_input_and_use_the_protocols_statistics(tmp_path):
    r = _inputs(tmp_path, speed_repeats=5, speed_min_seconds=1.0)
    m = report.Measure(r, lambda msg: None)
    calls = []
    teacher_s = iter([0.50, 0.52, 0.49, 0.55, 0.51])  # seconds a run, engine's own timer (3 passes of 100 tokens)
    student_s = iter([0.101, 0.099, 0.120, 0.100, 0.096])  # (13 passes of 90 tokens)

    def fairseq(name, model, s, shards=1, tag="", data=None):
        calls.append(("teacher", tag, data))
        return {"seconds": next(teacher_s) * 3, "tokens": 300, "tokens_per_s": 1.0, "sentences": 30, "hyps": {}}

    def ct2(name, source, s, tag=""):
        calls.append(("student", tag, Path(source).read_text().count("\n")))
        return {"seconds": next(student_s) * 13, "tokens": 90 * 13, "tokens_per_s": 1.0, "sentences": 130,
                "lines": []}

    m.fairseq, m.ct2 = fairseq, ct2
    split = FakeSplit(20)
    srcs = [f"s{i}" for i in range(20)]
    ids = [1, 4, 7, 9, 12, 15, 18, 19, 2, 5]
    warm = {"teacher": (report.Setting(1, 2), {"seconds": 0.5}), "student": (report.Setting(1, 1), {"seconds": 0.1})}
    res = report.timed_pairs(m, split, srcs, "single", ids, warm, log=lambda msg: None)
    # calibration: 1.25 x 1 s of work at the untimed pass's pace: 3 passes of the teacher, 13 of the student
    assert res["passes"] == {"teacher": 3, "student": 13}
    assert split.copies == [("speed-single-x3", ids * 3)]  # the teacher's input: the sentences, 3 times
    # interleaved: teacher, student, teacher, student, ... 5 rounds; the student reads its input 13 times
    assert [c[0] for c in calls] == ["teacher", "student"] * 5
    assert all(c[2] == len(ids) * 13 for c in calls if c[0] == "student")
    assert all(c[1] == "speed-single" for c in calls)
    # every run: the engine's seconds and tokens, the process's wall and CPU time, the load before and after
    run = res["runs"]["teacher"][0]
    assert {"seconds", "tokens", "wall", "cpu", "load_before", "load_after"} <= set(run)
    # the statistics are the protocol's: seconds per token, teacher over student = the student's tok/s over the teacher's
    ref = [x["seconds"] / x["tokens"] for x in res["runs"]["teacher"]]
    cand = [x["seconds"] / x["tokens"] for x in res["runs"]["student"]]
    assert res["result"] == protocol.summarize(ref, cand)
    t_rates = [300 / (x * 3) for x in (0.50, 0.52, 0.49, 0.55, 0.51)]
    s_rates = [90 / x for x in (0.101, 0.099, 0.120, 0.100, 0.096)]
    assert res["result"]["median"] == pytest.approx(statistics.median(s / t for s, t in zip(s_rates, t_rates)),
                                                    abs=1e-3)
    assert res["short_repeats"] == 0  # every run held >= 1 s of decoding
    assert res["result"]["claim"] == res["result"]["interval"][0] < res["result"]["median"]


def test_short_runs_are_counted_and_the_summary_holds_median_interval_and_claim(tmp_path):
    r = _inputs(tmp_path, speed_repeats=5, speed_min_seconds=10.0)
    m = report.Measure(r, lambda msg: None)
    m.fairseq = lambda *a, **k: {"seconds": 13.0, "tokens": 1300, "tokens_per_s": 100.0, "sentences": 10, "hyps": {}}
    walls = iter([12.9, 13.1, 9.0, 13.0, 12.8])  # one run of the student held less than 10 s
    m.ct2 = lambda *a, **k: {"seconds": next(walls), "tokens": 12000, "tokens_per_s": 1.0, "sentences": 10,
                             "lines": []}
    split = FakeSplit(10)
    warm = {"teacher": (report.Setting(64, 2), {"seconds": 13.0}), "student": (report.Setting(8, 1), {"seconds": 0.9})}
    batched = report.timed_pairs(m, split, [f"s{i}" for i in range(10)], "batched", list(range(10)), warm,
                                 log=lambda msg: None)
    assert batched["passes"] == {"teacher": 1, "student": 14}
    assert split.copies == []  # the teacher's pass is long enough: the test split as it is
    assert batched["short_repeats"] == 1
    speed = {"batched": batched, "single": {**batched, "short_repeats": 0}}
    sm = report.speed_summary(speed, 5, 10.0)
    res = batched["result"]
    assert sm["speedup_batched"] == round(res["median"], 2)
    assert sm["speedup_batched_claim"] == sm["speedup_batched_interval"][0] == math.floor(res["claim"] * 100) / 100
    assert sm["speedup_batched_claim"] <= res["claim"] and sm["speedup_batched_interval"][1] >= res["interval"][1]
    assert sm["speed_meets_protocol"] is False  # a short run: not the protocol's claim
    speed["batched"] = {**batched, "short_repeats": 0}
    assert report.speed_summary(speed, 5, 10.0)["speed_meets_protocol"] is True
    assert report.speed_summary(speed, 5, 2.0)["speed_meets_protocol"] is False  # the quickstart's shortened one


def test_tuning_pass_grid_has_batch_sizes_max_tokens_and_threads_and_is_recorded_then_frozen(tmp_path):
    r = _inputs(tmp_path, batch_size=64, ct2_batch_size=32)
    m = report.Measure(r, lambda msg: None)
    m.cores = 2
    tried = []

    def fairseq(name, model, s, shards=1, tag="", data=None):
        tried.append(("teacher", s))
        assert tag == "probe" and data == tmp_path / "rep" / ("probe-single" if s.batch_size == 1 else "probe-batched")
        return {"tokens_per_s": 500.0 + s.max_tokens / 10 + 50 * (s.threads == 1)}

    def ct2(name, source, s, tag=""):
        tried.append(("student", s))
        return {"tokens_per_s": 1000.0 + s.batch_size + 100 * s.inter}

    m.fairseq, m.ct2 = fairseq, ct2
    split = FakeSplit(30)
    srcs = [f"s{i}" for i in range(30)]
    out = report.tuning_pass(m, split, srcs, {False: list(range(30)), True: list(range(0, 30, 3))}, log=lambda x: None)
    grid = out["record"]["grid"]["teacher fairseq-generate"]["batched"]
    assert grid["batch_size"] == [32, 64, 128, 256] and grid["max_tokens"] == list(report.FAIRSEQ_MAX_TOKENS)
    assert grid["layouts"] == [{"threads": 2, "inter": 1}, {"threads": 1, "inter": 1}]
    teacher = [s for who, s in tried if who == "teacher" and s.batch_size != 1]
    # every --batch-size and --max-tokens point with every core's threads, then 1 thread at the fastest
    assert [(s.batch_size, s.max_tokens, s.threads) for s in teacher] == [
        (32, 0, 2), (64, 0, 2), (128, 0, 2), (256, 0, 2), (0, 2048, 2), (0, 4096, 2), (0, 8192, 2), (0, 8192, 1)]
    # the fastest point (8192 tokens) with 2 threads, then 1 thread there: 1 thread wins
    assert out["settings"]["teacher fairseq-generate", False] == report.Setting(0, 1, 1, max_tokens=8192)
    assert out["record"]["choice"]["teacher fairseq-generate"]["batched"] == \
        "fairseq-generate, 1 torch thread, batches of up to 8192 tokens"
    assert out["settings"]["student deepnmt-translate", False] == report.Setting(64, 1, 2)
    # probes on every PROBE_EVERY-th sentence of the set (batched: all; single: its subset)
    assert split.copies == [("probe-batched", list(range(0, 30, 3))), ("probe-single", list(range(0, 30, 9)))]
    assert (tmp_path / "rep" / "probe-single.src").read_text().split() == ["s0", "s9", "s18", "s27"]
    rec = json.loads((tmp_path / "rep" / "tuning.json").read_text())
    assert rec["grid"] == out["record"]["grid"] and rec["machine"]["cpu"] and "vector_extensions" in rec["machine"]
    assert out["record"]["frozen"] is False
    # frozen: measured again in the same directory, the recorded choice without a probe
    m.fairseq = m.ct2 = None
    again = report.tuning_pass(m, split, srcs, {False: list(range(30)), True: list(range(0, 30, 3))},
                               log=lambda x: None)
    assert again["settings"] == out["settings"] and again["record"]["frozen"] is True
    assert again["record"]["tried"] == out["record"]["tried"]


def test_a_max_tokens_setting_runs_fairseq_generate_with_max_tokens_and_no_batch_size(tmp_path, monkeypatch):
    runs = {}

    def fake_run(cmd, stdout, stderr, env):
        runs[Path(cmd[0]).name] = cmd
        stderr.write("Translated 1 sentences (3 tokens) in 0.0s (10.00 sentences/s, 30.00 tokens/s)\n")
        stderr.flush()
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(report.subprocess, "run", fake_run)
    m = report.Measure(_inputs(tmp_path), lambda msg: None)
    res = m.fairseq("teacher", tmp_path / "t.pt", report.Setting(0, threads=1, max_tokens=4096), tag="probe",
                    data=tmp_path / "other")
    cmd = runs["fairseq-generate"]
    assert cmd[cmd.index("--max-tokens") + 1] == "4096" and "--batch-size" not in cmd
    assert str(tmp_path / "other") in cmd
    # the rate is fairseq's own (from its unrounded time), not tokens / the rounded "0.0s"
    assert res["tokens_per_s"] == 30.0 and res["seconds"] == pytest.approx(0.1)


@pytest.mark.slow
def test_binarized_split_copy_holds_the_sentences_asked_for_repeats_included(data_bin, tmp_path):
    split = report.BinarizedSplit(Path(data_bin))
    assert len(split) > 3
    out = split.copy(tmp_path / "x", [2, 0, 0])
    copied = report.BinarizedSplit(out)
    assert copied.sizes == [split.sizes[2], split.sizes[0], split.sizes[0]]
    for prefix in split.prefixes:
        a, b = split._dataset(prefix), copied._dataset(out / prefix.name)
        assert [b[i].tolist() for i in range(3)] == [a[2].tolist(), a[0].tolist(), a[0].tolist()]
    assert split.copy(tmp_path / "x", [2, 0, 0]) == out  # made once


def _new_report():
    rep = json.loads((REPO / "benchmarks/results/distill-step7/quickstart-6-1-idle/report.json").read_text())
    rep["summary"].update(speedup_batched=10.1, speedup_batched_interval=[9.2, 11.0], speedup_batched_claim=9.2,
                          speedup_single=24.4, speedup_single_interval=[22.05, 25.3], speedup_single_claim=22.05,
                          speed_meets_protocol=False)
    ratios = {"ratios": [10.1, 9.2, 11.0, 10.0, 10.5], "median": 10.1, "interval": [9.2, 11.0], "claim": 9.2}
    kind = {"passes": {"teacher": 1, "student": 3}, "result": ratios, "short_repeats": 0, "runs": {}}
    rep["speed"] = {"protocol": protocol.protocol_settings(5, 2.0), "pinned_cores": [0, 1], "batched": kind,
                    "single": kind, "tuning": {"frozen": False}}
    return rep


def test_quickstart_line_states_the_claims_with_the_medians():
    from deepnmt_fairseq.quickstart import deploy_line

    line = deploy_line(_new_report())
    assert ("= ≥9.2x (median 10.1x, 95% CI 9.2-11.0) batched / ≥22.05x (median 24.4x, 95% CI 22.05-25.3) one "
            "sentence at a time the teacher's fairseq-generate") in line
    assert "(shortened speed protocol: 5 rounds of >= 2 s)" in line
    # a record measured before the protocol (the first 6-1 step-7 record) still reads, as its ratios
    old = json.loads((REPO / "benchmarks/results/distill-step7/quickstart-6-1-idle/report.json").read_text())
    assert "= 13.73x batched / 24.39x one sentence at a time" in deploy_line(old)


def test_report_markdown_states_the_lower_bound_as_the_claim():
    md = report.markdown(_new_report())
    assert "the claim being the lower bound of the 95% interval of the median ratio: ≥9.2x (median 10.1x" in md
    assert "5 rounds, each run >= 2 s of decoding" in md and "pinned to cores 0,1" in md
    assert "Shortened" in md and "10.10, 9.20, 11.00" in md
