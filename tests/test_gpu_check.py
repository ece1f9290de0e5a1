"""The prepared device check (benchmarks/gpu_check.py, issue 67 §1) in its tiny CPU mode, so that
the script a GPU session runs cannot rot: every section's code path runs, and the records, the
command and the markdown table it writes are read back.  (Measured: about 70 s on 2 loaded cores.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("health", "throughput", "checkpointing", "ddp", "correctness", "desdar", "ct2")


def _run(out: Path, *args, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny", "--out", str(out),
                           *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


@pytest.mark.slow
def test_tiny_mode_runs_every_section_and_writes_records_command_and_table(tmp_path):
    res = _run(tmp_path / "out")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    rec = json.loads((tmp_path / "out" / "records.json").read_text())
    assert rec["tiny"] is True and rec["device"] == "cpu"
    assert list(rec["sections"]) == list(SECTIONS)
    for name, s in rec["sections"].items():
        assert s["status"] == "ok", (name, s)
        assert s["rows"], name  # every section measured something
        assert not s["skipped"] or name == "ct2", (name, s["skipped"])  # the budget skipped nothing
        assert all(r["ok"] is not False for r in s["rows"]), (name, [r for r in s["rows"] if r["ok"] is False])

    import test_exactness  # tests/ and benchmarks/ are on pytest's pythonpath (pyproject.toml)

    rows = rec["sections"]["correctness"]["rows"]
    incremental = [r for r in rows if r["measure"].startswith("incremental")]
    assert sorted(r["item"] for r in incremental) == sorted(test_exactness.ALL)  # every variant
    assert all(r["ours"] <= 1e-5 for r in incremental)
    assert any(r["measure"].startswith("beam 4") for r in rows)
    assert any(r["measure"].startswith("beam scores vs teacher-forced") for r in rows)

    thr = rec["sections"]["throughput"]["rows"]
    train = [r for r in thr if r["measure"].startswith("train tokens/s")]
    assert train and all(r["ours"] > 0 and r["reference"] > 0 and r["flop_ratio"] > 1 for r in train)
    assert all(r["ok"] is None for r in train)  # tiny shapes judge no speed target
    assert any(r["measure"].startswith("beam-4 batched") for r in thr)
    ckpt = rec["sections"]["checkpointing"]["rows"]
    assert any("saved for backward" in r["measure"] and r["ratio"] < 1 for r in ckpt)
    desdar = rec["sections"]["desdar"]["rows"]
    assert any(r["measure"] == "FLOP-implied speed ratio (analytic)" and r["ours"] > 1 for r in desdar)
    ct2 = rec["sections"]["ct2"]["rows"]
    assert {r["item"] for r in ct2} >= {"fairseq (SequenceGenerator) fp32", "ctranslate2 float32"}

    ddp = rec["sections"]["ddp"]["rows"]
    assert any(r["item"] == "stochastic c10d" and r["ours"] == 0 and r["ok"] for r in ddp)
    assert any(r["item"] == "plain legacy_ddp" and "update-freq" in r["measure"] and r["ok"] for r in ddp)

    health = [r for r in rec["sections"]["health"]["rows"] if r["measure"].startswith("loss first")]
    assert len(health) == 2 and all(r["finite"] and r["falling"] and r["updates"] == 6 for r in health)
    assert all("--bf16" in r["command"].split() for r in health)  # fairseq-train --fp16 needs CUDA
    assert [r["row"] for r in health] == ["msc-iwslt14-ende-72L-l2", "rnmt-wmt14-ende-transparent-20L"]

    command = (tmp_path / "out" / "command.txt").read_text().strip()
    assert command.endswith(f"benchmarks/gpu_check.py --tiny --out {tmp_path / 'out'}")
    table = (tmp_path / "out" / "table.md").read_text()
    assert table.startswith("Device check (`benchmarks/gpu_check.py --tiny`)")
    assert f"Command: `{command}`" in table
    assert "| section | item | measure | ours | reference | ratio | target | ok |" in table
    for name in SECTIONS:
        assert f"\n| {name} |" in table, name
    assert "**NO**" not in table


def test_budget_guard_skips_sections_cleanly_and_records_them_as_cut(tmp_path):
    res = _run(tmp_path / "out", "--budget", "0.5", timeout=300)
    assert res.returncode == 3, res.stderr[-4000:]  # cut, not ok (and not a failed check)
    rec = json.loads((tmp_path / "out" / "records.json").read_text())
    assert all(s["status"] == "cut (budget)" and not s["rows"] for s in rec["sections"].values())
    table = (tmp_path / "out" / "table.md").read_text()
    assert table.count("cut (budget)") == len(SECTIONS)
    assert "cut by the budget: " + ", ".join(SECTIONS) in res.stderr


def test_a_failed_check_is_a_failing_exit_and_a_NO_in_the_table(tmp_path, monkeypatch):
    """In-process: a section whose contract breaks (here: incremental decoding made to differ)
    ends with exit 1 and a **NO** row; the other sections still run."""
    import fairseq_helpers
    import gpu_check

    real = fairseq_helpers.incremental_decode
    monkeypatch.setattr(fairseq_helpers, "incremental_decode", lambda *a: real(*a) + 1e-3)
    rc = gpu_check.main(["--tiny", "--out", str(tmp_path / "out"), "--sections", "correctness", "desdar"])
    assert rc == 1
    rec = json.loads((tmp_path / "out" / "records.json").read_text())
    assert any(r["ok"] is False for r in rec["sections"]["correctness"]["rows"])
    assert rec["sections"]["desdar"]["rows"]
    assert "**NO**" in (tmp_path / "out" / "table.md").read_text()


def test_runs_where_pytest_is_not_installed(tmp_path):
    """The lent GPU machine has no pytest (benchmarks/gpu_check_lease.py does not carry it): the
    variant tables are read from the test modules through a stand-in for pytest's decorators."""
    code = ("import runpy, sys; sys.modules['pytest'] = None; "
            f"sys.argv = ['gpu_check.py', '--tiny', '--out', {str(tmp_path / 'out')!r}, '--sections', 'correctness'];"
            f"runpy.run_path({str(REPO / 'benchmarks' / 'gpu_check.py')!r}, run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "No module named 'pytest'" not in res.stderr
    rec = json.loads((tmp_path / "out" / "records.json").read_text())
    assert rec["sections"]["correctness"]["status"] == "ok", rec["sections"]["correctness"]
    assert len(rec["sections"]["correctness"]["rows"]) > 40


def test_a_health_run_killed_at_the_budget_is_cut_never_ok(tmp_path, monkeypatch):
    """Issue 82: a fairseq-train run still going when the budget ends (its loss finite and falling so
    far) is reported as cut, the section as cut; a NaN logged before the kill stays a failure."""
    import gpu_check

    falling = "".join(f'train_inner | {{"num_updates": "{u}", "loss": "{9 - u}"}}\n' for u in range(1, 6))
    nan = 'train_inner | {"num_updates": "1", "loss": "nan"}\n'
    logs = iter([falling, nan])
    monkeypatch.setattr(gpu_check, "prepare_data", lambda work, a: work)
    monkeypatch.setattr(gpu_check, "HEALTH", {k: gpu_check.HEALTH[k] for k in list(gpu_check.HEALTH)[:1]})
    monkeypatch.setattr(gpu_check, "run_procs", lambda cmds, logs_, timeout, env: [(None, next(logs)) for _ in cmds])
    a = gpu_check.argparse.Namespace(tiny=False, health_parallel=2, reserve=1.0, health_updates=300, cpu=False)
    sec = gpu_check.Section("health")
    gpu_check.section_health(sec, a, gpu_check.torch.device("cpu"), gpu_check.Budget(600), tmp_path)
    loss = {r["item"]: r for r in sec.rows if r["measure"].startswith("loss first")}
    fp16, bf16 = (loss[f"{next(iter(gpu_check.HEALTH))} {p}"] for p in ("fp16", "bf16"))
    assert fp16["ok"] is None and fp16["cut"] and fp16["falling"] and fp16["finite"]
    assert bf16["ok"] is False and not bf16["finite"]
    assert sec.status == "cut (budget)"
    table = gpu_check.table({"machine": {"device": "cpu", "torch": "x"}, "tiny": False, "date": "d", "elapsed_s": 1,
                             "budget_s": 1, "command": "c", "sections": {"health": sec.as_dict()}})
    assert "| health | - | cut (budget) |" in table and "| cut |" in table


def test_every_lease_call_fits_the_64_mib_lease():
    """Issue 82 §1: each prepared call sends the tracked checkout plus the packs it names (at their
    recorded sizes); each must stay under ~60 MiB of the device tool's 64 MiB."""
    import gpu_check
    import gpu_check_lease as lease

    tracked = lease.tracked_bytes()
    assert tracked > 1 * lease.MIB  # the checkout was measured, not assumed
    for call in lease.CALLS:
        mib = lease.call_mib(call, tracked)
        assert mib <= lease.LIMIT_MIB, f"{call.name} sends {mib:.1f} MiB (tracked {tracked / lease.MIB:.1f} + packs)"
        assert set(call.sections) <= set(gpu_check.SECTIONS)
        assert call.budget + 60 < call.timeout_s <= 600  # the command's own timeout ends inside the tool's
        for f in call.carry:
            assert f.startswith(lease.PACK_DIR + "/") and f"--sections {' '.join(call.sections)}" in call.command()
    # every section runs in exactly one call; health first, DESDAR and CTranslate2 last in their own call
    done = [s for c in lease.CALLS for s in c.sections]
    assert sorted(done) == sorted(gpu_check.SECTIONS)
    assert lease.CALLS[0].sections == ("health",) and set(lease.CALLS[-1].sections) == {"desdar", "ct2"}
    assert [c.name for c in lease.CALLS if "ct2" in c.packs] == [lease.CALLS[-1].name]
    # two calls and a machine's start fit one session's 15 minutes of device time
    assert lease.CALLS[0].timeout_s + lease.CALLS[1].timeout_s + 120 <= 900
    # the README gives every call's carry and timeout_s as the plan has them
    readme = (REPO / "benchmarks" / "results" / "gpu" / "README.md").read_text()
    for call in lease.CALLS:
        assert call.command() in readme and f"timeout_s {call.timeout_s}" in readme, call.name
        assert json.dumps(call.carry) in readme


def test_the_lease_packs_are_ignored_so_they_travel_only_when_carried():
    """The packs travel as carried (ignored) paths: .lease/ must be ignored, or it would travel twice."""
    import gpu_check_lease as lease

    res = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", f"{lease.PACK_DIR}/fairseq.tar.xz"])
    assert res.returncode == 0


def test_lease_setup_unpacks_a_pack_and_writes_console_script_shims(tmp_path, monkeypatch):
    """What a call runs first on the lent machine: the pack's files into the site folder, and a shim per
    console script (the packs' entry points and the checkout's pyproject) that runs with its arguments."""
    import io
    import lzma
    import tarfile

    import gpu_check_lease as lease

    repo = tmp_path / "repo"
    (repo / lease.PACK_DIR).mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n[project.scripts]\ndeepnmt-fake = "fakemod:main"\n')
    files = {"fakemod/__init__.py": "import sys\ndef main():\n    print('shim ok', sys.argv[0], sys.argv[1:])\n",
             "fake-1.0.dist-info/entry_points.txt": "[console_scripts]\nfake-cmd = fakemod:main\n",
             "fakemod/examples/big.bin": "left out"}
    with lzma.open(repo / lease.PACK_DIR / "fake.tar.xz", "wb") as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    monkeypatch.setattr(lease, "REPO", repo)
    monkeypatch.setitem(lease.PACKS, "fake", lease.Pack("fake", (), (), (), 0.1))
    site = tmp_path / "site"
    assert lease.setup(["fake"], site) == 0  # its check imports torch, fairseq and the plugin (CI has them)
    for script in ("fake-cmd", "deepnmt-fake"):
        out = subprocess.run([str(site / "bin" / script), "a", "b c"], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(site)})
        assert out.stdout.strip() == f"shim ok {script} ['a', 'b c']", out.stderr
    monkeypatch.setitem(lease.PACKS, "gone", lease.Pack("gone", (), (), (), 0.1))
    assert lease.setup(["gone"], site) == 2  # a pack not carried: says which file and how to make it


def test_the_planner_row_compares_the_planners_prediction_with_a_measured_peak():
    """Issue 81's row of the device check: the planner's predicted bytes for the step against the
    measured peak, as a ratio; a planner failure is recorded as a skip of that row, not a crash."""
    import gpu_check

    a = types.SimpleNamespace(tiny=True)
    p = gpu_check.shape(a)
    arch, flags, tiny_flags, _ = gpu_check.ARCHS["MSC-72 (msc_iwslt_72l)"]
    sec = gpu_check.Section("memory")
    gpu_check.planner_row(sec, "MSC-72", (arch, [*flags, *tiny_flags]), p, 50 * 2**20, device="cpu")
    (row,) = sec.rows
    assert row["reference"] == 50.0 and row["ours"] > 0
    assert row["ratio"] == pytest.approx(row["ours"] / row["reference"], rel=1e-9)
    gpu_check.planner_row(sec, "broken", ("no_such_arch", []), p, 1.0, device="cpu")
    assert sec.skipped and sec.skipped[-1]["item"] == "broken (planner)" and "error" in sec.skipped[-1]["why"]
