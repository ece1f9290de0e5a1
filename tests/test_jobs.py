"""The one job model (deepnmt_fairseq/jobs): the cluster policy's loud failures, the runner's waiting
for rank 0 (timeout, a failed rank-0 step ends the others), the dataset check before any process
group, the DDP backend from the model's options, and SKD on every GPU of rank 0's node."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from deepnmt_fairseq.jobs import cluster, runner as job_runner
from deepnmt_fairseq.jobs.stage import Action, Completion, Inputs, JobError, Stage, Training
from deepnmt_fairseq.repro import commands
from deepnmt_fairseq.repro.registry import EXPERIMENTS

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


# ------------------------------------------------------------------ loud failures of the GPU path
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_without_a_gpu_is_an_error_naming_what_was_detected(precision):
    launch = cluster.make_launch("local", env=NO_GPU)
    with pytest.raises(cluster.ClusterError) as err:
        cluster.check_devices(launch, precision)
    msg = str(err.value)
    assert f"--{precision} needs a GPU" in msg and "CUDA_VISIBLE_DEVICES=''" in msg and "--cpu" in msg
    with pytest.raises(cluster.ClusterError, match="--cpu was given"):
        cluster.check_devices(cluster.make_launch("local", cpu=True, env=NO_GPU), precision)
    # a GPU that the job's torch sees: fine (tests/test_cluster_ops.py: one it does not see)
    cluster.check_devices(cluster.make_launch("local", env={"CUDA_VISIBLE_DEVICES": "0"}), precision, torch_count=1)
    cluster.check_devices(launch, None)  # one local CPU process without --fp16: allowed (it says so)


@pytest.mark.parametrize("launcher, env, where", [
    ("torchrun", {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, "under torchrun"),
    ("slurm", {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "MASTER_ADDR": "n1"}, "as a Slurm task"),
])
def test_a_rank_without_a_gpu_is_an_error_unless_cpu_is_asked_for(launcher, env, where):
    launch = cluster.make_launch(launcher, env={**env, **NO_GPU})
    with pytest.raises(cluster.ClusterError) as err:
        cluster.check_devices(launch)
    assert where in str(err.value) and "no GPU was detected (CUDA_VISIBLE_DEVICES='')" in str(err.value)
    assert "add --cpu" in str(err.value)
    on_purpose = cluster.make_launch(launcher, cpu=True, env={**env, **NO_GPU})
    cluster.check_devices(on_purpose)
    assert "--distributed-backend" in on_purpose.fairseq_flags() and "gloo" in on_purpose.fairseq_flags()


def test_the_registry_refuses_a_gpu_less_rank_before_any_command(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(job_runner.Runner, "tee", lambda self, argv, log: started.append(argv) or 0)
    exp = EXPERIMENTS["msc-iwslt14-ende-6L"]
    launch = cluster.make_launch("torchrun", env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **NO_GPU})
    opts = commands.RunOptions(paths=commands.Paths(tmp_path / "data", tmp_path / "ck"), launch=launch)
    with pytest.raises(commands.ReproError, match="under torchrun"):
        commands.run_steps(commands.Planner(EXPERIMENTS, exp, opts).plan(), launch)
    local = cluster.make_launch("local", env=NO_GPU)
    opts = commands.RunOptions(paths=commands.Paths(tmp_path / "data", tmp_path / "ck"), launch=local, precision="fp16")
    with pytest.raises(commands.ReproError, match="--fp16 needs a GPU"):
        commands.run_steps(commands.Planner(EXPERIMENTS, exp, opts).plan(), local)
    assert not started


# ------------------------------------------------------------------ the dataset, before any process group
def test_a_missing_or_mismatched_dataset_names_deepnmt_prepare_data(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(job_runner.Runner, "tee", lambda self, argv, log: started.append(argv) or 0)
    exp = EXPERIMENTS["msc-iwslt14-ende-6L"]
    paths = commands.Paths(tmp_path / "data", tmp_path / "ck")
    opts = commands.RunOptions(paths=paths, launch=cluster.make_launch("local", env=NO_GPU))
    steps = commands.Planner(EXPERIMENTS, exp, opts).plan()
    with pytest.raises(commands.ReproError) as err:
        commands.run_steps(steps, opts.launch)
    assert f"deepnmt-prepare-data {exp.dataset} --data-root {tmp_path / 'data'}" in str(err.value)
    assert "no binarized data" in str(err.value)
    bin_dir = tmp_path / "data" / exp.dataset / "bin"  # another pair's data where this one's should be
    bin_dir.mkdir(parents=True)
    for name in ("dict.fr.txt", "dict.en.txt", "train.fr-en.fr.idx"):
        (bin_dir / name).write_text("")
    with pytest.raises(commands.ReproError) as err:
        commands.run_steps(steps, opts.launch)
    assert "dict.de.txt" in str(err.value) and "fr-en" in str(err.value) and "deepnmt-prepare-data" in str(err.value)
    assert not started, "a command started before the dataset was checked"
    for name in ("dict.de.txt", "train.en-de.en.idx"):
        (bin_dir / name).write_text("")
    cluster.check_dataset(bin_dir, "en", "de", exp.dataset)  # complete now


# ------------------------------------------------------------------ rank 0's steps
def _launch(rank: int) -> cluster.Launch:
    return cluster.make_launch("torchrun", cpu=True, env={"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
                                                          **NO_GPU})


def _two_ranks(stages, monkeypatch, timeout="30"):
    monkeypatch.setattr(job_runner, "WAIT_POLL", 0.02)
    monkeypatch.setenv("DEEPNMT_RANK0_TIMEOUT", timeout)
    errors = {}

    def rank_main(rank):
        try:
            job_runner.Runner("test", echo=lambda line: None, launch=_launch(rank), in_process=False).run(stages)
        except JobError as err:
            errors[rank] = str(err)

    t0 = time.time()
    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return errors, time.time() - t0


def test_a_failed_rank0_step_ends_the_other_ranks_with_its_error(tmp_path, monkeypatch):
    """Rank 0's averaging fails (a command that exits 3): rank 1, waiting for it, stops at once with
    rank 0's error naming the step (before: it polled every 30 s until the walltime)."""
    avg = Stage("train/average", ["python3", "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"],
                tmp_path / "checkpoint_avg5.pt", kind="average", rank0_only=True)
    errors, took = _two_ranks([avg], monkeypatch)
    assert "train/average" in errors[0] and "exit 3" in errors[0]
    assert "rank 0 failed at stage train/average" in errors[1] and "exit 3" in errors[1]
    assert took < 15
    assert avg.failed_file().exists()


