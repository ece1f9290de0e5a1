"""The quickstart pipeline at smoke size: every step runs, a re-run redoes nothing."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["--max-update", "4", "--dim", "32", "--heads", "2", "--blocks", "2", "--block-layers", "1",
         "--save-every", "2", "--average", "2", "--bpe-merges", "300", "--max-len-b", "3",
         "--skd-beam", "1", "--single-sentences", "40",  # greedy SKD, one-sentence speed of 40: CI time
         "--speed-repeats", "1", "--speed-min-seconds", "0",  # step 7's timed runs: one round of one pass
         "--train-pairs", "3000"]  # (last: the stamp test leaves it out)

pytestmark = pytest.mark.slow


def _run(work, *extra):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "quickstart.py"), "--work-dir", str(work),
                           *SMOKE, *extra], capture_output=True, text=True)


def test_quickstart_smoke_and_rerun(tmp_path):
    work = tmp_path / "qs"
    first = _run(work)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
    res = json.loads((work / "eval" / "results.json").read_text())
    assert res["sentences"] == 1059
    assert "nrefs:1" in res["signature"] and "tok:13a" in res["signature"]
    hyp_lines = Path(res["translations"]).read_text(encoding="utf-8").splitlines()
    assert len(hyp_lines) == 1059  # every test sentence translated, in order
    assert "sacreBLEU" in first.stdout and "copy-the-source baseline" in first.stdout
    assert (work / "checkpoints" / "checkpoint_avg.pt").exists()
    out = first.stdout + first.stderr  # --train-pairs 3000: the first 3,000 pairs, also for step 7's SKD
    assert "tokenized train.en: 3000 lines" in out and "translates 3000 training sentences" in out
    # step 7 (the deploy extra is installed by the test setup): deepnmt-distill distils the
    # quickstart's own MSC model into a pre-norm student, exported int8, which translates every
    # raw test sentence in order; the report compares them in one run
    rep = json.loads((work / "distill" / "report" / "report.json").read_text())
    served = rep["systems"]["student deepnmt-translate"]
    teacher = rep["systems"]["teacher fairseq-generate"]
    assert rep["sizes"]["teacher"]["checkpoint"] == str(work / "checkpoints" / "checkpoint_avg.pt")
    assert f"sacreBLEU {served['sacrebleu']} (teacher {teacher['sacrebleu']}" in first.stdout
    # step 7's line states the speed claims, the lower bounds of the intervals, with the medians (issue 78)
    sm = rep["summary"]
    assert f"= ≥{sm['speedup_batched_claim']}x (median {sm['speedup_batched']}x, 95% CI" in first.stdout
    assert "(shortened speed protocol: 1 round of >= 0 s)" in first.stdout
    assert served["batched"]["sentences"] == 1059 and rep["test"]["sentences"] == 1059
    assert 30 <= rep["test"]["single_sentences"] <= 60  # --single-sentences 40 reaches the report
    assert len((work / "distill" / "report" / "student.deepnmt-translate.txt").read_text(
        encoding="utf-8").splitlines()) == 1059
    assert served["batched"]["tokens_per_s"] > 0 and teacher["single"]["tokens_per_s"] > 0
    assert (work / "distill" / "skd-bin" / ".done").exists() and (work / "distill" / "ct2-int8" / ".done").exists()
    train_cmds = [ln for ln in first.stdout.splitlines() if "$ " in ln and "fairseq-train " in ln]
    assert len(train_cmds) == 2 and "--deep-memory msc" in train_cmds[0] and "--deep-memory" not in train_cmds[1]
    assert "skd-bin" in train_cmds[1]  # the student learns from the MSC teacher's translations
    assert " --max-update 8 " in train_cmds[1]  # twice the teacher's 4 updates
    assert " --decoder-layers 1 " in train_cmds[1]  # the default student shape, 6-1 (issue 71)
    # each engine measured at the fastest of the settings its probes tried (issue 71)
    # (the teacher's batched grid: 4 --batch-size and 3 --max-tokens points, then 1 thread at the fastest)
    for name, kind, n_tried in (("teacher fairseq-generate", "batched", 8), ("teacher fairseq-generate", "single", 2),
                                ("student deepnmt-translate", "batched", 6), ("student deepnmt-translate", "single", 2)):
        tried = rep["settings_search"][name][kind]
        assert len(tried) == n_tried, (name, kind, tried)
        chosen = rep["systems"][name][kind]["setting"]
        assert chosen == max(tried, key=lambda t: t["tokens_per_s"])["setting"], (name, kind, chosen, tried)
    assert rep["machine"]["kernels"] and "Settings searched" in (work / "distill" / "report" / "report.md").read_text()
    assert "estimated time on this machine (" in out  # printed before the first step
    # a run that did every step records its time, in the format of the estimate's record
    timed = json.loads((work / "quickstart-time.json").read_text())
    assert timed["options"]["train_pairs"] == 3000 and timed["kernels"] and 0 < timed["seconds"] < 3600

    stamp = (work / "checkpoints" / "checkpoint_avg.pt").stat().st_mtime
    t0 = time.time()
    again = _run(work)
    assert again.returncode == 0
    assert not [ln for ln in again.stdout.splitlines()  # nothing redone
                if "$ " in ln and ("fairseq-train " in ln or "fairseq-generate " in ln)]
    assert (work / "checkpoints" / "checkpoint_avg.pt").stat().st_mtime == stamp
    assert time.time() - t0 < 30
    assert json.loads((work / "quickstart-time.json").read_text()) == timed  # a rerun times nothing

    # a copied work directory uses its own model (not the path its results.json recorded)
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(work, moved)
    shutil.rmtree(work / "checkpoints")
    copy = _run(moved)
    assert copy.returncode == 0, copy.stderr[-3000:]
    assert f"model:        {moved / 'checkpoints' / 'checkpoint_avg.pt'}" in copy.stdout
    assert "not exportable (MSC" in copy.stdout  # read from the copy's model
    shutil.copytree(moved / "checkpoints", work / "checkpoints")

    other = _run(work, "--seed", "2")
    assert other.returncode != 0 and "other settings" in other.stderr
    assert json.loads((work / "eval" / "results.json").read_text()) == res  # nothing destroyed


def test_a_work_dir_stamped_before_a_new_setting_is_reused(tmp_path):
    """A setting added later (--train-pairs) is absent from older stamps: at its default, the
    old work directory is still this run's; any other value is refused before anything runs."""
    work = tmp_path / "qs"
    work.mkdir()
    from deepnmt_fairseq import quickstart

    stamp = {"bpe_merges": 300, "blocks": 2, "block_layers": 1, "dim": 32, "heads": 2, "max_update": 4,
             "max_tokens": 2048, "lr": 3e-3, "warmup": 150, "save_every": 2, "average": 2, "seed": 1, "max_len_b": 3}
    (work / "settings.json").write_text(json.dumps(stamp))
    args = ["--work-dir", str(work), *SMOKE[:-2]]  # every smoke setting but --train-pairs
    (work / "data-bin").mkdir()
    import unittest.mock as mock

    with mock.patch.object(quickstart, "prepare", side_effect=RuntimeError("reused")):
        with pytest.raises(RuntimeError, match="reused"):  # the stamp was accepted: on to the data
            quickstart.main(args)
        with pytest.raises(SystemExit, match="other settings .*train_pairs"):
            quickstart.main(args + ["--train-pairs", "10"])


