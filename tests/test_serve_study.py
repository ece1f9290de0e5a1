"""benchmarks/serve_study.py (issue 71, target 1): the teacher is the study's best 24-layer record by
valid NLL, retrained by its own recorded command; the table reads each student's report."""

import argparse
import json
from pathlib import Path

import pytest
import serve_study


def test_teacher_is_the_lowest_valid_nll_24_layer_record_and_its_own_command(tmp_path):
    recs = [json.loads(Path(f).read_text()) for f in sorted(serve_study.RECORDS.glob("conv-*-24-s*.json"))]
    name = serve_study.best_teacher_record()
    assert min(r["valid_nll"] for r in recs if r.get("valid_nll") is not None) == \
        json.loads((serve_study.RECORDS / f"{name}.json").read_text())["valid_nll"]
    record = json.loads((serve_study.RECORDS / f"{name}.json").read_text())
    argv = serve_study.teacher_argv(record, tmp_path / "teacher")
    assert argv[0] == "fairseq-train" and argv[argv.index("--save-dir") + 1] == str(tmp_path / "teacher")
    assert "$(deepnmt-user-dir)" not in " ".join(argv) and Path(argv[argv.index("--user-dir") + 1]).is_dir()
    # everything else is the record's command, word for word
    rec_words = record["command"].split()
    assert [w for w in argv if w.startswith("--")] == [w for w in rec_words if w.startswith("--")]
    assert argv[argv.index("--patience") + 1] == rec_words[rec_words.index("--patience") + 1]


def test_students_share_the_study_search_and_differ_only_in_shape(tmp_path):
    argvs = {s: serve_study.distill_argv(s, 3200, tmp_path) for s in serve_study.STUDENTS}
    for s, argv in argvs.items():
        assert argv[argv.index("--beam") + 1] == "4"  # the study's BLEU: beam 4 (study/evaluate.py)
        assert argv[argv.index("--work-dir") + 1] == str(tmp_path / s)
        assert argv[argv.index("--teacher") + 1] == str(tmp_path / "teacher")
        rest = [w for w in argv if w not in serve_study.STUDENTS[s] and w != str(tmp_path / s)]
        assert rest == [w for w in argvs["6-1"] if w not in serve_study.STUDENTS["6-1"] and w != str(tmp_path / "6-1")]
    assert argvs["6-1-scratch"][argvs["6-1-scratch"].index("--student-init") + 1] == "scratch"
    assert serve_study.parse_student("desdar:1600") == ("desdar", 1600) and serve_study.parse_student("6-1") == ("6-1", None)
    for bad in ("7-1", "6-1:many"):
        with pytest.raises(argparse.ArgumentTypeError, match=bad):
            serve_study.parse_student(bad)


