"""Figures in README and docs/ that come from a committed record equal it (issue 72: no stale
figure).  The step-7 table of the README is read back and compared with the quickstart's
committed distillation report; docs/deployment.md's step-7 paragraph too."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP7 = REPO / "benchmarks" / "results" / "distill-step7" / "quickstart-protocol-idle-vmap" / "report.json"
#: the same models served without the shortlist (the fresh-clone run of the whole quickstart)
STEP7_PLAIN = STEP7.parents[1] / "quickstart-protocol-idle" / "report.json"
#: the whole quickstart rerun from a fresh clone with the shortlist as its default: the README's table
STEP7_RERUN = STEP7.parents[1] / "quickstart-protocol-idle-vmap-rerun" / "report.json"
ROWS = {"MSC teacher, fairseq-generate": "teacher fairseq-generate",
        "student 6-1, fairseq-generate": "student fairseq-generate",
        "served student, `deepnmt-translate` int8": "student deepnmt-translate"}


def _numbers(cell: str):
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", cell.replace("**", ""))]


def speed_figures(summary: dict, kind: str) -> set:
    """The speed figures a record states for ``kind`` (batched, single): its ratio (the median, in a
    record of the speed protocol, issue 78) and, in such a record, its interval and claim (the
    interval's lower bound)."""
    return {summary[f"speedup_{kind}"], *summary.get(f"speedup_{kind}_interval", ()),
            *([summary[f"speedup_{kind}_claim"]] if f"speedup_{kind}_claim" in summary else [])}


def headline(summary: dict, kind: str) -> float:
    """The figure a text must cite for ``kind``: the claim where the record has one, else its ratio."""
    return summary.get(f"speedup_{kind}_claim", summary[f"speedup_{kind}"])


def check_speed_cells(served: list, summary: dict) -> None:
    """The served student's speed cells (batched, single): after its tok/s, the claim (or an old
    record's ratio) cited, and no figure the record does not have."""
    for cell, kind in ((served[2], "batched"), (served[3], "single")):
        assert headline(summary, kind) in _numbers(cell)[1:], (kind, cell)
        assert set(_numbers(cell)[1:]) <= speed_figures(summary, kind), (kind, cell)


def step7_rows(text: str):
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for label, system in ROWS.items():
            if cells and cells[0].startswith(label):
                rows[system] = cells
    return rows


def test_readme_step7_table_equals_the_record():
    rep = json.loads(STEP7_RERUN.read_text())
    rows = step7_rows((REPO / "README.md").read_text(encoding="utf-8"))
    assert set(rows) == set(ROWS.values()), "README's step-7 table lost a row"
    for system, cells in rows.items():
        s = rep["systems"][system]
        assert _numbers(cells[1])[0] == s["sacrebleu"], system
        assert round(_numbers(cells[2])[0]) == round(s["batched"]["tokens_per_s"]), system
        assert round(_numbers(cells[3])[0]) == round(s["single"]["tokens_per_s"]), system
    served = rows["student deepnmt-translate"]
    summary = rep["summary"]
    assert _numbers(served[1])[1] == summary["bleu_served_minus_teacher"]
    check_speed_cells(served, summary)
    assert rep["sizes"]["served"]["shortlist"] and not json.loads(STEP7_PLAIN.read_text())["sizes"]["served"].get("shortlist")
    size = {"teacher fairseq-generate": "teacher", "student fairseq-generate": "student",
            "student deepnmt-translate": "served"}
    for system, cells in rows.items():
        assert _numbers(cells[4])[0] == round(rep["sizes"][size[system]]["bytes"] / 1e6, 1), system


# the step-7 sentence of docs/deployment.md (whitespace collapsed)
STEP7_SENTENCE = re.compile(
    r"teacher (?P<teacher>[\d.]+) sacreBLEU with fairseq-generate, served student (?P<served>[\d.]+) "
    r"\((?P<delta>-?[\d.]+)\), \*\*≥?(?P<batched>[\d.]+)x\*\*(?: \([^)]*\))? the teacher's tokens/s batched and "
    r"\*\*≥?(?P<single>[\d.]+)x\*\*(?: \([^)]*\))? one sentence at a time")
# the other committed step-7 measurements the current paragraphs cite
STEP7_OTHERS = (STEP7_PLAIN, STEP7_RERUN)


def test_deployment_doc_step7_figures_equal_the_record():
    """The step-7 paragraph's quality and speed figures are the record's, and every other speed ratio
    in the section is one of the cited records' - except in the paragraph marked historical."""
    rep = json.loads(STEP7.read_text())
    text = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8")
    section = text.split("## The quickstart's step 7", 1)[1].split("\n## ", 1)[0]
    paragraphs = [" ".join(p.split()) for p in section.split("\n\n") if p.strip()]
    current = " ".join(p for p in paragraphs if not p.startswith("Historical ("))
    m = STEP7_SENTENCE.search(current)
    assert m, "the step-7 sentence of docs/deployment.md changed its wording: update STEP7_SENTENCE"
    summary, systems = rep["summary"], rep["systems"]
    assert {k: float(v) for k, v in m.groupdict().items()} == {
        "teacher": systems["teacher fairseq-generate"]["sacrebleu"],
        "served": systems["student deepnmt-translate"]["sacrebleu"],
        "delta": summary["bleu_served_minus_teacher"],
        "batched": headline(summary, "batched"), "single": headline(summary, "single")}
    # every record's headline figures cited, and no speed figure that is not a record's
    summaries = [json.loads(path.read_text())["summary"] for path in (STEP7, *STEP7_OTHERS)]
    cited = {float(x) for x in re.findall(r"(\d+(?:\.\d+)?)x\b", current)}
    assert {headline(s, k) for s in summaries for k in ("batched", "single")} <= cited
    assert cited <= {x for s in summaries for k in ("batched", "single") for x in speed_figures(s, k)}
    # the shortlist's cost and the target it decides (issue 78), from the two records and shortlist-cost.json
    plain = json.loads(STEP7_PLAIN.read_text())
    cost = json.loads((STEP7.parent / "shortlist-cost.json").read_text())
    m = re.search(r"The shortlist costs ([\d.]+) sacreBLEU here and drops ([\d.]+)% of the full student's own tokens "
                  r"\(([\d,]+) of ([\d,]+);", current)
    assert m, "the shortlist's cost sentence of docs/deployment.md changed its wording"
    assert float(m[1]) == round(plain["systems"]["student deepnmt-translate"]["sacrebleu"]
                                - systems["student deepnmt-translate"]["sacrebleu"], 2)
    assert float(m[2]) == round(100 * cost["lost_share"], 1)
    assert (int(m[3].replace(",", "")), int(m[4].replace(",", ""))) == (cost["lost_tokens"], cost["tokens"])
    assert "holds with it and is missed without it" in current
    # the rerun's agreement with the first shortlisted report (the protocol's rule, its record)
    from deepnmt_deploy.speed_protocol import rerun_agreement

    agree = json.loads((STEP7_RERUN.parent / "agreement.json").read_text())
    claims = [{"results": {k: {"claim": json.loads(p.read_text())["summary"][f"speedup_{k}_claim"]}
                           for k in ("batched", "single")}} for p in (STEP7, STEP7_RERUN)]
    assert agree["pairs"] == rerun_agreement(*claims) and agree["all_within_10_percent"]
    d = [f"{100 * agree['pairs'][k]['relative_difference']:.1f}%" for k in ("batched", "single")]
    assert f"Its claims are {d[0]} and {d[1]} from the first shortlisted report's, within the protocol's 10%" in current
    assert headline(plain["summary"], "batched") < 10 <= headline(summary, "batched")

def test_the_checks_accept_a_record_of_the_speed_protocol():
    """A step-7 record measured by the speed protocol (issue 78) holds the median, its interval and the
    claim (the lower bound): the text cites the claim, with the median and interval or without."""
    summary = {"bleu_served_minus_teacher": -0.5, "speedup_batched": 10.1, "speedup_batched_interval": [9.2, 11.0],
               "speedup_batched_claim": 9.2, "speedup_single": 24.4, "speedup_single_interval": [22.05, 25.3],
               "speedup_single_claim": 22.05}
    check_speed_cells(["x", "22.9 (-0.50)", "16639 (**≥9.2x**, median 10.1x)", "4361 (≥22.05x)"], summary)
    for bad in (["x", "", "16639 (**10.1x**)", "4361 (≥22.05x)"],  # the median alone: not the claim
                ["x", "", "16639 (≥9.2x, median 10.3x)", "4361 (≥22.05x)"]):  # a figure not in the record
        try:
            check_speed_cells(bad, summary)
        except AssertionError:
            continue
        raise AssertionError(f"accepted {bad}")
    sentence = ("teacher 13.71 sacreBLEU with fairseq-generate, served student 13.21 (-0.5), **≥9.2x** (median "
                "10.1x, 95% CI 9.2-11.0) the teacher's tokens/s batched and **≥22.05x** one sentence at a time")
    m = STEP7_SENTENCE.search(sentence)
    assert m and float(m["batched"]) == headline(summary, "batched") and float(m["single"]) == headline(summary, "single")
    cited = {float(x) for x in re.findall(r"(\d+(?:\.\d+)?)x\b", sentence)}
    assert cited <= speed_figures(summary, "batched") | speed_figures(summary, "single")
    # an old record (no interval): its ratio is the headline, as before
    assert headline({"speedup_batched": 13.73}, "batched") == 13.73


STUDY = REPO / "benchmarks" / "results" / "distill-study"


def test_distill_doc_study_table_equals_the_records():
    """docs/distill.md's study-scale table (issue 71, target 1) and its "against 23.42" sentence cite
    the serve study's records (table.json: one report per student; beams.json: the beam run) and
    nothing else: quality, differences and speed-ups (issue 78: every speed figure from a record)."""
    table = json.loads((STUDY / "table.json").read_text())
    beams = json.loads((STUDY / "beams.json").read_text())["rows"]
    main = {r["student"]: r for r in table["rows"]}
    text = (REPO / "docs" / "distill.md").read_text(encoding="utf-8")
    section = text.split("## At the evidence study's scale", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in section.splitlines()
            if ln.startswith("| ") and ("beam" in ln.split("|")[1])]
    assert len(rows) == 4, rows
    teacher = {r["teacher_bleu"] for r in main.values()}
    assert len(teacher) == 1 and f"(teacher {next(iter(teacher)):.2f})" in section
    for label, bleu, delta, batched, single in rows:
        student = "6-1" if label.startswith("6-1") else "desdar"
        beam = int(re.search(r"beam (\d)", label)[1])
        run = next(r for r in beams if r["student"] == student and r["beam"] == beam)
        if "(beam run)" in label:  # a row of the beam run alone
            assert float(bleu) == run["sacrebleu"], label
            assert float(delta) == round(run["sacrebleu"] - run["teacher_sacrebleu"], 2), label
            assert _numbers(batched) == [run["speedup_batched"]], label
            assert not single, label
            continue
        rec = main[student]
        assert float(bleu) == rec["served_bleu"] and float(delta) == rec["served_minus_teacher"], label
        assert f"{rec['updates']} updates" in label, label
        # the report's ratio first; the beam run's figure for the same student and beam in brackets
        assert _numbers(batched)[0] == rec["speedup_batched"], label
        assert set(_numbers(batched)[1:]) <= {run["speedup_batched"]}, label
        assert _numbers(single) == [rec["speedup_single"]], label
    # the differences against the study record's teacher score, in the order the sentence gives them
    sentence = " ".join(section.split("Against ", 1)[1].split("\n\n", 1)[0].split())
    study = table["study_bleu"]
    assert sentence.startswith(f"{study:.2f} the students are {study - next(iter(teacher)):.2f} lower again"), sentence
    cited = [float(x) for x in re.findall(r"-\d+\.\d+", sentence)]
    expected = [round(next(r for r in beams if r["student"] == "6-1" and r["beam"] == b)["sacrebleu"] - study, 2)
                for b in (2, 1)]
    expected = [round(main["6-1"]["served_bleu"] - study, 2), *expected,
                round(main["desdar"]["served_bleu"] - study, 2)]
    assert cited == expected, (cited, expected)


SERVE_IDLE = REPO / "benchmarks" / "results" / "serve-load" / "idle-random-6-1-c1-8-32-128-soak10.json"


def _close(cell: str, value: float) -> bool:
    """A figure as the text writes it is the record's value rounded to the text's own precision
    (half a unit of its last digit; bold marks aside; a trailing % reads as a share)."""
    cell = cell.replace("**", "").replace(",", "").strip()
    share = cell.endswith("%")
    cell = cell.rstrip("%")
    places = len(cell.split(".")[1]) if "." in cell else 0
    return abs(float(cell) - (100 * value if share else value)) <= 0.5 * 10 ** -places + 1e-9


def test_deployment_doc_serve_load_table_equals_the_record():
    """docs/deployment.md's idle-machine load table (issue 79) is the committed record's: every
    figure of every concurrency level and of the soak, at the precision the text gives it."""
    rec = json.loads(SERVE_IDLE.read_text())
    text = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8")
    part = text.split("**Idle machine**", 1)[1]
    assert f"ran at {rec['reference']['target_tokens_per_s']:,.0f} tok/s" in " ".join(part.split())
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in part.split("\n\n")[1].splitlines()[2:]]
    levels = {str(lv["clients"]): lv for lv in rec["levels"]}
    assert [r[0] for r in rows] == [*levels, "soak: 32 for 10 min"]
    ref = rec["reference"]["target_tokens_per_s"]
    for row in rows:
        lv = levels.get(row[0], rec["soak"])
        errors = sum(lv["errors"].values()) if isinstance(lv["errors"], dict) else lv["errors"]
        lat, srv = lv["latency_ms"], lv["server"]
        want = [lv["target_tokens_per_s"], lv["target_tokens_per_s"] / ref, lat["p50"], lat["p95"], lat["p99"]]
        assert all(_close(c, v) for c, v in zip(row[1:6], want)), (row, want)
        assert row[6] == f"{errors} / {lv['refused_503']}", row
        assert _close(row[7], srv["mean_batch_sentences"]) and _close(row[8], srv["model_busy_share"]), row
        if row[9]:  # the soak's CPU split is not measured
            server, generator = row[9].split(" / ")
            assert _close(server, srv["server_cpu_ms_per_token"]), row
            assert _close(generator, srv["load_generator_cpu_ms_per_token"]), row