def test_a_rank_waits_for_rank0_at_most_the_timeout_and_names_the_step(tmp_path, monkeypatch):
    monkeypatch.setattr(job_runner, "WAIT_POLL", 0.02)
    monkeypatch.setenv("DEEPNMT_RANK0_TIMEOUT", "0.3")
    skd = Stage("skd/skd", ["deepnmt-skd"], tmp_path / "bin" / ".done", kind="skd", rank0_only=True)
    # a failure marker of an earlier job (another job id) does not count
    skd.failed_file().parent.mkdir(parents=True)
    skd.failed_file().write_text('{"job": "TORCHELASTIC_RUN_ID=an-earlier-job", "stage": "skd/skd", "error": "x"}')
    t0 = time.time()
    with pytest.raises(JobError) as err:
        job_runner.Runner("test", echo=lambda line: None, launch=_launch(1)).run([skd])
    assert time.time() - t0 < 5
    assert "rank 0's step skd/skd did not finish within 0 s ($DEEPNMT_RANK0_TIMEOUT)" in str(err.value)


def test_rank0_timeout_reads_its_variable():
    assert cluster.rank0_timeout({}) == cluster.DEFAULT_RANK0_TIMEOUT
    assert cluster.rank0_timeout({"DEEPNMT_RANK0_TIMEOUT": "90"}) == 90.0
    with pytest.raises(cluster.ClusterError, match="DEEPNMT_RANK0_TIMEOUT"):
        cluster.rank0_timeout({"DEEPNMT_RANK0_TIMEOUT": "soon"})


