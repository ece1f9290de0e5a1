"""deepnmt-distill's named student shapes (issue 71): --student NAME resolves to depths and an
initialisation in the command line, and the plan builds that student (DESDAR: the teacher's whole
encoder, one decoder layer, every teacher tensor of the same name and shape copied)."""

from __future__ import annotations

import pytest
import torch

from fairseq_helpers import TINY

from deepnmt_cli import distill as cli


def _parsed(*extra):
    p = cli.build_parser()
    a = p.parse_args(["--teacher", "t.pt", "--data", "d", "--work-dir", "w", "--test-source", "s",
                      "--test-reference", "r", *extra])
    problem = cli.apply_student_preset(p, a)
    if problem:
        raise ValueError(problem)
    return a


def test_presets_resolve_to_depths_and_an_initialisation():
    a = _parsed()
    assert (a.student, a.student_init, a.student_encoder_layers, a.student_decoder_layers, a.student_depth_cap) == \
        ("auto", "auto", None, None, 6)
    a = _parsed("--student", "6-1")
    assert (a.student_init, a.student_encoder_layers, a.student_decoder_layers) == ("teacher", 6, 1)
    a = _parsed("--student", "desdar")
    assert (a.student_encoder_layers, a.student_decoder_layers, a.student_depth_cap) == (None, 1, None)
    a = _parsed("--student", "12-1", "--student-decoder-layers", "2", "--student-init", "scratch")
    assert (a.student_init, a.student_encoder_layers, a.student_decoder_layers) == ("scratch", 12, 2)
    with pytest.raises(ValueError, match="extract"):  # an extracted student's depths are the teacher's N/h
        _parsed("--student", "6-1", "--student-init", "extract")


def _opt(flags, name):
    return flags[flags.index(name) + 1]


@pytest.mark.parametrize("preset, enc, dec", [("desdar", 8, 1), ("6-1", 6, 1), ("auto", 6, 2)])
def test_the_plan_builds_the_presets_student(preset, enc, dec, data_bin, tmp_path):
    from fairseq.data import Dictionary

    from deepnmt_fairseq.distill.pipeline import DistillConfig, plan_distillation
    from deepnmt_fairseq.distill.plan import build_student

    vocab = len(Dictionary.load(str(data_bin / "dict.tgt.txt")))
    model, args = build_student("deepnmt_transformer", [*TINY, "--encoder-layers", "8", "--decoder-layers", "2"],
                                vocab)
    args.arch = "deepnmt_transformer"
    teacher = tmp_path / "teacher.pt"
    torch.save({"cfg": {"model": args, "task": {"data": str(data_bin)}}, "model": model.state_dict()}, teacher)
    a = _parsed("--student", preset)
    plan = plan_distillation(DistillConfig(work=tmp_path / "w", data=data_bin, teacher=teacher, average=1,
                                           student_init=a.student_init, encoder_layers=a.student_encoder_layers,
                                           decoder_layers=a.student_decoder_layers, depth_cap=a.student_depth_cap,
                                           student_updates=4, cpu=True))
    assert plan.init == "teacher"
    assert (_opt(plan.student_flags, "--encoder-layers"), _opt(plan.student_flags, "--decoder-layers")) == \
        (str(enc), str(dec))


def _tiny_teacher(data_bin, tmp_path):
    """A 2-1 deepnmt_transformer checkpoint on ``data_bin`` (and a one-line source file ``tmp_path/src``)."""
    from fairseq.data import Dictionary

    from deepnmt_fairseq.distill.plan import build_student

    vocab = len(Dictionary.load(str(data_bin / "dict.tgt.txt")))
    model, args = build_student("deepnmt_transformer", [*TINY, "--encoder-layers", "2", "--decoder-layers", "1"], vocab)
    args.arch = "deepnmt_transformer"
    teacher = tmp_path / "teacher.pt"
    torch.save({"cfg": {"model": args, "task": {"data": str(data_bin)}}, "model": model.state_dict()}, teacher)
    (tmp_path / "src").write_text("a\n")
    return teacher


def test_no_report_stops_after_the_export(data_bin, tmp_path, capsys):
    """--no-report (students trained side by side, measured later one at a time): the plan ends with
    the export; the same command without it adds the report stage and nothing else."""
    from deepnmt_fairseq.distill import command

    teacher = _tiny_teacher(data_bin, tmp_path)
    stages = {}
    for extra in (["--no-report"], []):
        p = cli.build_parser()
        a = p.parse_args(["--teacher", str(teacher), "--data", str(data_bin), "--work-dir", str(tmp_path / "w"),
                          "--test-source", str(tmp_path / "src"), "--test-reference", str(tmp_path / "src"),
                          "--cpu", "--dry-run", *extra])
        assert not cli.apply_student_preset(p, a)
        assert command.run(a) == 0
        stages[bool(extra)] = [ln.split(":")[0].split(". ", 1)[1] for ln in capsys.readouterr().out.splitlines()
                               if ln[:1].isdigit()]
    assert stages[True][-1] == "export" and "report" not in stages[True]
    assert stages[False] == stages[True] + ["report"]


def test_vmap_exports_and_reports_into_their_own_directories_without_tying_the_work_dir(data_bin, tmp_path, capsys):
    """--vmap (issue 78): the export gets deepnmt-export-ct2 --vmap and ct2-int8-vmap/, the report
    report-vmap/; without it the plain directories; and it is not a setting of the work directory
    (the same student is served with and without the shortlist)."""
    from deepnmt_fairseq.distill import command

    teacher = _tiny_teacher(data_bin, tmp_path)
    work = tmp_path / "w"
    lines = {}
    for extra in ([], ["--vmap"]):
        p = cli.build_parser()
        a = p.parse_args(["--teacher", str(teacher), "--data", str(data_bin), "--work-dir", str(work),
                          "--test-source", str(tmp_path / "src"), "--test-reference", str(tmp_path / "src"),
                          "--cpu", "--dry-run", *extra])
        assert not cli.apply_student_preset(p, a)
        assert command.run(a) == 0
        lines[bool(extra)] = {ln.split(":")[0].split(". ", 1)[1]: ln for ln in capsys.readouterr().out.splitlines()
                              if ln[:1].isdigit()}
    plain, short = lines[False], lines[True]
    assert f"{work / 'ct2-int8-vmap'} " in short["export"] and short["export"].rstrip().endswith("--vmap --force")
    assert f"{work / 'ct2-int8'} " in plain["export"] and "--vmap" not in plain["export"]
    assert {k: v for k, v in short.items() if k not in ("export", "report")} == \
        {k: v for k, v in plain.items() if k not in ("export", "report")}  # the same student
    assert command.report_name(True) == "report-vmap" and command.report_name(False) == "report"
    assert a.vmap and "vmap" not in command.work_dir_settings(vars(a))  # the last command's, with --vmap
    assert command.work_dir_settings({**vars(a), "vmap": False}) == command.work_dir_settings(vars(a))
