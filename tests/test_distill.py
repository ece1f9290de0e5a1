"""deepnmt-distill and the one GPKD planner (deepnmt_fairseq/distill/).

Plan-level tests (the h rule, the two teacher stages, the checks before any work) run no
training; the end-to-end tests run the command at --tiny size on the synthetic corpus, for an
MSC teacher (student from scratch) and a GP teacher (extraction from the averaged teacher)."""

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

from fairseq_helpers import TINY, train

from deepnmt_fairseq.distill.plan import (PlanError, averaged_path, extraction_group_sizes, model_flags_from_cfg,
                                          teacher_stages, build_student)
from deepnmt_fairseq.distill.run import RunError, settings_guard


def _opt(argv, flag):
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------- the planner, no training
def test_h_rule_reads_the_teachers_gp_group_sizes():
    assert extraction_group_sizes(argparse.Namespace(gp_group_size=4, gp_decoder_group_size=1)) == (4, 1)
    assert extraction_group_sizes(argparse.Namespace(gp_group_size=2, gp_decoder_group_size=3)) == (2, 3)
    assert extraction_group_sizes(argparse.Namespace()) == (1, 1)  # trained without GP


def test_two_stage_teacher_continues_stage_one_state(tmp_path):
    stages, teacher = teacher_stages(tmp_path, "DATA", "deepnmt_transformer", ["--encoder-layers", "8"], 4, 1, ["--cpu"],
                                     stage1_updates=100, stage2_updates=300, average=5, ssl_rate=0.4)
    names = [s.name for s in stages]
    assert names == ["teacher-stage1", "teacher-stage1-average", "teacher-stage2", "teacher-average"]
    s1, avg1, s2, avg2 = stages
    assert _opt(s1.argv, "--gp-group-size") == "4" and "--ssl-rate" not in s1.argv and "--patience" in s1.argv
    # stage 2 starts from stage 1's *averaged* model with its optimizer state and schedule
    assert "--keep-training-state" in avg1.argv and _opt(avg1.argv, "--inputs") == str(tmp_path / "teacher-stage1")
    assert _opt(s2.argv, "--continue-once") == str(avg1.output) == str(averaged_path(s1.output, 5, True))
    assert "--finetune-from-model" not in s2.argv
    assert _opt(s2.argv, "--ssl-rate") == "0.4" and _opt(s2.argv, "--gp-group-size") == "4"
    assert _opt(s2.argv, "--max-update") == "300"
    # the teacher model is the average of its last stage
    assert teacher == avg2.output and _opt(avg2.argv, "--inputs") == str(s2.output)
    assert "--keep-training-state" not in avg2.argv


def test_restart_schedule_and_ssl_from_scratch(tmp_path):
    stages, _ = teacher_stages(tmp_path, "D", "a", [], 2, 1, [], 10, 20, 3, ssl_rate=0.4, restart_schedule=True)
    s2 = stages[2]
    assert _opt(s2.argv, "--finetune-from-model") == str(stages[1].output)
    assert "--keep-training-state" not in stages[1].argv and "--continue-once" not in s2.argv
    stages, teacher = teacher_stages(tmp_path, "D", "a", [], 2, 1, [], 10, 20, 3, ssl_rate=0.4, ssl_from_scratch=True)
    assert [s.name for s in stages] == ["teacher-stage1", "teacher-average"]
    assert _opt(stages[0].argv, "--ssl-rate") == "0.4" and _opt(stages[0].argv, "--gp-group-size") == "2"
    with pytest.raises(PlanError, match="--ssl-from-scratch needs --ssl-rate"):
        teacher_stages(tmp_path, "D", "a", [], 2, 1, [], 10, 20, 3, ssl_from_scratch=True)
    # one stage, no GP: no --gp flags; average 1 means checkpoint_last.pt
    stages, teacher = teacher_stages(tmp_path, "D", "a", [], 1, 1, [], 10, 20, 1)
    assert len(stages) == 1 and "--gp-group-size" not in stages[0].argv
    assert teacher == tmp_path / "teacher-stage1" / "checkpoint_last.pt"


