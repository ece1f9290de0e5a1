"""The fidelity study's report: every finished run lands in its study's table, with the
plots and the command of every number (the runs themselves take hours: benchmarks/fidelity.py)."""

# benchmarks/ is importable through the pythonpath option of pytest (pyproject.toml)


def _run(name, loss, bleu, **extra):
    return {"name": name, "command": f"fairseq-train ... --save-dir runs/{name}", "returncode": 0, "seconds": 1.0,
            "losses": [(10, loss + 1.0), (20, loss)], "final_train_loss": loss, "diverged": False,
            "valid_loss": loss + 0.1, "bleu": bleu, **extra}


def test_report_groups_runs_by_study_with_plots_and_commands(tmp_path, monkeypatch):
    import fidelity

    monkeypatch.setattr(fidelity, "FINDINGS", tmp_path / "none.md")  # the committed findings stay out
    results = {f"{fam}-{n}": _run(f"{fam}-{n}", 7.0 - n / 100, 1.0 + n / 10)
               for fam in ("postnorm", "prenorm", "transparent", "msc") for n in fidelity.DEPTHS}
    results["dd-cad-8-8"] = _run("dd-cad-8-8", 6.5, 4.0, unk_gap=1.25)
    results["gpkd-student-6-3"] = _run("gpkd-student-6-3", 6.0, 5.0)
    results["ssl-finetune-24"] = _run("ssl-finetune-24", 6.2, 4.5)
    results["postnorm-24"] = dict(results["postnorm-24"], diverged=True, returncode=1)
    del results["postnorm-24"]["bleu"]
    report = tmp_path / "fidelity.md"
    fidelity.write_report(results, report, 800)
    text = report.read_text()
    sections = text.split("\n## ")
    depth = next(s for s in sections if s.startswith("Depth"))
    assert depth.count("\n| msc-") == len(fidelity.DEPTHS) and "| postnorm-24 | 6.760 | 6.860 | diverged |" in depth
    assert "dd-cad-8-8" not in depth and "UNK-source gap 1.25 bits" in next(s for s in sections
                                                                              if s.startswith("Deep decoder"))
    gpkd = next(s for s in sections if s.startswith("GPKD"))
    assert "| gpkd-student-6-3 |" in gpkd and "| prenorm-6 |" in gpkd  # the baseline sits in its table
    assert "| ssl-finetune-24 |" in next(s for s in sections if s.startswith("Skipping"))
    assert "800 updates" in text
    for name in results:  # the command of every number
        assert f"- `{name}`: `fairseq-train ... --save-dir runs/{name}`" in text
    for png in ("fidelity-depth.png", "fidelity-curves.png"):
        assert (tmp_path / "img" / png).stat().st_size > 1000 and f"img/{png}" in text