def test_distill_doc_protocol_tables_and_figures_are_the_records():
    """docs/distill.md's study-scale section by the speed protocol (issue 78): its tables are
    serve_study.doc_tables of the committed records, verbatim, and every ratio its prose derives
    (the cost split: engine, depth, shortlist, beam) is the frontier record's, at the text's precision."""
    import serve_study

    text = (REPO / "docs" / "distill.md").read_text(encoding="utf-8")
    section = text.split("### By the speed protocol", 1)[1].split("\n### ", 1)[0]
    assert serve_study.doc_tables(STUDY / "protocol", STUDY / "protocol-rerun") in section
    rows = {r["system"]: r for r in json.loads((STUDY / "protocol" / "frontier.json").read_text())["rows"]}
    rate = {k: r["tokens_per_s"] for k, r in rows.items()}
    prose = " ".join(section.split())
    assert f"{rows['deep-row']['speedup_batched']:.2f}x (median)" in prose
    assert f"{rate['6-1-beam4']:,.0f} / {rate['deep-row']:,.0f} = {rate['6-1-beam4'] / rate['deep-row']:.1f}x" in prose
    assert f"{rate['6-1-beam4-vmap'] / rate['6-1-beam4']:.2f}x ({rate['6-1-beam4-vmap']:,.0f} / {rate['6-1-beam4']:,.0f})" in prose
    assert f"{rate['6-1-beam2'] / rate['6-1-beam4']:.2f}x ({rate['6-1-beam2']:,.0f} / {rate['6-1-beam4']:,.0f})" in prose
    table = json.loads((STUDY / "protocol" / "table.json").read_text())["rows"][0]
    rerun = json.loads((STUDY / "protocol-rerun" / "table.json").read_text())["rows"][0]
    d = table["bleu_difference"]
    assert f"({table['served_minus_teacher']:+.2f}; the paired bootstrap's 95% interval, {d['low']:+.2f} to {d['high']:+.2f}" in prose
    assert (f"batched lower bound is {table['speedup_batched_claim']:.2f}x in the report ({rerun['speedup_batched_claim']:.2f}x "
            f"in its rerun, {rows['6-1-beam4']['speedup_batched_claim']:.2f}x in the frontier's row)") in prose
    assert f"≥ {rows['6-1-beam4-vmap']['speedup_batched_claim']:.2f}x at {rows['6-1-beam4-vmap']['sacrebleu'] - table['teacher_bleu']:+.2f}" in prose
    # docs/deployment.md's shortlist paragraph cites the same rows
    dep = " ".join((REPO / "docs" / "deployment.md").read_text(encoding="utf-8").split())
    v, f = rows["6-1-beam4-vmap"], rows["6-1-beam4"]
    assert (f"loses {100 * v['shortlist_cost']['lost_share']:.2f}% of its own tokens to the shortlist, scores "
            f"{f['sacrebleu'] - v['sacrebleu']:.2f} sacreBLEU lower and decodes {rate['6-1-beam4-vmap'] / rate['6-1-beam4']:.2f}x "
            f"faster batched ({rate['6-1-beam4-vmap']:,.0f} against {rate['6-1-beam4']:,.0f} tok/s") in dep