def test_model_flags_rebuild_the_teachers_model():
    flags = [*TINY, "--encoder-layers", "3", "--decoder-layers", "2", "--no-token-positional-embeddings",
             "--rpr-max-relative-position", "4", "--post-norm", "--gp-group-size", "3"]
    model, args = build_student("deepnmt_transformer", flags, 40)
    again = model_flags_from_cfg(args, "deepnmt_transformer")
    assert _opt(again, "--rpr-max-relative-position") == "4" and "--post-norm" in again
    rebuilt, args2 = build_student("deepnmt_transformer", again, 40)
    a, b = model.state_dict(), rebuilt.state_dict()
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    assert args2.gp_group_size == 3 and args2.post_norm and args2.encoder_layers == 3


def test_gpkd_stages_the_whole_procedure(tmp_path):
    """GP teacher (two stages) -> averaged teacher -> SKD from it -> extraction with the teacher's h ->
    student from the extracted weights, with the extracted depth and no GP/skipping -> its average."""
    from deepnmt_fairseq.checkpoint_averaging import save_atomic
    from deepnmt_fairseq.modules.student_extraction import extract
    from deepnmt_fairseq.distill.plan import gpkd_stages

    flags = [*TINY, "--encoder-layers", "4", "--decoder-layers", "2"]
    stages, paths = gpkd_stages(tmp_path, "DATA", "deepnmt_transformer", flags, 2, 1, ["--cpu"], stage1_updates=10,
                                stage2_updates=20, student_updates=30, average=2, ssl_rate=0.3, device=["--cpu"])
    by = {s.name: s for s in stages}
    assert list(by) == ["teacher-stage1", "teacher-stage1-average", "teacher-stage2", "teacher-average", "skd",
                        "extract", "student", "student-average"]
    assert _opt(by["skd"].command(), "--teacher") == str(by["teacher-average"].output) == str(paths["teacher"])
    assert _opt(by["extract"].command(), "--teacher") == str(paths["teacher"])
    assert _opt(by["extract"].command(), "--encoder-group-size") == "2"  # h = the teacher's GP h
    # the student's flags come from the extracted checkpoint, read when its stage starts
    model, args = build_student("deepnmt_transformer", [*flags, "--gp-group-size", "2", "--ssl-rate", "0.3"], 40)
    save_atomic(extract({"cfg": {"model": args}, "model": model.state_dict()}, 2, 1, "first"), str(paths["student_init"]))
    argv = by["student"].command()
    assert _opt(argv, "--encoder-layers") == "2" and _opt(argv, "--decoder-layers") == "2"
    assert _opt(argv, "--gp-group-size") == "1" and _opt(argv, "--ssl-rate") == "0.0"  # a plain student
    assert _opt(argv, "--finetune-from-model") == str(paths["student_init"])
    assert argv[1] == str(paths["skd"]) and _opt(argv, "--max-update") == "30"
    assert _opt(by["student-average"].command(), "--inputs") == str(paths["student_dir"])


