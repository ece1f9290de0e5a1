"""GPKD run the way Li et al. (2021) run it (issue 13).

Fast: the extraction group size is tied to the teacher's GP group size (refusal, override
recorded); ``--keep-training-state`` averages; the rules over the whole registry (extraction h =
the teacher's GP h, baseline rows without GP, skipping runs continue a converged model without
skipping, progressive compression GP-trains every compressed model with h = 2).
Slow: the one-command pipeline at tiny size: plain teacher, GP teacher h = 2 in two stages
(skipping off, then on from stage 1's averaged weights and schedule), SKD, extraction h = 2,
student; and the refusal of a mismatched h on the plain teacher.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepnmt_fairseq.checkpoint_averaging import average, save_atomic
from deepnmt_fairseq.modules.student_extraction import extract
from deepnmt_fairseq.repro import registry as reg
from deepnmt_fairseq.repro.spec import ExtractStage

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ extraction h
def _state(enc=8, dec=6, enc_h=None, dec_h=None):
    """A teacher checkpoint dict as fairseq writes it (cfg.model records the GP group sizes)."""
    args = argparse.Namespace(encoder_layers=enc, decoder_layers=dec, deep_memory="top")
    if enc_h is not None:
        args.gp_group_size = enc_h
    if dec_h is not None:
        args.gp_decoder_group_size = dec_h
    model = {f"encoder.layers.{i}.w": torch.full((2,), float(i)) for i in range(enc)}
    model.update({f"decoder.layers.{i}.w": torch.full((2,), 100.0 + i) for i in range(dec)})
    model["encoder.embed_tokens.weight"] = torch.ones(3, 2)
    return {"cfg": {"model": args}, "model": model, "extra_state": {"train_iterator": {}}}


def test_extraction_h_must_equal_the_teachers_gp_h():
    with pytest.raises(ValueError) as err:
        extract(_state(enc_h=8), 2)
    msg = str(err.value)
    for words in ("--encoder-group-size 2", "--gp-group-size 8", "Li et al. 2021", "h = N/M",
                  "--allow-group-size-mismatch"):
        assert words in msg, words
    # the teacher's own h: no complaint, the sizes are recorded
    info = extract(_state(enc_h=8), 8)["extra_state"]["gpkd_student"]
    assert info["teacher_gp_group_size"] == {"encoder": 8, "decoder": 1}
    assert info["group_size"] == {"encoder": 8, "decoder": 1} and "group_size_override" not in info
    # decoder side (DESDAR): GP h=6 teaches one decoder layer to stand for six
    with pytest.raises(ValueError, match="--decoder-group-size 2 .*--gp-decoder-group-size 6"):
        extract(_state(enc_h=1, dec_h=6), 1, 2)
    assert extract(_state(dec_h=6), 1, 6)["cfg"]["model"].decoder_layers == 1
    # explicit layer lists imply the group size and are checked the same way
    with pytest.raises(ValueError, match="--encoder-group-size 4"):
        extract(_state(enc_h=8), enc_select=[0, 5])
    # a teacher trained without GP (old checkpoints have no gp_* field): h = 1
    with pytest.raises(ValueError, match="trained without GP"):
        extract(_state(), 2)


def test_override_is_written_into_the_student():
    student = extract(_state(enc_h=8, dec_h=6), 2, 2, allow_group_size_mismatch=True)
    info = student["extra_state"]["gpkd_student"]
    assert info["group_size_override"] == {"encoder": {"teacher_gp": 8, "extracted": 2},
                                           "decoder": {"teacher_gp": 6, "extracted": 2}}
    assert student["cfg"]["model"].encoder_layers == 4 and student["cfg"]["model"].decoder_layers == 3
    assert student["cfg"]["model"].gp_group_size == 1  # the student trains without GP unless told


def test_extract_cli_refuses_and_records_the_override(tmp_path, capsys):
    from deepnmt_cli import extract_student

    teacher = tmp_path / "t.pt"
    torch.save(_state(enc=4, dec=2, enc_h=2), teacher)
    out = tmp_path / "s.pt"
    assert extract_student.main(["--teacher", str(teacher), "--encoder-group-size", "4", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "--encoder-group-size 4" in err and "--gp-group-size 2" in err and not out.exists()
    assert extract_student.main(["--teacher", str(teacher), "--encoder-group-size", "4", "--output", str(out),
                                 "--allow-group-size-mismatch"]) == 0
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint

    info = load_checkpoint(str(out))["extra_state"]["gpkd_student"]
    assert info["group_size_override"] == {"encoder": {"teacher_gp": 2, "extracted": 4}}
    assert info["teacher"] == str(teacher)


# ------------------------------------------------------------------------------ averaging with state
def test_average_keeps_the_newest_training_state_only_when_asked(tmp_path):
    paths = []
    for i, w in enumerate((1.0, 3.0)):
        state = {"model": {"w": torch.full((2,), w)}, "last_optimizer_state": {"step": i},
                 "optimizer_history": [{"num_updates": 10 * (i + 1)}], "extra_state": {"epoch": i}}
        paths.append(str(tmp_path / f"c{i}.pt"))
        save_atomic(state, paths[-1])
    plain = average(paths)
    assert "last_optimizer_state" not in plain and torch.equal(plain["model"]["w"], torch.full((2,), 2.0))
    resume = average(paths, keep_training_state=True)
    assert resume["last_optimizer_state"] == {"step": 1}  # the newest input's
    assert resume["optimizer_history"][-1]["num_updates"] == 20
    assert torch.equal(resume["model"]["w"], plain["model"]["w"])
    save_atomic({"model": {"w": torch.ones(2)}}, str(tmp_path / "no-state.pt"))
    with pytest.raises(ValueError, match="no optimizer state"):
        average([str(tmp_path / "no-state.pt")], keep_training_state=True)


# ------------------------------------------------------------------------------ registry rules
def _flags(stage):
    f = list(stage.model_flags)
    return {k: f[i + 1] for i, k in enumerate(f) if k.startswith("--") and i + 1 < len(f)
            and not f[i + 1].startswith("--")}


def _gp(stage):
    f = _flags(stage)
    return int(f.get("--gp-group-size", 1)), int(f.get("--gp-decoder-group-size", 1))


def _skips(stage):
    f = _flags(stage)
    return float(f.get("--ssl-rate", 0)) > 0 or float(f.get("--encoder-layerdrop", 0)) > 0


def _target(exp, ref):
    e = reg.EXPERIMENTS[ref.experiment] if ref.experiment else exp
    return e, e.stage(ref.stage)


GPKD_EXPS = {n: e for n, e in reg.EXPERIMENTS.items() if e.paper == reg.GPKD}


def test_every_extraction_uses_the_h_its_teacher_was_gp_trained_with():
    n = 0
    for name, exp in reg.EXPERIMENTS.items():
        for stage in exp.stages:
            if not isinstance(stage, ExtractStage):
                continue
            n += 1
            _, teacher = _target(exp, stage.teacher)
            enc_h, dec_h = _gp(teacher)
            if stage.encoder_group_size > 1:
                assert enc_h == stage.encoder_group_size, (name, stage.name, enc_h)
            if stage.decoder_group_size > 1:
                assert dec_h == stage.decoder_group_size, (name, stage.name, dec_h)
    assert n >= 11  # Table 1 (3), Table 2 (1), Table 6 (4), progressive (3)


def test_progressive_compression_gp_trains_every_stage_with_h_2():
    exp = reg.EXPERIMENTS["gpkd-wmt14-ende-6-6-progressive"]
    depths = []
    for stage in exp.stages:
        if isinstance(stage, ExtractStage):
            t_exp, teacher = _target(exp, stage.teacher)
            layers = int(_flags(teacher).get("--encoder-layers", re.search(r"_(\d+)_", teacher.arch).group(1)))
            depths.append(layers)
            assert stage.encoder_group_size == 2 and _gp(teacher)[0] == 2
    assert depths == [48, 24, 12]
    assert exp.stages[-1].arch == "rpr_base_6_6"


BASELINE = re.compile(r"^(Deep-RPR-(24|48)L|Big-RPR-(6|12)L|Base-RPR(-6L)?|Base|Deep)( \(|$)")


def test_gpkd_baseline_rows_are_trained_without_gp():
    seen = set()
    for t in reg.TABLES:
        if t.paper != reg.GPKD or t.key in ("gpkd-t6",):
            continue
        for r in t.rows:
            if r.experiment and BASELINE.match(r.label):
                exp = reg.EXPERIMENTS[r.experiment]
                assert all(_gp(s) == (1, 1) and not _skips(s) for s in exp.train_stages), (t.key, r.label)
                seen.add(r.experiment)
    assert {"gpkd-wmt14-ende-24L", "gpkd-wmt14-ende-48L", "gpkd-wmt14-ende-big-12L", "gpkd-wmt14-ende-base-6L"} <= seen
    # the GP-trained teachers are rows of their own
    rows = {r.experiment for t in reg.TABLES for r in t.rows}
    for name in ("gpkd-wmt14-ende-24L-teacher", "gpkd-wmt14-ende-48L-teacher", "gpkd-wmt14-ende-big-12L-teacher"):
        assert name in rows and _gp(reg.EXPERIMENTS[name].stages[0]) != (1, 1)


def test_skipping_runs_continue_a_converged_model_without_skipping():
    """Two-stage training: every skipping stage either is a Table 4 'Scratch' run or continues
    (optimizer, schedule, update count: --continue-once) the averaged model of an early-stopped
    stage trained without skipping."""
    n_two_stage = 0
    for name, exp in GPKD_EXPS.items():
        for stage in exp.train_stages:
            if not _skips(stage) or stage.data is not None:
                continue
            if "scratch" in name:
                assert stage.init is None, name
                continue
            assert stage.init is not None and stage.init[0] == "continue", name
            assert stage.init[1].what == "resume", name  # averaged weights + training state
            _, first = _target(exp, stage.init[1])
            assert not _skips(first), name
            assert first.recipe.patience > 0 and stage.recipe.patience > 0, name  # "until it converges"
            # Table 3: the two stages share the Deep schedule's 50K updates (--continue-once keeps the count)
            assert first.recipe.max_update == stage.recipe.max_update == 50000, name
            assert _gp(first) == _gp(stage), name  # GP teachers keep their group sizes in both stages
            n_two_stage += 1
    assert n_two_stage >= 9  # Tables 3-5 (6) and the three Table 6 teachers (issue 37)


def test_table_3_to_5_compare_against_the_plain_teacher():
    for key in ("gpkd-t3", "gpkd-t4", "gpkd-t5"):
        t = next(t for t in reg.TABLES if t.key == key)
        deep = [r for r in t.rows if r.label.startswith("Deep-RPR-48L")]
        assert [r.experiment for r in deep] == ["gpkd-wmt14-ende-48L"], key


def test_dry_run_of_every_gpkd_experiment():
    from deepnmt_fairseq.repro import commands

    paths = commands.Paths(Path("/data"), Path("/ck"))
    opts = commands.RunOptions(paths=paths, launch=commands.Launch(world_size=8, gpus_found=8))
    for name, exp in GPKD_EXPS.items():
        steps = commands.Planner(reg.EXPERIMENTS, exp, opts).plan()
        for step in steps:
            if step.kind == "train" and "--continue-once" in step.argv:
                resume = step.argv[step.argv.index("--continue-once") + 1]
                assert resume.endswith(".resume.pt"), name
                avg = [s for s in steps if s.kind == "average" and str(s.out) == resume]
                assert avg and "--keep-training-state" in avg[0].argv, name
            if step.kind == "train" and "--patience" in step.argv:
                assert step.argv[step.argv.index("--patience") + 1] == str(reg.GPKD_PATIENCE)
            if step.kind == "extract":  # the extraction h is the GP h on the teacher's own command line
                teacher_train = [s for s in commands.Planner(
                    reg.EXPERIMENTS, reg.EXPERIMENTS[exp.stage(step.stage).teacher.experiment or name], opts).plan()
                    if s.kind == "train" and s.stage == exp.stage(step.stage).teacher.stage][0].argv
                for side, gp_flag in (("encoder", "--gp-group-size"), ("decoder", "--gp-decoder-group-size")):
                    h = step.argv[step.argv.index(f"--{side}-group-size") + 1]
                    if h != "1":
                        assert teacher_train[teacher_train.index(gp_flag) + 1] == h, (name, step.stage, side)
    # every deep-decoder sweep plans too (the figures' points are ordinary experiments)
    from deepnmt_fairseq.repro import figures

    for key in ("dd-fig1", "dd-fig2", "dd-fig3", "dd-fig4"):
        for name in figures.experiments_of(figures.FIGURES[key]):
            steps = commands.Planner(reg.EXPERIMENTS, reg.EXPERIMENTS[name], opts).plan()
            assert [s.kind for s in steps] == ["train"], name


# ------------------------------------------------------------------------------ end to end (tiny)
@pytest.mark.slow
def test_pipeline_plain_gp_two_stage_skd_extract_student(data_bin, tmp_path):
    """scripts/gpkd_pipeline.py at tiny size: plain teacher; GP teacher h=2, stage 1 without
    skipping, stage 2 with skipping from stage 1's averaged weights and schedule; SKD from the
    averaged teacher; extraction with h=2; student.  Then the refusal of h=4 on the plain teacher."""
    from deepnmt_fairseq.checkpoint_safety import load_checkpoint
    from deepnmt_cli import extract_student

    work = tmp_path / "gpkd"
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpkd_pipeline.py"), "--tiny", "--data", str(data_bin),
         "--work-dir", str(work), "--teacher-arch", "rpr_base_6_6", "--encoder-group-size", "2",
         "--ssl-rate", "0.4", "--plain-baseline", "--no-eval", "--patience", "0"],
        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    plain = load_checkpoint(str(work / "baseline" / "checkpoint_last.pt"))
    s1 = load_checkpoint(str(work / "teacher-stage1" / "checkpoint_last.pt"))
    s2 = load_checkpoint(str(work / "teacher-stage2" / "checkpoint_last.pt"))
    assert plain["cfg"]["model"].gp_group_size == 1
    # stage 1: GP h=2, skipping off; stage 2: GP h=2, skipping on
    assert (s1["cfg"]["model"].gp_group_size, s1["cfg"]["model"].ssl_rate) == (2, 0.0)
    assert "encoder.ssl_active" not in s1["model"]
    assert (s2["cfg"]["model"].gp_group_size, s2["cfg"]["model"].ssl_rate) == (2, 0.4)
    assert bool(s2["model"]["encoder.ssl_active"])
    # stage 2 starts from stage 1's averaged weights with its training state: the resume file is the
    # average of stage 1's last two checkpoints, with the newest one's optimizer state and update count
    resume = work / "teacher-stage1" / "checkpoint_avg2.resume.pt"
    r = load_checkpoint(str(resume))
    sources = r["averaged_from"]
    assert len(sources) == 2 and all(Path(p).parent == work / "teacher-stage1" for p in sources)
    expect = average(sources)["model"]
    assert all(torch.equal(r["model"][k], expect[k]) for k in expect)
    assert not all(torch.equal(r["model"][k], s1["model"][k]) for k in expect)  # not the last checkpoint
    n1 = s1["optimizer_history"][-1]["num_updates"]
    assert r["last_optimizer_state"] is not None and r["optimizer_history"][-1]["num_updates"] == n1
    log2 = (work / "teacher-stage2" / "train.log").read_text()
    assert re.search(rf"[Ll]oaded checkpoint {re.escape(str(resume))} \(epoch \d+ @ {n1} updates\)", log2), log2[-2000:]
    assert s2["optimizer_history"][-1]["num_updates"] == 8 > n1  # the update count (and schedule) went on
    # inverse_sqrt after the warm-up (--tiny: peak 0.002 at 4 updates) at update 8: 0.002 * sqrt(4 / 8), not a
    # second warm-up (a restarted run would be at its peak 0.002 after 4 updates)
    lrs = [float(m) for m in re.findall(r"\| train \| epoch \d+ \|.*\| num_updates 8 \| lr ([0-9.e-]+)", log2)]
    assert lrs and abs(lrs[-1] - 0.002 * (4 / 8) ** 0.5) < 1e-6, lrs
    # SKD from the averaged final teacher; extraction with the teacher's h
    assert (work / "skd-bin" / ".done").exists()
    init = load_checkpoint(str(work / "student-init.pt"))
    info = init["extra_state"]["gpkd_student"]
    assert info["teacher"] == str(work / "teacher-stage2" / "checkpoint_avg2.pt")
    assert info["teacher_gp_group_size"]["encoder"] == 2 and info["group_size"]["encoder"] == 2
    assert "group_size_override" not in info
    assert (init["cfg"]["model"].encoder_layers, init["cfg"]["model"].decoder_layers) == (2, 1)
    assert (work / "student" / ".done").exists()
    slog = (work / "student" / "train.log").read_text()
    assert "loading pretrained model from" in slog and "student-init.pt" in slog
    # the plain teacher was not GP-trained: extracting h=2 from it is refused, unless asked
    out = tmp_path / "from-plain.pt"
    args = ["--teacher", str(work / "baseline" / "checkpoint_last.pt"), "--encoder-group-size", "2",
            "--output", str(out)]
    assert extract_student.main(args) == 1 and not out.exists()
    assert extract_student.main(args + ["--allow-group-size-mismatch"]) == 0
    over = load_checkpoint(str(out))["extra_state"]["gpkd_student"]["group_size_override"]
    assert over == {"encoder": {"teacher_gp": 1, "extracted": 2}}