def test_the_time_estimate_follows_the_measured_machines_and_the_options():
    """The quickstart prints its expected time before it starts (issue 72): the measured minutes on
    2 cores of the same CPU kind (the committed record deepnmt_fairseq/quickstart_times.json, set-up
    excluded), less with more cores, fewer pairs or updates, or without step 7; the line names the
    quickstart version the record timed."""
    import argparse

    from deepnmt_fairseq.quickstart import estimate, measured_times

    times = measured_times()

    def minutes(kernels="AVX512", cores=2, **kw):
        a = argparse.Namespace(**{"train_pairs": None, "max_update": 800, "deploy": "auto", **kw})
        line = estimate(a, kernels, cores)
        assert "--train-pairs 3000" in line and f"{kernels} kernels, {cores} cores" in line
        assert times.get(kernels, times["AVX2"])["quickstart"] in line
        return int(line.split("about ")[1].split(" min")[0])

    for kind in ("AVX512", "AVX2"):
        r = times[kind]
        assert minutes(kind) == round((r["seconds"] - r["setup_seconds"]) / 60) and r["source"] and r["date"]
    assert minutes("DEFAULT") == minutes("AVX2")  # an unmeasured kind reads as the slower one
    assert minutes(cores=4) < minutes() and minutes(train_pairs=3000) < minutes()
    assert minutes(deploy="off") < minutes() and minutes(max_update=1600) > minutes()


def test_the_readme_states_the_records_times_and_which_version_they_timed():
    """README's quickstart times are the record's (a test fails when text and record disagree)."""
    from deepnmt_fairseq.quickstart import measured_times

    times = measured_times()
    text = " ".join((REPO / "README.md").read_text().split())
    m = re.search(r"About (\d+) min on 2 idle AVX-512 cores, (\d+) min from a fresh clone on 2 AVX2 cores", text)
    assert m, "README's quickstart time sentence is missing"
    for kind, minutes in (("AVX512", m.group(1)), ("AVX2", m.group(2))):
        assert int(minutes) == round((times[kind]["seconds"] - times[kind]["setup_seconds"]) / 60), kind
    assert "6-3 student" in text[m.start():m.end() + 200]  # says which version those times are of