def test_registry_gpkd_rows_run_the_planners_commands(monkeypatch):
    """The registry's GPKD rows (deepnmt-repro) build their averaging, SKD and extraction commands with
    the one planner: a change there changes the registry's commands, and the rows keep the procedure
    (SKD and extraction read the *averaged* teacher, extraction uses the teacher's own GP h, stage 2
    continues from an average that keeps the training state)."""
    from deepnmt_fairseq.distill import plan as gpkd_plan
    from deepnmt_fairseq.repro import commands as C
    from deepnmt_fairseq.repro.registry import EXPERIMENTS

    def steps(name):
        opts = C.RunOptions(paths=C.Paths.from_env(), launch=C.make_launch("local", 8, None, None, None, None, False))
        return C.Planner(EXPERIMENTS, EXPERIMENTS[name], opts).plan()

    student = {s.kind: s for s in steps("gpkd-wmt14-ende-48L-gpkd")}
    assert _opt(student["extract"].argv, "--encoder-group-size") == "8"  # Table 1: 48 -> 6, the teacher's h
    teacher_row = EXPERIMENTS["gpkd-wmt14-ende-48L-teacher"]
    assert "8" == _opt(list(teacher_row.stage("train").model_flags), "--gp-group-size")
    assert _opt(student["extract"].argv, "--teacher") == student["average"].out.as_posix()
    skd = {s.kind: s for s in steps("gpkd-wmt14-ende-48L-teacher")}["skd"]
    assert _opt(skd.argv, "--teacher").endswith("checkpoint_avg5.pt")
    ssl = [s for s in steps("gpkd-wmt14-ende-48L-ssl") if s.kind in ("average", "train")]
    assert "--keep-training-state" in ssl[0].argv and _opt(ssl[1].argv, "--continue-once") == str(ssl[0].out)

    calls = []
    for fn in ("average_stage", "skd_stage", "extract_stage"):
        real = getattr(gpkd_plan, fn)
        monkeypatch.setattr(gpkd_plan, fn, lambda *a, _real=real, _fn=fn, **k: calls.append(_fn) or _real(*a, **k))
    steps("gpkd-wmt14-ende-48L-gpkd"), steps("gpkd-wmt14-ende-48L-teacher")
    assert {"average_stage", "skd_stage", "extract_stage"} <= set(calls)


def test_settings_guard_refuses_other_settings(tmp_path):
    settings_guard(tmp_path, {"seed": 1, "teacher": "t.pt"})
    settings_guard(tmp_path, {"seed": 1, "teacher": "t.pt"})  # same settings: resume
    with pytest.raises(RunError, match="other settings.*seed"):
        settings_guard(tmp_path, {"seed": 2, "teacher": "t.pt"})


