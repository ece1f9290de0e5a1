"""The tests' warm interpreters (tests/cli_zygote.py): a console script forked from one behaves as
the same command started fresh (output and where its log goes, exit code, errors, working
directory), sees no plugin it did not ask for, and is stopped at its timeout; a command one cannot
run faithfully (another start-up environment, fork=False, a script not served) is a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cli_zygote
from fairseq_helpers import USER_DIR, run_cli, tiny_model_flags


def _zygote(script):
    argv = [str(Path(sys.executable).with_name(script))]
    return cli_zygote.get(argv, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **os.environ})


def _both(script, *args, **kw):
    """(forked, fresh) runs of one command; asserts that the first went through the warm interpreter."""
    z = _zygote(script)
    before = z.forked
    forked = run_cli(script, *args, check=False, **kw)
    assert z.forked == before + 1
    fresh = run_cli(script, *args, check=False, fork=False, **kw)
    assert z.forked == before + 1  # fork=False: not through the warm interpreter
    return forked, fresh


def _tiny_data(tmp_path):
    (tmp_path / "train.src").write_text("a b c\nb c\n" * 20)
    (tmp_path / "train.tgt").write_text("A B C\nB C\n" * 20)
    forked, _ = _both("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref",
                      "train", "--validpref", "train", "--destdir", "bin", "--joined-dictionary", "--workers", "1",
                      cwd=tmp_path)  # relative paths: the command's working directory
    assert forked.returncode == 0, forked.stderr[-2000:]
    return tmp_path / "bin"


def test_a_forked_command_prints_logs_and_exits_as_a_fresh_one(tmp_path):
    forked, fresh = _both("fairseq-train", "--help")
    assert forked.returncode == fresh.returncode == 0 and forked.stdout == fresh.stdout
    # without --user-dir, the plugin's architectures are unknown, as in a fresh process: the warm
    # interpreter has imported fairseq, not deepnmt_fairseq
    forked, fresh = _both("fairseq-train", "/nonexistent", "--arch", "deepnmt_transformer")
    assert forked.returncode == fresh.returncode == 2
    assert "invalid choice: 'deepnmt_transformer'" in forked.stderr
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    # a real training with the plugin: fairseq-train logs to stdout (its module configures logging
    # before fairseq's own imports do), so forked and fresh logs are on the same stream
    data = _tiny_data(tmp_path)
    args = [data, "--user-dir", USER_DIR, "--arch", "deepnmt_transformer", *tiny_model_flags(), "--optimizer",
            "adam", "--lr", "1e-3", "--max-tokens", "200", "--max-update", "2", "--cpu", "--no-save",
            "--log-format", "json", "--log-interval", "1", "--seed", "1"]
    forked, fresh = _both("fairseq-train", *args)
    assert forked.returncode == fresh.returncode == 0, forked.stderr[-2000:]
    stats = [[{k: d[k] for k in ("num_updates", "loss", "gnorm")} for d in map(json.loads, (
        ln[ln.index("{"):] for ln in r.stdout.splitlines() if "| train_inner |" in ln))] for r in (forked, fresh)]
    assert len(stats[0]) == 2 and stats[0] == stats[1]  # the same losses, printed on stdout by both
    # fairseq-generate logs to stderr (fairseq's imports configure logging first), forked as fresh
    forked, fresh = _both("fairseq-generate", data, "--path", tmp_path / "missing.pt", "--cpu", "--gen-subset", "valid")
    assert forked.returncode == fresh.returncode == 1  # an uncaught exception: its traceback, exit 1
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    assert "missing.pt" in forked.stderr and not forked.stdout.strip() and not fresh.stdout.strip()


def test_a_changed_start_up_environment_or_another_script_runs_fresh(tmp_path, monkeypatch):
    z = _zygote("fairseq-train")
    before = z.forked
    # a variable read at interpreter start (PYTHONWARNINGS) cannot reach a forked command
    assert run_cli("fairseq-train", "--help", env={"PYTHONWARNINGS": "ignore"}).returncode == 0
    assert z.forked == before
    assert cli_zygote.get([str(Path(sys.executable).with_name("deepnmt-user-dir"))], dict(os.environ)) is None
    assert cli_zygote.get(["fairseq-train"], dict(os.environ)) is None  # not this environment's script
    # the test process's own start-up variables changed (fairseq's iterators set PYTHONWARNINGS in
    # the process that builds one with workers): the warm interpreter is started again with them
    monkeypatch.setenv("PYTHONWARNINGS", "ignore:semaphore_tracker:UserWarning")
    again = _zygote("fairseq-train")
    assert again is not z and z.proc.poll() is not None
    assert run_cli("fairseq-train", "--help").returncode == 0 and again.forked == 1


def test_a_command_past_its_timeout_is_killed_and_the_next_one_is_served(tmp_path):
    data = _tiny_data(tmp_path)
    z = _zygote("fairseq-train")
    before = z.forked
    with pytest.raises(subprocess.TimeoutExpired):  # a training that cannot finish in 1 second
        run_cli("fairseq-train", data, "--arch", "transformer", "--max-epoch", "100000", "--optimizer", "adam",
                "--lr", "1e-4", "--max-tokens", "100", "--cpu", "--no-save", timeout=1)
    assert z.forked == before + 1
    assert run_cli("fairseq-train", "--help").returncode == 0 and z.forked == before + 2