def test_distill_doc_step7_protocol_table_is_the_two_records():
    """docs/distill.md's step-7 table by the speed protocol: each row's BLEU and claims (medians) are its
    record's, the plain run's and the shortlist's, and the teacher's BLEU is the one both measured."""
    text = (REPO / "docs" / "distill.md").read_text(encoding="utf-8")
    section = text.split("**By the speed protocol (issue 78; 2026-12-05).**", 1)[1].split("`--skd-beam`", 1)[0]
    rows = {r[0]: r for r in ([c.strip() for c in ln.strip().strip("|").split("|")] for ln in section.splitlines()
                              if ln.startswith("| with"))}
    rerun = "with the shortlist, the whole quickstart rerun from a fresh clone"
    assert set(rows) == {"without the shortlist", "with the shortlist (the default)", rerun}
    for label, path in (("without the shortlist", STEP7_PLAIN), ("with the shortlist (the default)", STEP7),
                        (rerun, STEP7_RERUN)):
        rep = json.loads(path.read_text())
        sm, served = rep["summary"], rep["systems"]["student deepnmt-translate"]
        assert _numbers(rows[label][1]) == [served["sacrebleu"], sm["bleu_served_minus_teacher"]], label
        for cell, kind in ((rows[label][2], "batched"), (rows[label][3], "single")):
            assert _numbers(cell) == [sm[f"speedup_{kind}_claim"], sm[f"speedup_{kind}"]], (label, kind)
        assert f"teacher {rep['systems']['teacher fairseq-generate']['sacrebleu']}" in section