def test_table_reads_every_students_report(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    a = argparse.Namespace(students=[("6-1", 3200), ("desdar", 1600)])
    for s, (bleu, tb, ts) in {"6-1": (22.5, 5000.0, 900.0), "desdar": (23.0, 2500.0, 500.0)}.items():
        d = work / s / "report"
        d.mkdir(parents=True)
        sysm = lambda b, x, y: {"sacrebleu": b, "batched": {"tokens_per_s": x}, "single": {"tokens_per_s": y}}  # noqa
        rep = {"systems": {"teacher fairseq-generate": sysm(23.4, 400.0, 60.0), "student fairseq-generate": sysm(bleu, 1, 1),
                           "student deepnmt-translate": sysm(bleu, tb, ts)},
               "summary": {"bleu_served_minus_teacher": round(bleu - 23.4, 2), "speedup_batched": round(tb / 400, 2),
                           "speedup_single": round(ts / 60, 2)},
               "sizes": {"student": {"parameters": 10}, "teacher": {"parameters": 20}}, "loaded_machine": [],
               "machine": {"cpu": "X", "kernels": "AVX2", "cores": 2}, "measured_at": "now"}
        (d / "report.json").write_text(json.dumps(rep))
        (d / "report.md").write_text("r")
    record = {"command": "fairseq-train x", "bleu": 23.42, "valid_nll": 3.75}
    serve_study.write_table(a, work, out, "conv-x-24-s1", record)
    table = json.loads((out / "table.json").read_text())
    assert [r["student"] for r in table["rows"]] == ["6-1", "desdar"]
    assert table["rows"][0]["speedup_batched"] == 12.5 and table["rows"][1]["served_minus_teacher"] == -0.4
    md = (out / "table.md").read_text()
    assert "| 6-1 (3200) | 22.5 (23.4) | -0.90 | 5000 / 400 | 12.5x | 900 / 60 | 15.0x | 10 |" in md
    assert (out / "desdar" / "report.json").exists()


@pytest.mark.slow
def test_frontier_times_every_system_against_the_teacher_with_and_without_the_shortlist(data_bin, tmp_path, monkeypatch):
    """The frontier (issue 78, item 3) on the tiny corpus: a tiny pre-norm teacher distilled at --tiny
    size into work/6-1, then each served system (the student at its report's beam and at beam 1,
    without and with the vocabulary shortlist; a plain 'deep' row, here the teacher exported int8)
    timed against the teacher by the protocol's interleaved runs; the shortlist rows say what the
    shortlist costs the full model, and the shortlisted export exists only for those rows."""
    import shutil

    from deepnmt_cli.distill import main as distill
    from fairseq_helpers import tiny_model_flags, train

    raw = Path(data_bin).parent / "raw"
    study = tmp_path / "study"  # the study's layout: data-bin and tok/test.raw.{en,de}
    (study / "tok").mkdir(parents=True)
    (study / "data-bin").symlink_to(data_bin)
    shutil.copy(raw / "test.src", study / "tok" / "test.raw.en")
    shutil.copy(raw / "test.tgt", study / "tok" / "test.raw.de")
    monkeypatch.setattr(serve_study, "DATA_WORK", study)
    teacher = tmp_path / "teacher"
    train(data_bin, teacher, "deepnmt_transformer", [*tiny_model_flags(), "--encoder-layers", "2",
                                                      "--decoder-layers", "1"], max_update=4)
    work, out = tmp_path / "work", tmp_path / "out"
    assert distill(["--teacher", str(teacher / "checkpoint_last.pt"), "--data", str(data_bin), "--work-dir",
                    str(work / "6-1"), "--test-source", str(raw / "test.src"), "--test-reference", str(raw / "test.tgt"),
                    "--tiny", "--cpu", "--average", "1"]) == 0
    report_beam = json.loads(serve_study.report_of(work, "6-1").read_text())["search"]["beam"]
    # a second student without a report (--reports): its averaged model, served at the first report's setting
    (work / "12-1" / "student").mkdir(parents=True)
    shutil.copy(work / "6-1" / "student" / "checkpoint_last.pt", work / "12-1" / "student" / "checkpoint_avg3.pt")
    shutil.copytree(work / "6-1" / "ct2-int8", work / "12-1" / "ct2-int8")
    a = argparse.Namespace(students=[("12-1", 4), ("6-1", 4)], beams=[1], vmap=True,
                           deep_row=str(teacher / "checkpoint_last.pt"), speed_repeats=1, speed_min_seconds=0.0)
    serve_study.frontier(a, work, out, 2)
    rec = json.loads((out / "frontier.json").read_text())
    rows = rec["rows"]
    beams = sorted({report_beam, 1}, reverse=True)
    assert [(r["student"], r["beam"], r["shortlist"]) for r in rows] == \
        [(s, b, v) for s in ("12-1", "6-1") for v in (False, True) for b in beams] + [("deep-row", report_beam, False)]
    assert len({r["setting"] for r in rows}) == 1  # 12-1 served at 6-1's report's setting
    assert (work / "6-1" / "ct2-int8-vmap" / "vmap.txt").is_file() and not (work / "6-1" / "ct2-int8" / "vmap.txt").exists()
    assert not (work / "deep-row" / "ct2-int8" / "vmap.txt").exists()
    teacher_bleu = {r["teacher_sacrebleu"] for r in rows}
    assert len(teacher_bleu) == 1  # one teacher pass, its BLEU in every row
    for r in rows:
        assert len(r["timed"]["runs"]["teacher"]) == len(r["timed"]["runs"]["student"]) == 1
        assert r["speedup_batched_claim"] == r["speedup_batched_interval"][0] <= r["speedup_batched"]
        assert r["tokens_per_s"] > 0 and r["teacher_tokens_per_s"] > 0 and isinstance(r["sacrebleu"], float)
        cost = r.get("shortlist_cost")
        assert (cost is not None) == r["shortlist"]
        if cost:
            assert 0 <= cost["lost_tokens"] <= cost["tokens"] and cost["lines"] == 10
            assert cost["lost_share"] == round(cost["lost_tokens"] / cost["tokens"], 5)
    assert rows[-1]["parameters"] == json.loads(serve_study.report_of(work, "6-1").read_text())["sizes"]["teacher"]["parameters"]
    # a second call measures nothing again (the rows kept in work/frontier/rows.json) and exports nothing again
    stamps = {d: (work / d / ".done").read_text() for d in ("6-1/ct2-int8-vmap", "deep-row/ct2-int8")}
    serve_study.frontier(a, work, out, 2)
    assert json.loads((out / "frontier.json").read_text())["rows"] == rows
    assert stamps == {d: (work / d / ".done").read_text() for d in stamps}
    table = (out / "frontier.md").read_text()
    assert f"deep-row: `{teacher / 'checkpoint_last.pt'}`" in table
    assert table.count("\n| 6-1 |") == table.count("\n| 12-1 |") == 2 * len(beams) and "| deep-row |" in table and "Command: `" in table


def test_rerun_agreement_compares_the_claims_of_two_tables():
    """The protocol's rerun check on two serve-study tables: each student's lower bounds (batched, one
    sentence) in both runs, within 10% of each other or not; a student or figure missing from one run
    is not compared."""
    def table(*rows):
        return {"rows": [dict(student=s, speedup_batched_claim=b, **({"speedup_single_claim": o} if o else {}))
                         for s, b, o in rows]}

    agree = serve_study.agreement(table(("6-1", 10.0, 30.0), ("12-1", 7.0, None)),
                                  table(("6-1", 9.2, 33.0), ("desdar", 5.0, 20.0)))
    assert set(agree["pairs"]) == {"6-1 batched", "6-1 single"}
    assert agree["pairs"]["6-1 batched"] == {"claims": [10.0, 9.2], "relative_difference": 0.08, "within_10_percent": True}
    assert agree["pairs"]["6-1 single"]["relative_difference"] == round(3 / 33, 4) and agree["all_within_10_percent"]
    worse = serve_study.agreement(table(("6-1", 10.0, 30.0)), table(("6-1", 8.9, 30.0)))
    assert not worse["pairs"]["6-1 batched"]["within_10_percent"] and not worse["all_within_10_percent"]
    assert not serve_study.agreement(table(("6-1", 10.0, None)), table(("12-1", 10.0, None)))["all_within_10_percent"]


def test_doc_tables_write_every_figure_from_the_records(tmp_path):
    """docs/distill.md's study tables come from the records: each report's claim, median and interval
    (batched and single), the rerun's agreement, each frontier row's claim and shortlist cost."""
    run, rerun = tmp_path / "run", tmp_path / "rerun"
    for d, (b, s) in ((run, (10.61, 31.2)), (rerun, (10.02, 30.4))):
        d.mkdir()
        row = {"student": "6-1", "updates": 3200, "teacher_bleu": 23.4, "served_bleu": 22.61, "served_minus_teacher": -0.79,
               "speedup_batched": b + 0.5, "speedup_batched_interval": [b, b + 1.0], "speedup_batched_claim": b,
               "speedup_single": s + 1, "speedup_single_interval": [s, s + 2], "speedup_single_claim": s}
        row["bleu_difference"] = {"delta": -0.79, "low": -1.12, "high": -0.45}
        (d / "table.json").write_text(json.dumps({"rows": [row]}))
    (rerun / "agreement.json").write_text(json.dumps(serve_study.agreement(*(json.loads((d / "table.json").read_text())
                                                                             for d in (run, rerun)))))
    frontier = [{"student": "6-1", "beam": 2, "shortlist": True, "sacrebleu": 22.0, "teacher_sacrebleu": 23.4,
                 "speedup_batched_claim": 14.25, "speedup_batched": 15.0, "shortlist_cost": {"lost_share": 0.00412}}]
    (run / "frontier.json").write_text(json.dumps({"rows": frontier}))
    text = serve_study.doc_tables(run, rerun)
    assert "| 6-1 (3200), run 1 | 22.61 | -0.79 (-1.12 to -0.45) | ≥10.61x (11.11x, 10.61-11.61) | ≥31.20x (32.20x, 31.20-33.20) |" in text
    assert "| 6-1 (3200), run 2 (`--remeasure`" in text and "≥10.02x (10.52x, 10.02-11.02)" in text
    assert "6-1 batched: 10.61x and 10.02x, 5.6% apart" in text and "within 10%: yes" in text
    assert "| 6-1 | 2 | yes | 22.00 | -1.40 | ≥14.25x (15.00x) | 0.41% |" in text
    assert "(teacher 23.40)" in text
