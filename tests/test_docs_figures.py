"""Figures in README and docs/ that come from a committed record equal it (issue 72: no stale
figure).  The step-7 table of the README is read back and compared with the quickstart's
committed distillation report; docs/deployment.md's step-7 paragraph too."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP7 = REPO / "benchmarks" / "results" / "distill-step7" / "quickstart-6-1-idle" / "report.json"
ROWS = {"MSC teacher, fairseq-generate": "teacher fairseq-generate",
        "student 6-1, fairseq-generate": "student fairseq-generate",
        "served student, `deepnmt-translate` int8": "student deepnmt-translate"}


def _numbers(cell: str):
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", cell.replace("**", ""))]


def step7_rows(text: str):
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for label, system in ROWS.items():
            if cells and cells[0].startswith(label):
                rows[system] = cells
    return rows


def test_readme_step7_table_equals_the_record():
    rep = json.loads(STEP7.read_text())
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
    assert _numbers(served[2])[1] == summary["speedup_batched"]
    assert _numbers(served[3])[1] == summary["speedup_single"]
    size = {"teacher fairseq-generate": "teacher", "student fairseq-generate": "student",
            "student deepnmt-translate": "served"}
    for system, cells in rows.items():
        assert _numbers(cells[4])[0] == round(rep["sizes"][size[system]]["bytes"] / 1e6, 1), system


# the step-7 sentence of docs/deployment.md (whitespace collapsed)
STEP7_SENTENCE = re.compile(
    r"teacher (?P<teacher>[\d.]+) sacreBLEU with fairseq-generate, served student (?P<served>[\d.]+) "
    r"\((?P<delta>-?[\d.]+)\), \*\*(?P<batched>[\d.]+)x\*\* the teacher's tokens/s batched and "
    r"\*\*(?P<single>[\d.]+)x\*\* one sentence at a time")
# the other committed step-7 measurements the paragraph cites
STEP7_OTHERS = (STEP7.parent / "run1-ct2-sizes-16-128" / "report.json",
                STEP7.parents[1] / "quickstart-idle" / "report.json")


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
        "batched": summary["speedup_batched"], "single": summary["speedup_single"]}
    recorded = {json.loads(path.read_text())["summary"][k] for path in (STEP7, *STEP7_OTHERS)
                for k in ("speedup_batched", "speedup_single")}
    assert {float(x) for x in re.findall(r"(\d+(?:\.\d+)?)x\b", current)} == recorded