def test_distill_doc_step7_cost_split_is_derived_from_the_records():
    """The step-7 paragraph's cost split (issue 78, item 5): every rate it cites is a record's, and each
    ratio it derives equals the ratio of those records' rates."""
    text = " ".join((REPO / "docs" / "distill.md").read_text(encoding="utf-8").split())
    section = text.split("**By the speed protocol (issue 78; 2026-12-05).**", 1)[1].split("`--skd-beam`", 1)[0]
    plain, short = (json.loads(p.read_text())["systems"] for p in (STEP7_PLAIN, STEP7))
    old = json.loads((STEP7.parents[1] / "quickstart-6-1-idle" / "report.json").read_text())["systems"]
    rate = lambda s, who, kind="batched": round(s[who][kind]["tokens_per_s"])  # noqa: E731
    t, f, c = "teacher fairseq-generate", "student fairseq-generate", "student deepnmt-translate"
    assert f"({rate(plain, t)}-{rate(short, t)} tok/s)" in section and f"({rate(old, t)} tok/s" in section
    depth = sorted(round(rate(s, f) / rate(s, t), 1) for s in (plain, short))
    assert f"buys {depth[0]}-{depth[1]}x" in section
    assert f"int8 (the same student in `deepnmt-translate` against fairseq-generate) {round(rate(plain, c) / rate(plain, f), 1)}x" in section
    assert f"the shortlist {round(rate(short, c) / rate(plain, c), 2)}x more ({rate(short, c)} against {rate(plain, c)} tok/s)" in section
    one = (rate(short, c, "single"), rate(plain, c, "single"))
    assert f"buys {round(one[0] / one[1], 2)}x ({one[0]} against {one[1]} tok/s)" in section