# ---------------------------------------------------------------- teachers (tiny, trained once)
@pytest.fixture(scope="module")
def teachers(data_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    msc = root / "msc"
    train(data_bin, msc, "deepnmt_transformer", [*TINY, "--deep-memory", "msc", "--msc-block-layers", "2",
                                                  "--decoder-layers", "2"], max_update=4)
    gp = root / "gp"  # GP-trained, RPR-only (exportable), interval checkpoints to average
    train(data_bin, gp, "deepnmt_transformer", [*TINY, "--encoder-layers", "4", "--decoder-layers", "2",
                                                 "--gp-group-size", "2", "--no-token-positional-embeddings",
                                                 "--rpr-max-relative-position", "4", "--save-interval-updates", "1"],
          max_update=4)
    return {"msc": msc / "checkpoint_last.pt", "gp": gp}


def _distill(data_bin, work, teacher, *extra, raw=None):
    from deepnmt_cli.distill import main

    raw = raw or Path(data_bin).parent / "raw"
    return main(["--teacher", str(teacher), "--data", str(data_bin), "--work-dir", str(work),
                 "--test-source", str(raw / "test.src"), "--test-reference", str(raw / "test.tgt"), "--tiny", "--cpu",
                 *extra])


def test_transparent_teacher_reaches_deployment_through_a_plain_student(data_bin, tmp_path):
    """A transparent-attention teacher is refused by the exporter; its distillation plan is accepted:
    the student is a plain pre-norm model of its width, started from its matching tensors."""
    from fairseq.data import Dictionary

    from deepnmt_fairseq.deploy.export import refusals
    from deepnmt_fairseq.distill.pipeline import DistillConfig, plan_distillation

    vocab = len(Dictionary.load(str(data_bin / "dict.tgt.txt")))
    flags = [*TINY, "--encoder-layers", "4", "--decoder-layers", "2", "--deep-memory", "transparent"]
    model, args = build_student("deepnmt_transformer", flags, vocab)
    assert any("transparent attention" in why for why in refusals(model.eval(), args))
    args.arch = "deepnmt_transformer"
    teacher = tmp_path / "transparent.pt"
    torch.save({"cfg": {"model": args, "task": {"data": str(data_bin)}}, "model": model.state_dict()}, teacher)
    plan = plan_distillation(DistillConfig(work=tmp_path / "w", data=data_bin, teacher=teacher, average=1,
                                           student_updates=4, cpu=True))
    assert plan.init == "teacher" and "--deep-memory" not in plan.student_flags
    assert _opt(plan.student_flags, "--encoder-layers") == "4" and _opt(plan.student_flags, "--encoder-embed-dim") == "16"
    assert [s.name for s in plan.stages] == ["skd", "transfer", "student", "export"]  # average 1: checkpoint_last
    assert not (tmp_path / "w").exists()  # planning writes nothing


def test_missing_teacher_names_the_flag(data_bin, tmp_path, capsys):
    assert _distill(data_bin, tmp_path / "w", tmp_path / "nope.pt") == 2
    assert "--teacher" in capsys.readouterr().err and not (tmp_path / "w").exists()


def test_teacher_with_another_dictionary_is_refused(data_bin, teachers, tmp_path, capsys):
    same_size = tmp_path / "bin-swapped"  # the same number of words, two of them swapped
    shutil.copytree(data_bin, same_size)
    lines = (same_size / "dict.tgt.txt").read_text().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    (same_size / "dict.tgt.txt").write_text("\n".join(lines) + "\n")
    raw = Path(data_bin).parent / "raw"
    assert _distill(same_size, tmp_path / "w1", teachers["msc"], raw=raw) == 2
    err = capsys.readouterr().err
    assert "--teacher" in err and "dict.tgt.txt" in err and "differs" in err
    bigger = tmp_path / "bin-bigger"
    shutil.copytree(data_bin, bigger)
    for lang in ("src", "tgt"):
        with open(bigger / f"dict.{lang}.txt", "a") as f:
            f.write("extraword 1\n")
    assert _distill(bigger, tmp_path / "w2", teachers["msc"], raw=raw) == 2
    err = capsys.readouterr().err
    assert "--teacher" in err and "vocabulary has" in err and "dict.src.txt" in err


def test_student_that_cannot_be_extracted_or_exported_is_refused_before_training(data_bin, teachers, tmp_path, capsys):
    # an MSC teacher was not GP-trained: nothing to extract
    assert _distill(data_bin, tmp_path / "w1", teachers["msc"], "--student-init", "extract") == 2
    assert "--student-init extract" in capsys.readouterr().err
    # an extracted student's depth is the teacher's N / h, not a flag
    assert _distill(data_bin, tmp_path / "w2", teachers["gp"], "--student-encoder-layers", "3") == 2
    assert "--student-encoder-layers" in capsys.readouterr().err
    # a student the exporter refuses: refused before the SKD data or any training
    work = tmp_path / "w3"
    assert _distill(data_bin, work, teachers["msc"], "--student-args", "--deep-memory transparent") == 2
    err = capsys.readouterr().err
    assert "refused before any training" in err and "transparent attention" in err
    assert not (work / "skd-bin").exists() and not (work / "student").exists()


@pytest.mark.slow
def test_msc_teacher_to_served_student_end_to_end(data_bin, teachers, tmp_path, capsys):
    work = tmp_path / "msc"
    assert _distill(data_bin, work, teachers["msc"]) == 0
    out = capsys.readouterr().out
    rep = json.loads((work / "report" / "report.json").read_text())
    systems = rep["systems"]
    assert set(systems) == {"teacher fairseq-generate", "student fairseq-generate", "student deepnmt-translate"}
    n = rep["test"]["sentences"]
    assert n == len((Path(data_bin).parent / "raw" / "test.src").read_text().splitlines())
    for name, s in systems.items():
        assert s["batched"]["tokens_per_s"] > 0 and s["single"]["tokens_per_s"] > 0, name
        assert 0 < s["single"]["sentences"] < n  # an evenly spread subset, one at a time
        assert "signature" in s and isinstance(s["sacrebleu"], float)
    assert systems["student deepnmt-translate"]["batched"]["sentences"] == n
    assert "inter_threads 2 x intra_threads 1" in systems["student deepnmt-translate"]["batched"]["setting"]
    threads = systems["teacher fairseq-generate"]["single"]["setting"]
    # --tiny: no settings search; every core's torch threads, or 1 on a machine loaded at the start
    from deepnmt_fairseq.machine import cores

    assert threads in (f"fairseq-generate, {cores()} torch threads, one sentence at a time",
                       "fairseq-generate, 1 torch thread, one sentence at a time"), threads
    assert rep["settings_search"]["teacher fairseq-generate"] == {"batched": [], "single": []}
    # speed by the protocol (issue 78), --tiny: one interleaved round of one pass, not a claim
    sm, speed = rep["summary"], rep["speed"]
    for kind in ("batched", "single"):
        lo, hi = sm[f"speedup_{kind}_interval"]
        assert sm[f"speedup_{kind}_claim"] == lo <= sm[f"speedup_{kind}"] <= hi + 0.01
        assert [len(speed[kind]["runs"][who]) for who in ("teacher", "student")] == [1, 1]
    assert speed["protocol"]["repeats"] == 1 and sm["speed_meets_protocol"] is False
    assert isinstance(rep["machine"]["vector_extensions"], list) and rep["machine"]["cpu"]
    assert (work / "report" / "tuning.json").exists()
    assert rep["sizes"]["student"]["parameters"] < rep["sizes"]["teacher"]["parameters"]
    assert rep["sizes"]["served"]["quantization"] == "int8"
    md = (work / "report" / "report.md").read_text()
    assert "teacher fairseq-generate" in md and ("loaded machine" in md)
    # an MSC teacher is not GP-trained: a pre-norm student of its width and depths, started from
    # every teacher tensor of the same name and shape (all of its own; MSC's context paths dropped)
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    init = load_checkpoint(str(work / "student-init.pt"))
    info = init["extra_state"]["distill_init"]
    assert info["copied"] == info["tensors"] > 0 and info["not_copied"] == []
    teacher = load_checkpoint(str(teachers["msc"]))["model"]
    assert torch.equal(init["model"]["encoder.layers.0.fc1.weight"], teacher["encoder.layers.0.fc1.weight"])
    assert not any("context_attn" in k for k in init["model"])
    log = (work / "student" / "train.log").read_text()
    assert "--deep-memory" not in log.split("\n", 3)[1] and "--finetune-from-model" in log
    assert "stage 1/6 skd" in out
    # a re-run does nothing; other settings are refused and destroy nothing
    assert _distill(data_bin, work, teachers["msc"]) == 0
    again = capsys.readouterr().out
    assert "$ fairseq-train" not in again and "$ fairseq-generate" not in again
    assert again.count("done earlier") == 6  # skd, transfer, student, its average, export, report
    assert _distill(data_bin, work, teachers["msc"], "--seed", "2") == 1
    assert "other settings" in capsys.readouterr().err
    assert json.loads((work / "report" / "report.json").read_text()) == rep
    # --vmap on the same work directory (issue 78): the same student, exported again with the vocabulary
    # shortlist into its own directory and reported into report-vmap; nothing retrained, the first
    # export and report kept
    assert _distill(data_bin, work, teachers["msc"], "--vmap") == 0
    again = capsys.readouterr().out
    import re

    assert "$ fairseq-train" not in again and re.search(r"\$ deepnmt-export-ct2 .*ct2-int8-vmap.* --vmap", again)
    assert again.count("done earlier") == 4  # skd, transfer, student, its average
    assert (work / "ct2-int8-vmap" / "vmap.txt").is_file() and not (work / "ct2-int8" / "vmap.txt").exists()
    short = json.loads((work / "report-vmap" / "report.json").read_text())
    assert short["sizes"]["served"]["shortlist"] is True and rep["sizes"]["served"]["shortlist"] is False
    assert short["sizes"]["served"]["model"] == str(work / "ct2-int8-vmap")
    assert "int8 with the vocabulary shortlist" in (work / "report-vmap" / "report.md").read_text()
    assert json.loads((work / "report" / "report.json").read_text()) == rep


@pytest.mark.slow
def test_gp_teacher_extraction_from_the_averaged_teacher(data_bin, teachers, tmp_path, capsys):
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    work = tmp_path / "gp"
    assert _distill(data_bin, work, teachers["gp"]) == 0
    avg = work / "teacher-avg2.pt"
    assert len(load_checkpoint(str(avg))["averaged_from"]) == 2  # the averaged teacher...
    assert f"teacher={avg}" in (work / "skd-bin" / ".done").read_text()  # ...made the SKD data
    init = load_checkpoint(str(work / "student-init.pt"))
    info = init["extra_state"]["gpkd_student"]
    assert info["group_size"] == {"encoder": 2, "decoder": 1}  # h = the teacher's GP h
    assert info["teacher_gp_group_size"]["encoder"] == 2 and len(info["encoder_layers"]) == 2
    log = (work / "student" / "train.log").read_text()
    assert f"--finetune-from-model {work / 'student-init.pt'}" in log
    meta = json.loads((work / "ct2-int8" / "deepnmt_export.json").read_text()) if (
        work / "ct2-int8" / "deepnmt_export.json").exists() else None
    rep = json.loads((work / "report" / "report.json").read_text())
    assert rep["sizes"]["teacher"]["checkpoint"] == str(avg)
    assert meta is None or meta["encoder_layers"] == 2
    assert torch.is_tensor(init["model"]["encoder.layers.1.fc1.weight"])
    assert "encoder.layers.2.fc1.weight" not in init["model"]


# ---------------------------------------------------------------- a registry row as the teacher
ROW = "msc-iwslt14-ende-6L"  # MSC, IWSLT shape (the paper's Table 2 6-layer model)


@pytest.fixture(scope="module")
def row_roots(data_bin, tmp_path_factory):
    """A data root holding the row's dataset (iwslt14-en-de): the tiny corpus under the row's language names."""
    from fairseq_helpers import preprocess_pair

    root = tmp_path_factory.mktemp("row")
    raw = Path(data_bin).parent / "raw"
    for split in ("train", "valid", "test"):
        for old, new in (("src", "en"), ("tgt", "de")):
            shutil.copy(raw / f"{split}.{old}", root / f"{split}.{new}")
    preprocess_pair(root, root / "data" / "iwslt14-en-de" / "bin", "en", "de")
    return root


def _distill_row(roots, work, *extra, repro=""):
    from deepnmt_cli.distill import main

    return main(["--teacher-row", ROW, "--repro-args", f"--cpu --data-root {roots / 'data'} --checkpoint-root "
                 f"{roots / 'ckpt'} {repro}", "--work-dir", str(work), "--test-source", str(roots / "test.en"),
                 "--test-reference", str(roots / "test.de"), "--tiny", "--cpu", "--average", "1", *extra])


def test_registry_row_teacher_refuses_a_student_it_cannot_export_before_training(row_roots, tmp_path, capsys):
    assert _distill_row(row_roots, tmp_path / "w", "--student-init", "scratch", "--student-args",
                        "--deep-memory msc") == 2
    err = capsys.readouterr().err
    assert "cannot be exported to CTranslate2 exactly, refused before any training" in err
    assert not (row_roots / "ckpt").exists()  # the row was not trained
    assert _distill_row(row_roots, tmp_path / "w2", "--dry-run") == 0
    plan = capsys.readouterr().out
    assert f"1. teacher-row: deepnmt-repro train {ROW} --stage train --cpu" in plan
    assert f"--data {row_roots / 'data' / 'iwslt14-en-de' / 'bin'}" in plan  # the row's data by default
    assert _distill_row(row_roots, tmp_path / "w3", repro="--stage train") == 2
    assert "--stage" in capsys.readouterr().err


@pytest.mark.slow
def test_registry_row_trained_then_distilled_and_reused(row_roots, tmp_path, capsys):
    """--teacher-row trains the row with deepnmt-repro (its recipe and architecture, here cut to 2 updates
    and width 32 by fairseq-train flags after '--'), distils it, and a re-run reuses the trained row."""
    short = ("-- --max-update 2 --update-freq 1 --max-tokens 1024 --encoder-embed-dim 32 --decoder-embed-dim 32 "
             "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64")
    work = tmp_path / "w"
    assert _distill_row(row_roots, work, repro=short) == 0
    out = capsys.readouterr().out
    row_dir = row_roots / "ckpt" / ROW
    assert (row_dir / ".done").exists() and (row_dir / "checkpoint_last.pt").is_file()
    log = (work / "teacher-row.log").read_text()
    assert "--arch msc_iwslt_6l" in log  # the row's own architecture and recipe
    rep = json.loads((work / "report" / "report.json").read_text())
    assert rep["sizes"]["teacher"]["checkpoint"] == str(row_dir / "checkpoint_last.pt")
    assert "stage 1/6 teacher-row" in out and "--encoder-embed-dim 32" in log
    # another distillation of the same row reuses it (the plan shows it done; nothing is trained)
    assert _distill_row(row_roots, tmp_path / "again", "--dry-run", repro=short) == 0
    again = capsys.readouterr().out
    assert "1. teacher-row (done)" in again and "trained earlier" in again


# ---------------------------------------------------------------- scripts/gpkd_pipeline.py: a thin wrapper
def _gpkd_dry_run(tmp_path, *extra):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, str(repo / "scripts" / "gpkd_pipeline.py"), "--dry-run", "--tiny",
                           "--data", str(tmp_path / "data"), "--work-dir", str(tmp_path / "w"), "--teacher-arch",
                           "rpr_base_6_6", "--encoder-group-size", "2", *extra], capture_output=True, text=True,
                          timeout=300)