# ------------------------------------------------------------------ DDP backend from the model's options
def test_ddp_backend_comes_from_the_models_options():
    assert cluster.ddp_backend("dd_base_27_27_cad", []) == "legacy_ddp"  # CAD 0 < p < 1 by the name's defaults
    assert cluster.ddp_backend("dd_base_27_27_cad", ["--cad-drop-ratio", "0"]) == "c10d"
    assert cluster.ddp_backend("dd_base_27_27", []) == "c10d"
    assert cluster.ddp_backend("dd_base_27_27", ["--gp-group-size", "2"]) == "legacy_ddp"
    assert cluster.ddp_backend("dd_base_27_27", ["--ssl-rate", "0.1"]) == "legacy_ddp"
    assert cluster.ddp_backend("dd_base_27_27", [], criterion="collapse_reducing") == "legacy_ddp"
    assert cluster.ddp_backend("dd_base_27_27", [], cpu_processes=2) == "legacy_ddp"


# ------------------------------------------------------------------ SKD on every GPU of the job
def _plan(name, launch):
    opts = commands.RunOptions(paths=commands.Paths(Path("/d"), Path("/c")), launch=launch)
    return commands.Planner(EXPERIMENTS, EXPERIMENTS[name], opts).plan()


def test_skd_uses_every_gpu_of_rank0s_node_and_the_student_waits_for_all_shards():
    def skd_jobs(launch):
        (skd,) = [s for s in _plan("gpkd-wmt14-ende-24L", launch) if s.kind == "skd"]
        argv = skd.argv
        return argv[argv.index("--jobs") + 1] if "--jobs" in argv else None

    assert skd_jobs(cluster.Launch(world_size=8, gpus_found=8)) == "8"
    four = cluster.make_launch("torchrun", env={"WORLD_SIZE": "8", "RANK": "0", "LOCAL_RANK": "0",
                                                "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert skd_jobs(four) == "4"  # rank 0's node: 4 GPUs
    assert skd_jobs(cluster.Launch(world_size=1, gpus_found=1)) is None
    assert skd_jobs(cluster.make_launch("local", env=NO_GPU)) is None
    # the student trains on the SKD data only once deepnmt-skd wrote its .done (after every shard)
    steps = _plan("gpkd-wmt14-ende-24L-gpkd", cluster.Launch(world_size=8, gpus_found=8))
    student = [s for s in steps if s.kind == "train"][-1]
    (skd_done,) = [n for n in student.needs if n.parent.name == "bin"]
    assert skd_done.name == ".done" and skd_done.parent.parent.name == "skd"
    assert student.argv[1] == str(skd_done.parent)  # it trains on that corpus
    assert all(s.rank0_only for s in steps if s.kind in ("average", "skd", "extract"))


# ------------------------------------------------------------------ through the console script
def test_deepnmt_repro_train_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """The loud failures reach the user as ``deepnmt-repro: error: ...`` (exit 1), before any command."""
    from deepnmt_cli.repro import main

    started = []
    monkeypatch.setattr(job_runner.Runner, "tee", lambda self, argv, log: started.append(argv) or 0)
    for key in ("DEEPNMT_DATA", "DEEPNMT_CHECKPOINTS", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    roots = ["--data-root", str(tmp_path / "data"), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["train", "msc-iwslt14-ende-6L", "--launcher", "torchrun", *roots]) == 1
    err = capsys.readouterr().err
    assert "deepnmt-repro: error: started under torchrun (rank 0 of 2) but no GPU was detected" in err
    assert "Traceback" not in err
    assert main(["train", "msc-iwslt14-ende-6L", "--gpus", "0", *roots]) == 1
    err = capsys.readouterr().err
    assert f"`deepnmt-prepare-data iwslt14-en-de --data-root {tmp_path / 'data'}`" in err
    assert not started


def test_distillations_default_training_flags_are_the_registrys_gpkd_recipe():
    """deepnmt-distill's default student flags are read from the registry's GPKD recipe (written once);
    their text is what it always was."""
    from deepnmt_fairseq.distill import plan

    assert plan.DEFAULT_TRAIN_ARGS == (
        "--optimizer adam --adam-betas (0.9,0.997) --lr 0.002 --lr-scheduler inverse_sqrt --warmup-updates 16000 "
        "--warmup-init-lr 1e-07 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 "
        "--update-freq 2 --attention-dropout 0.1 --activation-dropout 0.1")
    row = _plan("gpkd-wmt14-ende-24L", cluster.Launch(world_size=8, gpus_found=8))[0].argv  # the row, 8 GPUs
    default = plan.DEFAULT_TRAIN_ARGS.split()
    for flag in ("--lr", "--warmup-updates", "--warmup-init-lr", "--max-tokens", "--update-freq",
                 "--attention-dropout", "--activation-dropout"):
        assert row[row.index(flag) + 1] == default[default.index(flag) + 1], flag


# ------------------------------------------------------------------ the runner itself
def _py(code):
    return ["python3", "-c", code]


def test_a_stage_is_built_from_flat_keywords_into_its_parts(tmp_path):
    out, need, log = tmp_path / "out", tmp_path / "in" / ".done", tmp_path / "train.log"
    batch = {"tokens_per_update": 8, "effective_tokens_per_update": 8}
    st = Stage("s", ["fairseq-train", 7], out, marker=True, log=log, what="train it", kind="train", rank0_only=True,
               needs=[need], batch=batch, history=True, ok_if_output=True)
    assert (st.name, st.kind, st.what) == ("s", "train", "train it")
    assert st.action == Action(["fairseq-train", 7], log=log, rank0_only=True)
    assert st.completion == Completion(out, marker=True, ok_if_output=True)
    assert st.inputs == Inputs([need]) and st.training == Training(batch, history=True)
    assert (st.argv, st.output, st.needs, st.batch, st.rank0_only) == (["fairseq-train", 7], out, [need], batch, True)
    assert st.command() == ["fairseq-train", "7"] and st.done_file() == out / ".done" and not st.is_done()
    (out / ".done").parent.mkdir()
    (out / ".done").touch()
    assert st.is_done() and st.failed_file() == out / ".done.failed"
    skd = Stage("skd", lambda: ["deepnmt-skd"], out / "bin", done=out / "bin" / ".done")
    assert skd.done_file() == out / "bin" / ".done" and skd.command() == ["deepnmt-skd"] and skd.needs == []
    assert Stage("avg", [], tmp_path / "avg.pt").done_file() == tmp_path / "avg.pt"  # written atomically

def test_runner_skips_done_stages_checks_first_and_names_the_failing_stage(tmp_path):
    lines = []
    runner = job_runner.Runner("t", echo=lines.append, in_process=False)
    out = tmp_path / "a"
    a = Stage("a", _py(f"import os; os.makedirs({str(out)!r}, exist_ok=True); print('epoch 001 | loss 3.2')"), out,
              marker=True, log=tmp_path / "a.log", kind="train")
    checked = []
    b = Stage("b", _py("import sys; print('Traceback: boom'); sys.exit(4)"), tmp_path / "b.txt", log=tmp_path / "b.log",
              preflight=lambda: checked.append("b"))
    with pytest.raises(job_runner.RunError) as err:
        runner.run([a, b])
    assert checked == ["b"]  # before stage a ran: the checks come first
    assert "stage b" in str(err.value) and "exit 4" in str(err.value) and "Traceback: boom" in str(err.value)
    assert (out / ".done").exists() and "epoch 001" in (tmp_path / "a.log").read_text()
    assert any("epoch 001" in ln for ln in lines)  # progress lines echoed
    runner.ran.clear()
    with pytest.raises(job_runner.RunError):
        runner.run([a, b])
    assert runner.ran == [] and any("stage 1/2 a: done earlier" in ln for ln in lines)


def test_a_runner_starts_its_commands_the_way_it_is_handed(tmp_path):
    """``Runner(start=...)``: every command of a stage is started by ``start(cmd, log)`` (the evidence
    study's launcher), a done stage is still skipped, a done-marker the command did not write is an error,
    and a failure names the stage with ``returncode`` kept for the caller."""
    started = []

    def start(cmd, log):
        started.append((cmd[1:], log))
        if cmd[-1] == "write":
            Path(cmd[-2]).write_text("ok")
            return 0
        return 0 if cmd[-1] == "silent" else 7

    r = job_runner.Runner("t", echo=None, in_process=False, start=start)
    out = tmp_path / "out.txt"
    a = Stage("a", ["python", str(out), "write"], out, log=tmp_path / "a.log")
    r.run([a])
    assert started == [([str(out), "write"], tmp_path / "a.log")] and r.returncode == 0
    r.run([a])  # done: skipped, nothing started
    assert len(started) == 1
    with pytest.raises(job_runner.RunError, match="finished without writing"):
        r.run([Stage("b", ["python", "x", "silent"], tmp_path / "never")])
    with pytest.raises(job_runner.RunError, match=r"stage c: python failed \(exit 7\)"):
        r.run([Stage("c", ["python", "x", "fail"], tmp_path / "never", log=tmp_path / "no-such.log")])
    assert r.returncode == 7


def test_a_failing_preflight_runs_nothing(tmp_path):
    ran = tmp_path / "ran"

    def refuse():
        raise cluster.ClusterError("no data")

    st = Stage("a", _py(f"open({str(ran)!r}, 'w')"), ran, preflight=refuse)
    with pytest.raises(cluster.ClusterError, match="no data"):
        job_runner.Runner("t", echo=lambda line: None, in_process=False).run([st])
    assert not ran.exists()


def test_the_command_line_layer_hands_the_runner_its_quick_commands(tmp_path, monkeypatch):
    """The runner runs a quick command in this process only when deepnmt_cli registered it (the library
    never imports deepnmt_cli); it gets the command's arguments, and a non-zero exit is a failed stage."""
    import deepnmt_cli
    from deepnmt_cli import average_checkpoints, extract_student

    monkeypatch.setattr(job_runner, "IN_PROCESS", {})
    deepnmt_cli.in_process_commands()
    assert job_runner.IN_PROCESS == {"deepnmt-average-checkpoints": average_checkpoints.main,
                                     "deepnmt-extract-student": extract_student.main}
    calls = []

    def fake_main(argv):
        calls.append(argv)
        Path(argv[-1]).write_text("averaged")
        return 0

    job_runner.IN_PROCESS["deepnmt-average-checkpoints"] = fake_main
    out = tmp_path / "avg.pt"
    st = Stage("average", ["deepnmt-average-checkpoints", "--inputs", tmp_path, "--output", out], out)
    job_runner.Runner("t", echo=lambda line: None).run([st])
    assert calls == [["--inputs", str(tmp_path), "--output", str(out)]] and out.read_text() == "averaged"
    job_runner.IN_PROCESS["deepnmt-average-checkpoints"] = lambda argv: 2
    with pytest.raises(job_runner.RunError, match="deepnmt-average-checkpoints failed \\(exit 2\\)"):
        job_runner.Runner("t", echo=lambda line: None).run([Stage("average", ["deepnmt-average-checkpoints"],
                                                                  tmp_path / "other.pt")])


def test_settings_guard_refuses_other_settings_naming_the_flag(tmp_path):
    job_runner.settings_guard(tmp_path, {"lr": 1, "seed": 1})
    job_runner.settings_guard(tmp_path, {"lr": 1, "seed": 1})  # the same: resume
    with pytest.raises(job_runner.RunError, match=r'"lr": \{"then": 1, "now": 2\}.*--work-dir'):
        job_runner.settings_guard(tmp_path, {"lr": 2, "seed": 1})
    # a setting added later reads as its default (None) in an older stamp
    job_runner.settings_guard(tmp_path, {"lr": 1, "seed": 1, "pairs": None}, missing_as_default=True)
    with pytest.raises(SystemExit, match="pairs"):
        job_runner.settings_guard(tmp_path, {"lr": 1, "seed": 1, "pairs": 5}, error=SystemExit,
                                  missing_as_default=True)