def test_gpkd_pipeline_restart_schedule_and_ssl_from_scratch(tmp_path):
    """scripts/gpkd_pipeline.py plans with deepnmt_fairseq.distill.plan (its options pass through):
    two-stage skipping continues stage 1's averaged state; --restart-schedule warms up again from
    stage 1's plain average; --ssl-from-scratch is one stage with skipping from update 0."""
    def stages(res):
        assert res.returncode == 0, res.stderr[-3000:]
        return {ln.split(":", 1)[0].split(". ", 1)[1]: ln for ln in res.stdout.splitlines() if ". " in ln[:4]}

    two = stages(_gpkd_dry_run(tmp_path, "--ssl-rate", "0.4"))
    assert list(two) == ["teacher-stage1", "teacher-stage1-average", "teacher-stage2", "teacher-average", "skd",
                         "extract", "student", "student-average"]
    assert "--keep-training-state" in two["teacher-stage1-average"] and "--continue-once" in two["teacher-stage2"]
    restart = stages(_gpkd_dry_run(tmp_path, "--ssl-rate", "0.4", "--restart-schedule"))
    assert "--keep-training-state" not in restart["teacher-stage1-average"]
    assert "--finetune-from-model" in restart["teacher-stage2"] and "--continue-once" not in restart["teacher-stage2"]
    scratch = stages(_gpkd_dry_run(tmp_path, "--ssl-rate", "0.4", "--ssl-from-scratch"))
    assert "teacher-stage2" not in scratch and "--ssl-rate 0.4" in scratch["teacher-stage1"]
    bad = _gpkd_dry_run(tmp_path, "--ssl-from-scratch")
    assert bad.returncode != 0 and "--ssl-from-scratch needs --ssl-rate" in bad.stderr


def test_report_runs_each_engine_with_its_own_thread_environment(tmp_path, monkeypatch):
    """fairseq-generate gets its setting's torch threads (OMP_NUM_THREADS); deepnmt-translate gets
    OMP_NUM_THREADS=1 and its threads as its own flags: with 2 in its environment its one-sentence
    decoding measured 10x slower."""
    import subprocess

    from deepnmt_fairseq.distill import report

    runs = {}

    def fake_run(cmd, stdout, stderr, env):
        runs[Path(cmd[0]).name] = (cmd, env)
        stderr.write("deepnmt-translate: 1 lines, 3 target tokens in 0.1 s (30 tok/s)\n"
                     "Translated 1 sentences (3 tokens) in 0.1s (10.00 sentences/s, 30.00 tokens/s)\n")
        stderr.flush()
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(report.subprocess, "run", fake_run)
    (tmp_path / "src").write_text("a\n")
    r = report.ReportInputs(out=tmp_path / "rep", data=tmp_path, teacher=tmp_path / "t.pt", student=tmp_path / "s.pt",
                            ct2=tmp_path / "ct2", test_source=tmp_path / "src", test_reference=tmp_path / "src")
    m = report.Measure(r, lambda msg: None)
    (tmp_path / "rep" / "student-single.hyp").write_text("x\n")
    m.ct2("student", tmp_path / "src", report.Setting(1, threads=2, inter=1))
    cmd, env = runs["deepnmt-translate"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert cmd[cmd.index("--intra-threads") + 1] == "2" and cmd[cmd.index("--inter-threads") + 1] == "1"
    assert cmd[cmd.index("--batch-size") + 1] == "1"
    (tmp_path / "rep" / "teacher-batched.generate.txt").write_text("")
    m.fairseq("teacher", tmp_path / "t.pt", report.Setting(128, threads=1))
    cmd, env = runs["fairseq-generate"]
    assert env["OMP_NUM_THREADS"] == "1" and cmd[cmd.index("--batch-size") + 1] == "128"
    m.fairseq("teacher", tmp_path / "t.pt", report.Setting(64, threads=2), shards=3, tag="probe")
    cmd, env = runs["fairseq-generate"]
    assert env["OMP_NUM_THREADS"] == "2" and cmd[cmd.index("--distributed-world-size") + 1] == "3"


def test_speed_search_tries_sizes_then_thread_layouts_and_keeps_the_fastest():
    """Each engine's best setting (issue 71): every batch size with the first thread layout, then the
    other layouts at the fastest size; each candidate timed once; the fastest is returned."""
    from deepnmt_fairseq.distill.report import Setting, search

    speed = {(32, 2): 100.0, (64, 2): 180.0, (128, 2): 150.0, (64, 1): 200.0, (32, 1): 999.0}
    timed = []

    def measure(s):
        timed.append((s.batch_size, s.threads))
        return speed[s.batch_size, s.threads]

    best, tried = search(measure, (64, 32, 128, 64), [Setting(0, 2), Setting(0, 1)], "fairseq-generate", log=lambda m: None)
    assert best == Setting(64, 1)  # 1 thread at the fastest size beats 2; (32, 1) is never tried
    assert timed == [(32, 2), (64, 2), (128, 2), (64, 1)]
    assert [t["tokens_per_s"] for t in tried] == [100.0, 180.0, 150.0, 200.0]
    assert tried[-1]["setting"] == "fairseq-generate, 1 torch thread, batches of 64"
    # one candidate (no search): returned without timing it
    assert search(measure, (64,), [Setting(0, 2)], "fairseq-generate") == (Setting(64, 2), [])
    assert len(timed) == 4
    # the slower layout loses: the first layout's best is kept
    speed[64, 1] = 10.0
    best, _ = search(measure, (32, 64, 128), [Setting(0, 2), Setting(0, 1)], "fairseq-generate", log=lambda m: None)
    assert best == Setting(64, 2)
