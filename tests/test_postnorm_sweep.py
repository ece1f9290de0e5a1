"""The post-norm column's tuning sweep (issue 77): one grid, one budget and one rule on *valid* for
post-norm, DeepNorm, Admin and transparent post-norm; the choice reproduced from the committed records.

benchmarks/ is importable through the pythonpath option of pytest (pyproject.toml)."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest

from study import plan

REPO = Path(__file__).resolve().parents[1]
CPU = plan.PRESETS["cpu"]


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_the_grid_is_the_issues_grid_for_every_post_norm_family():
    """At least 3 peak rates x 2 warm-ups, containing 2e-3/600 (the old post-norm point) and 1e-3/1000
    (the GPU preset's), reaching below 1e-3; >= 2000 updates at the deepest depth; the same grid for
    every family of the post-norm column."""
    grid = set(CPU.sweep_grid)
    assert len({lr for lr, _ in grid}) >= 3 and len({w for _, w in grid}) >= 2
    assert {(2e-3, 600), (1e-3, 1000)} <= grid and min(lr for lr, _ in grid) < 1e-3
    assert CPU.sweep_updates >= 2000 and plan.sweep_depth(CPU) == 24
    runs = plan.sweep_runs(CPU)
    assert {(r.system.split("-", 3)[3].rsplit("-", 1)[0], r.lr, r.warmup) for r in runs} == {
        (fam, lr, w) for fam in plan.SWEEP_FAMILIES for lr, w in CPU.sweep_grid}
    assert set(plan.SWEEP_FAMILIES) == {"postnorm", *plan.POST_NORM_FAMILIES}
    assert all(r.seed == 1 and r.updates == CPU.sweep_updates for r in runs)
    # every sweep run is a planned run of the study (``--runs`` selects it by name)
    assert {r.name for r in runs} <= set(plan.planned(CPU, [1, 2]))


def test_sweep_commands_train_at_their_grid_point_admin_on_radam_and_read_valid_only(tmp_path):
    from study import run as runner

    study = runner.Study(CPU, tmp_path, tmp_path / "bin", tmp_path / "tok", fork=False)
    seen = set()
    for r in plan.sweep_runs(CPU):
        cmd = shlex.split(runner._portable(study.train_command(r)))
        assert (float(_flag(cmd, "--lr")), int(_flag(cmd, "--warmup-updates"))) == (r.lr, r.warmup), r.name
        assert int(_flag(cmd, "--max-update")) == CPU.sweep_updates
        assert int(_flag(cmd, "--encoder-layers")) == 24 and "--post-norm" in cmd
        fam = "admin" if "--admin" in cmd else "deepnorm" if "--deepnorm" in cmd else \
            "transparent-post" if "transparent" in cmd else "postnorm"
        assert _flag(cmd, "--optimizer") == ("radam" if fam == "admin" else "adam"), r.name
        # validated at every save (the valid curve), never stopped early
        assert "--disable-validation" not in cmd and "--patience" not in cmd
        seen.add(fam)
        ev = study.eval_command(tmp_path / "avg.pt", r.unk_gap, tmp_path, valid_only=r.valid_only)
        assert "--valid-only" in ev
    assert seen == set(plan.SWEEP_FAMILIES)
    # the study's other runs keep their commands: validation off, Adam, no --valid-only
    other = plan.depth_runs(CPU, [1])[0]
    cmd = study.train_command(other)
    assert "--disable-validation" in cmd and _flag(cmd, "--optimizer") == "adam"
    assert "--valid-only" not in study.eval_command(tmp_path / "avg.pt", False, tmp_path)


def _records(values, bleu=None):  # sweep records: {(family, point): valid NLL (None: diverged)}
    n = plan.sweep_depth(CPU)
    out = {}
    for (fam, pt), v in values.items():
        name = plan.sweep_name(fam, n, *pt)
        out[name] = {"name": name, "valid_nll": v, "diverged": v is None,
                     **({"bleu": bleu[(fam, pt)]} if bleu else {})}
    return out


def test_the_rule_is_the_lowest_valid_nll_once_the_grid_is_complete_and_ignores_test():
    grid = list(CPU.sweep_grid)
    vals = {("deepnorm", pt): 5.9 - 0.1 * i for i, pt in enumerate(grid)}
    vals[("deepnorm", grid[1])] = 3.5
    assert plan.sweep_choice(CPU, _records(vals), "deepnorm") == grid[1]
    # test BLEU, however it is set, changes nothing
    bleu = {k: (99.0 if k[1] == grid[0] else 0.0) for k in vals}
    assert plan.sweep_choice(CPU, _records(vals, bleu), "deepnorm") == grid[1]
    # a diverged point is never chosen; an unfinished grid chooses nothing yet
    vals[("deepnorm", grid[1])] = None
    assert plan.sweep_choice(CPU, _records(vals), "deepnorm") == min(
        (pt for pt in grid if pt != grid[1]), key=lambda pt: vals[("deepnorm", pt)])
    del vals[("deepnorm", grid[-1])]
    assert plan.sweep_choice(CPU, _records(vals), "deepnorm") is None
    assert plan.sweep_table(CPU, _records(vals))["deepnorm"][grid[1]] == math.inf
    # a NaN valid NLL counts as a failure; a family that failed at every point chooses nothing, and
    # says so, rather than taking the grid's first point
    res = _records({("admin", pt): 4.0 for pt in grid})
    res[plan.sweep_name("admin", 24, *grid[0])]["valid_nll"] = float("nan")
    assert plan.sweep_choice(CPU, res, "admin") == grid[1]
    res = _records({("admin", pt): None for pt in grid})
    assert plan.sweep_choice(CPU, res, "admin") is None and plan.sweep_failed(CPU, res, "admin")
    assert plan.retuned_runs(CPU, [1], res) == [] and not plan.sweep_failed(CPU, {}, "admin")
    from study.report import sweep_section

    assert "| none: failed at every point of the grid |" in "\n".join(sweep_section(CPU, res))


def test_a_best_point_on_the_grids_edge_of_rates_is_flagged():
    """The rule cannot look past its grid: a family whose lowest valid NLL is at the highest (lowest) rate
    is flagged, one with its best inside the grid is not, and nothing finished flags nothing."""
    grid = list(CPU.sweep_grid)
    rates = sorted({lr for lr, _ in grid})
    falling = {("postnorm", pt): 6.0 - pt[0] for pt in grid}  # the higher the rate, the lower the NLL
    assert plan.sweep_edge(CPU, _records(falling), "postnorm") == "highest"
    rising = {("postnorm", pt): 6.0 + pt[0] for pt in grid}
    assert plan.sweep_edge(CPU, _records(rising), "postnorm") == "lowest"
    inside = {("postnorm", pt): abs(pt[0] - rates[1]) for pt in grid}
    assert plan.sweep_edge(CPU, _records(inside), "postnorm") is None
    assert plan.sweep_edge(CPU, {}, "postnorm") is None
    one = {k: v for k, v in falling.items() if k[1][0] == rates[-1]}  # one rate finished: no trend yet
    assert plan.sweep_edge(CPU, _records(one), "postnorm") is None
    diverged = {**falling, **{("postnorm", pt): None for pt in grid if pt[0] == rates[-1]}}  # None: diverged
    assert plan.sweep_edge(CPU, _records(diverged), "postnorm") is None  # the edge rate diverged: not a best
    partial = {k: v for k, v in falling.items() if k[1][0] != rates[-1]}  # the highest rate not run yet
    assert plan.sweep_edge(CPU, _records(partial), "postnorm") is None
    from study.report import sweep_section

    text = "\n".join(sweep_section(CPU, _records(falling)))
    assert f"highest peak rate ({plan.rate(rates[-1])}) for postnorm" in text
    text = "\n".join(sweep_section(CPU, _records(rising)))
    assert f"lowest peak rate ({plan.rate(rates[0])}) for postnorm" in text


def test_the_committed_report_marks_the_choice_the_records_make():
    """Section 5 of docs/fidelity.md (generated) against the rule recomputed here from the committed
    sweep records: each family's chosen point, and every finished cell's valid NLL."""
    records = REPO / plan.RECORDS / "cpu"
    results = {f.stem: json.loads(f.read_text()) for f in records.glob("sweep-*.json")}
    text = (REPO / "docs" / "fidelity.md").read_text()
    head = "## 5. The post-norm column's recipe, chosen on valid"
    assert head in text
    text = text.split(head, 1)[1].split("\n## ", 1)[0]  # section 5 only
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| ([a-z-]+)-24 \| (.*) \|$", text, re.M)
            if m.group(1) in plan.SWEEP_FAMILIES}
    assert set(rows) == set(plan.SWEEP_FAMILIES)
    for fam, row in rows.items():
        cells = [c.strip() for c in row.split("|")]
        *values, chosen = cells
        # the rule, written again here: the lowest finite valid NLL once every grid point has a record
        recs = [results.get(plan.sweep_name(fam, 24, *pt)) for pt in CPU.sweep_grid]
        nll = [math.inf if r.get("diverged") or r.get("valid_nll") is None else r["valid_nll"]
               for r in recs if r is not None]
        best = (CPU.sweep_grid[nll.index(min(nll))] if len(nll) == len(recs) and math.isfinite(min(nll))
                else None)
        assert best == plan.sweep_choice(CPU, results, fam), fam
        if best:
            assert chosen == plan.point_text(*best), fam
        else:
            assert chosen.startswith(("not yet", "none: failed")), fam
        for pt, cell in zip(CPU.sweep_grid, values):
            rec = results.get(plan.sweep_name(fam, 24, *pt))
            if rec is None:
                assert cell == "…", (fam, pt)
            elif not rec.get("diverged"):
                assert cell.strip("*") == f"{rec['valid_nll']:.3f}", (fam, pt)
                assert cell.startswith("**") == (pt == best), (fam, pt)


@pytest.mark.slow
def test_a_tiny_sweep_trains_on_radam_keeps_the_valid_curve_and_never_translates_test(tmp_path, monkeypatch):
    """The sweep end to end at tiny size (one family, one grid point): the record has the valid NLL
    and its curve, and no test BLEU; the report's section 5 marks the (only) point as chosen."""
    import dataclasses

    from study import cli as study_cli

    tiny = dataclasses.replace(plan.PRESETS["tiny"], sweep_updates=3, sweep_grid=((1e-3, 1),))
    monkeypatch.setitem(plan.PRESETS, "tiny", tiny)
    monkeypatch.setattr(plan, "SWEEP_FAMILIES", ("admin",))
    monkeypatch.setattr(plan, "PRENORM_CHECK", ())  # the same runner path; CI time
    work, report = tmp_path / "work", tmp_path / "report.md"
    assert study_cli.main(["--preset", "tiny", "--work-dir", str(work), "--report", str(report),
                          "--only", "postnorm-sweep", "--jobs", "1"]) == 0
    name = plan.sweep_name("admin", tiny.depths[-1], 1e-3, 1)
    rec = json.loads((work / "records" / f"{name}.json").read_text())
    assert math.isfinite(rec["valid_nll"]) and "bleu" not in rec and "test_stats" not in rec
    assert [u for u, _ in rec["valid_log"]] == [1, 2, 3]
    assert "--optimizer radam" in rec["command"] and "--valid-only" in rec["eval_command"]
    assert not (work / "runs" / name / "eval.out").read_text().count('"bleu"')
    text = report.read_text()
    assert f"| admin-{tiny.depths[-1]} | **{rec['valid_nll']:.3f}** | 1e-3 / 1 |" in text


def test_the_pre_norm_check_runs_at_its_own_point_then_at_the_post_norm_columns_choice():
    """Issue 77 part 2: pre-norm and MSC at the middle depth at their own point (no dependency) and,
    once every post-norm family has chosen, at the point most of them chose (a tie: post-norm's)."""
    mid, own = CPU.depths[1], (CPU.lr, CPU.warmup)
    first = plan.prenorm_check_runs(CPU, {})
    assert [(r.system, r.lr, r.warmup) for r in first] == [
        (f"sweep-lr{own[0]:g}-w{own[1]}-{fam}-{mid}", *own) for fam in plan.PRENORM_CHECK]
    assert all(r.valid_only and r.updates == CPU.sweep_updates and "--post-norm" not in r.model for r in first)
    assert "--msc-block-layers" in first[1].model
    grid = list(CPU.sweep_grid)
    # deepnorm, admin and transparent-post choose grid[2]; plain post-norm grid[0]: the majority wins
    vals = {(fam, pt): 5.0 for fam in plan.SWEEP_FAMILIES for pt in grid}
    for fam in plan.SWEEP_FAMILIES:
        vals[(fam, grid[0] if fam == "postnorm" else grid[2])] = 3.0
    res = _records(vals)
    assert plan.postnorm_point(CPU, res) == grid[2] and not plan.postnorm_point_tied(CPU, res)
    later = plan.prenorm_check_runs(CPU, res)
    assert [(r.lr, r.warmup) for r in later] == [own, own, grid[2], grid[2]]
    # a 2-2 tie: plain post-norm's choice
    vals[("deepnorm", grid[2])], vals[("deepnorm", grid[0])] = 5.0, 3.0
    assert plan.postnorm_point(CPU, _records(vals)) == grid[0] and plan.postnorm_point_tied(CPU, _records(vals))
    from study.retune import check_words

    assert "a tie of the families' choices" in check_words(CPU, _records(vals))
    # a family that failed at every point does not hold the check back
    failed = {**vals, **{("admin", pt): None for pt in grid}}
    assert plan.postnorm_point(CPU, _records(failed)) == grid[0]
    # the verdict once both points of a family have finished: the lower valid NLL, a tie keeps its own
    res = _records(vals)
    for r, v in zip(plan.prenorm_check_runs(CPU, res), (4.9, 4.2, 4.5, 4.2)):  # prenorm, msc; own, then other
        res[r.name] = {"name": r.name, "valid_nll": v, "diverged": False}
    assert plan.prenorm_check_verdict(CPU, res) == {"prenorm": "other", "msc": "own"}
    from study.report import sweep_section

    text = "\n".join(sweep_section(CPU, res))
    assert f"- prenorm-{mid}: the column's point is better on valid" in text and f"- msc-{mid}: its own point" in text
    # an unfinished family: no point yet, and only the own-point runs are planned
    del vals[("admin", grid[3])]
    assert plan.postnorm_point(CPU, _records(vals)) is None and len(plan.prenorm_check_runs(CPU, _records(vals))) == 2
    assert not plan.postnorm_point_tied(CPU, _records(vals))
    assert "not chosen yet" in check_words(CPU, _records(vals)) and "a tie" not in check_words(CPU, _records(vals))


def test_diagnostic_runs_log_the_change_norms_and_the_big_batch_reaches_admins_32k_tokens(tmp_path):
    """Issue 77 part 4: the diagnostic runs train at their point with DeepNet's/Admin's diagnostics on
    (``--task deep_translation --log-change-norms``), valid only; the large-batch run is Admin at
    16 x 2048 = 32K tokens an update through --update-freq; no other run of the study changes."""
    from study import run as runner

    study = runner.Study(CPU, tmp_path, tmp_path / "bin", tmp_path / "tok", fork=False)
    runs = plan.diag_runs(CPU)
    diag = [r for r in runs if r.update_freq == 1]
    assert {(r.system.split("-", 3)[3].rsplit("-", 1)[0], r.lr, r.warmup) for r in diag} == {
        (f, lr, w) for lr, w in plan.DIAG_POINTS for f in plan.DIAG_FAMILIES} | {("prenorm", CPU.lr, CPU.warmup)}
    for r in diag:
        cmd = shlex.split(runner._portable(study.train_command(r)))
        assert _flag(cmd, "--task") == "deep_translation" and "--log-change-norms" in cmd
        assert int(_flag(cmd, "--log-grad-norms-every")) == CPU.diag_every
        assert (float(_flag(cmd, "--lr")), int(_flag(cmd, "--warmup-updates"))) == (r.lr, r.warmup)
        assert int(_flag(cmd, "--max-update")) == CPU.diag_updates and int(_flag(cmd, "--encoder-layers")) == 24
        assert _flag(cmd, "--optimizer") == ("radam" if "--admin" in cmd else "adam")
        assert "--update-freq" not in cmd and r.valid_only
    (big,) = [r for r in runs if r.update_freq > 1]
    cmd = shlex.split(runner._portable(study.train_command(big)))
    assert int(_flag(cmd, "--update-freq")) * int(_flag(cmd, "--max-tokens")) == 32768  # Admin's 32K tokens
    assert "--admin" in cmd and _flag(cmd, "--optimizer") == "radam" and "--disable-validation" not in cmd
    assert plan.run_updates(CPU, big.name) == CPU.diag_updates * 16  # the budget counts its micro-batches
    assert {r.name for r in runs} <= set(plan.planned(CPU, [1, 2]))
    for other in plan.sweep_runs(CPU)[:2] + plan.depth_runs(CPU, [1])[:1]:
        cmd = study.train_command(other)
        assert _flag(cmd, "--task") == "translation" and "--update-freq" not in cmd


@pytest.mark.slow
def test_a_tiny_diagnostic_run_records_the_change_norms_of_every_layer(tmp_path, monkeypatch):
    """End to end at tiny size: the record keeps one entry per diagnostic update with the output change,
    parameter change and gradient norm of every encoder layer, starting at 0 before the first step and
    moving after it; the report's section 5b shows them."""
    import dataclasses

    from study import cli as study_cli

    tiny = dataclasses.replace(plan.PRESETS["tiny"], diag_updates=4, diag_every=2, bigbatch_freq=0)
    monkeypatch.setitem(plan.PRESETS, "tiny", tiny)
    monkeypatch.setattr(plan, "DIAG_FAMILIES", ("postnorm",))
    monkeypatch.setattr(plan, "DIAG_POINTS", ((1e-3, 1),))
    monkeypatch.setattr(plan, "DIAG_REFERENCE", ())
    work, report = tmp_path / "work", tmp_path / "report.md"
    assert study_cli.main(["--preset", "tiny", "--work-dir", str(work), "--report", str(report),
                          "--only", "postnorm-diag", "--jobs", "1"]) == 0
    n = tiny.depths[-1]
    name = plan.diag_name("postnorm", n, 1e-3, 1)
    rec = json.loads((work / "records" / f"{name}.json").read_text())
    log = rec["change_log"]
    assert [e["update"] for e in log] == [0, 1, 3]  # update 1 and every 2nd: after 0, 1 and 3 steps
    assert all(len(e[k]) == n for e in log for k in ("enc_dF", "enc_dW", "enc_gnorm"))
    assert log[0]["enc_dF"] == [0.0] * n and log[0]["enc_dW"] == [0.0] * n
    assert all(v > 0 for v in log[-1]["enc_dF"] + log[-1]["enc_dW"] + log[-1]["enc_gnorm"])
    assert math.isfinite(rec["valid_nll"]) and "bleu" not in rec
    row = next(line for line in report.read_text().splitlines() if line.startswith(f"| {rec['system']} |"))
    assert f"{rec['valid_nll']:.3f}" in row and "…" not in row


def test_converged_runs_are_redone_at_the_chosen_recipe_where_it_changed_and_supersede_the_old():
    """Issue 77 part 3: once a family's grid is complete, a family whose choice differs from the old
    post-norm recipe (2e-3 / 600 on Adam; Admin always, on RAdam now) is retrained at every depth by the
    converged rule with 3 seeds at its choice; an unchanged family keeps its runs; the old system is
    superseded once the new one has every seed."""
    grid = list(CPU.sweep_grid)
    old = (CPU.postnorm_lr, CPU.postnorm_warmup)
    assert plan.old_recipe(CPU) == (*old, "adam") and old in grid
    vals = {(fam, pt): 5.0 for fam in plan.SWEEP_FAMILIES for pt in grid}
    vals[("postnorm", old)] = 3.0  # post-norm keeps the old point
    vals[("admin", old)] = 3.0  # the old point, but on RAdam: a new recipe
    new = (1e-3, 1000)
    vals[("deepnorm", new)] = 3.0
    del vals[("transparent-post", grid[0])]  # its grid is not complete
    res = _records(vals)
    runs = plan.retuned_runs(CPU, [1, 2], res)
    systems = sorted({r.system for r in runs})
    assert systems == sorted(plan.retuned_name(f, n) for f in ("deepnorm", "admin") for n in CPU.depths)
    for r in runs:
        assert r.early_stop and r.updates == CPU.converged_cap and r.seed in (1, 2, 3)
        if "admin" in r.system:
            assert (r.lr, r.warmup, r.optimizer) == (*old, "radam")
        else:
            assert (r.lr, r.warmup, r.optimizer) == (*new, "adam")
    assert {r.name for r in runs} <= set(plan.planned(CPU, [1, 2], results=res))
    assert plan.superseded(CPU, res) == {}
    res.update(_converged("retuned-deepnorm-24", [20.0, 20.0, 20.0], recipe=(*old, "adam")))
    assert plan.superseded(CPU, res) == {}  # records of another recipe (a grid or choice since changed)
    res.update(_converged("retuned-deepnorm-24", [20.0, 20.0], recipe=(*new, "adam")))
    assert plan.superseded(CPU, res) == {}  # two of three seeds
    res.update(_converged("retuned-deepnorm-24", [20.0, 20.0, None], recipe=(*new, "adam")))
    gone = plan.superseded(CPU, res)  # a seed that diverged at the chosen recipe is a result, not a gap
    assert list(gone) == ["conv-deepnorm-24"] and "1e-3 / 1000" in gone["conv-deepnorm-24"]


def _converged(system, bleus, recipe=None):
    """Records of a converged system, one seed per BLEU (None: diverged), trained at ``recipe`` (lr,
    warm-up, optimizer; default: the old post-norm recipe on Adam, RAdam for Admin)."""
    lr, w, opt = recipe or (CPU.postnorm_lr, CPU.postnorm_warmup, "radam" if "-admin-" in system else "adam")
    return {f"{system}-s{s}": {"name": f"{system}-s{s}", "system": system, "seed": s, "bleu": b,
                               "valid_nll": 4.0 if b is not None else None, "diverged": b is None,
                               "command": f"fairseq-train bin --optimizer {opt} --lr {lr:g} --warmup-updates {w}"}
            for s, b in enumerate(bleus, 1)}


def test_every_post_norm_column_call_is_recomputed_on_the_retuned_systems_beside_the_old_one():
    """Issue 77 part 4: each comparison of the column (rescues, against pre-norm, depth trends) is called
    on the old conv- systems and on the current ones side by side; a retuned system replaces its conv-
    one only with every seed at the chosen recipe, a family whose choice is the old recipe keeps its
    runs, a comparison waits while either side's rerun is unfinished (never new against old), and the
    README's evidence rows and paper sentences read the same pairs."""
    from study import report

    grid = list(CPU.sweep_grid)
    old, new = (CPU.postnorm_lr, CPU.postnorm_warmup), (1e-3, 1000)
    vals = {(fam, pt): 5.0 for fam in plan.SWEEP_FAMILIES for pt in grid}
    for fam in ("transparent-post", "admin"):
        vals[(fam, old)] = 3.0  # transparent keeps the old recipe; Admin's is new (RAdam)
    for fam in ("postnorm", "deepnorm"):
        vals[(fam, new)] = 3.0
    res = _records(vals)
    at_new = (*new, "adam")
    for n in CPU.depths:
        res.update(_converged(f"conv-postnorm-{n}", [10.0, 10.2, 9.9]))
        res.update(_converged(f"conv-prenorm-{n}", [20.0, 20.3, 19.8]))
        res.update(_converged(f"conv-deepnorm-{n}", [10.1, 9.8, 10.0]))  # the old rescue call: no difference
        res.update(_converged(f"conv-transparent-post-{n}", [15.0, 15.2, 14.9]))
        res.update(_converged(f"retuned-deepnorm-{n}", [19.0, 19.2, 18.9], at_new))  # the new one: better
        res.update(_converged(f"retuned-postnorm-{n}", [10.0, 10.1, 9.9][:1 if n == 24 else 3], at_new))
    res.update(_converged("retuned-admin-6", [12.0], (*old, "radam")))  # one seed of three: waits
    assert plan.current_system(CPU, res, "deepnorm", 24) == "retuned-deepnorm-24"
    assert plan.current_system(CPU, res, "postnorm", 24) == "conv-postnorm-24"
    assert plan.current_system(CPU, res, "admin", 6) == "conv-admin-6"
    assert plan.current_system(CPU, res, "transparent-post", 12) == "conv-transparent-post-12"

    text = "\n".join(report.column_calls_section(CPU, res))
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^\| (.+?) \| (.+?) \| (.+?) \|$", text, re.M)}
    kinds = {k for k, *_ in plan.postnorm_column_pairs(CPU)}
    assert kinds == set(plan.COLUMN_CALLS) and len(rows) == len(plan.postnorm_column_pairs(CPU)) + 1  # + header
    old_call, new_call = rows["rescue of post-norm: DeepNorm-12 vs post-norm-12"]
    assert old_call.startswith("no difference from post-norm-12") and new_call.startswith(
        "better than post-norm-12 (retuned)")
    # post-norm-24's rerun has one seed of three: the rescue at 24 waits, it is not made new against old
    assert rows["rescue of post-norm: DeepNorm-24 vs post-norm-24"][1] == "waits: retuned-postnorm-24 has 1 of 3 seeds"
    assert rows["against pre-norm: DeepNorm-12 vs pre-norm-12"][1].startswith("worse than pre-norm-12")
    # transparent keeps its runs; its reference is post-norm's rerun
    old_call, new_call = rows["rescue of post-norm: transparent (post-norm)-12 vs post-norm-12"]
    assert old_call.startswith("better than post-norm-12 (") and new_call.startswith("better than post-norm-12 (retuned)")
    assert rows["rescue of post-norm: Admin-6 vs post-norm-6"] == (
        "not measured: Admin-6", "waits: retuned-admin-6 has 1 of 3 seeds")
    assert rows["depth trend: DeepNorm-24 vs DeepNorm-6"][1].startswith("no difference from DeepNorm-6 (retuned)")
    assert rows["depth trend: Admin-12 vs Admin-6"][1] == (
        "waits: retuned-admin-12 has 0 of 3 seeds; retuned-admin-6 has 1 of 3 seeds")

    rows = {(fam, n): c for fam, n, runs, c in report.evidence_rows(res, CPU)}
    assert rows[("deepnorm", 12)]["a"] == "retuned-deepnorm-12" and rows[("deepnorm", 12)]["label"] == "better"
    assert (rows[("deepnorm", 24)]["a"], rows[("deepnorm", 24)]["b"]) == ("conv-deepnorm-24", "conv-postnorm-24")
    assert rows[("postnorm", 12)]["a"] == "retuned-postnorm-12" and rows[("postnorm", 12)]["b"] == "retuned-postnorm-6"
    sentence = next(s for s in report.paper_sentences(res, CPU) if s.startswith("- **DeepNorm**"))
    assert "6 layers: better" in sentence and "12 layers: better" in sentence, sentence
    assert "24 layers: no difference" in sentence, sentence
    # issue 77's "every claim that a method fails names the grid it failed on": a call on the retuned systems
    # is marked and the sentence names the grid; one still on the first recipe is said to be so
    assert re.search(r"12 layers: better \(\+[\d.]+\)[^;]* \[retuned\]", sentence), sentence
    assert re.search(r"24 layers: [a-z ]+ \([-+][\d.]+\) \(\[retuned\]: both sides", sentence), sentence
    rates = " / ".join(plan.rate(lr) for lr in sorted({lr for lr, _ in CPU.sweep_grid}))
    assert f"[retuned]: both sides at their recipe chosen on valid over the grid of peak rates {rates}" in sentence
    assert "calls not marked [retuned] read runs at the study's first recipe" in sentence
    msc = next(s for s in report.paper_sentences(res, CPU) if s.startswith("- **MSC**"))
    assert "[retuned]" not in msc  # pre-norm not tuned in this setting: nothing to say
    # section 1b lists what the reruns superseded, with the reason; the old records stay
    assert set(plan.superseded(CPU, res)) == {f"conv-deepnorm-{n}" for n in CPU.depths} | {
        f"conv-postnorm-{n}" for n in CPU.depths[:2]}


def test_the_status_line_forecasts_the_runs_that_wait_for_the_sweeps_choice():
    """Before the grid is complete nothing waiting is planned, but the status line says what the points
    finished so far would add (the pre-norm check at the column's point, the converged runs again where
    the recipe changed); once the grid is complete the runs are planned and the forecast is gone."""
    from study import report

    grid = list(CPU.sweep_grid)
    old = (CPU.postnorm_lr, CPU.postnorm_warmup)
    new = (1e-3, 1000)
    vals = {(fam, pt): 5.0 for fam in plan.SWEEP_FAMILIES for pt in grid}
    for fam in ("postnorm", "deepnorm", "admin", "transparent-post"):
        vals[(fam, new if fam != "transparent-post" else old)] = 3.0
    full = _records(vals)
    res = {k: v for k, v in full.items() if "-w600-" not in k or "lr0.002" in k}  # the 600 row unfinished
    res.update(_converged("conv-deepnorm-12", [10.0, 10.0, 10.0]))
    for r in res.values():
        r.setdefault("train_seconds", 3600.0)
    assert all(plan.sweep_choice(CPU, res, f) is None for f in plan.SWEEP_FAMILIES)
    assert plan.sweep_choice(CPU, res, "deepnorm", provisional=True) == new
    now = plan.planned(CPU, [1, 2], results=res)
    assert not any(n.startswith("retuned-") for n in now)
    wait = plan.waiting_runs(CPU, res, now)
    mid = plan.middle_depth(CPU)
    assert {r.name for r in wait if r.name.startswith("sweep-")} == {
        plan.sweep_name(f, mid, *new) for f in plan.PRENORM_CHECK}
    assert {r.system for r in wait if r.name.startswith("retuned-")} == {
        plan.retuned_name(f, n) for f in ("postnorm", "deepnorm", "admin") for n in CPU.depths}
    text = report.waiting_sentence(CPU, res, now)
    assert f"the pre-norm check at {plan.point_text(*new)}" in text and "27 runs" in text
    assert "about 3 core-hours for the 3 of them whose old runs" in text  # conv-deepnorm-12: 1 h a seed
    res = dict(full)
    now = plan.planned(CPU, [1, 2], results=res)
    assert plan.waiting_runs(CPU, res, now) == [] and report.waiting_sentence(CPU, res, now) == ""
    assert {n for n in now if n.startswith("retuned-")} and plan.sweep_name("msc", mid, *new) in now


def test_the_run_order_puts_the_sweep_then_the_deepest_retuned_runs_then_the_diagnostics_and_the_big_batch():
    import fnmatch

    from study.report import order_budget

    grid = list(CPU.sweep_grid)
    res = _records({(fam, pt): 5.0 - (pt == (1e-3, 1000)) for fam in plan.SWEEP_FAMILIES for pt in grid})
    names = [n for n in plan.planned(CPU, [1, 2], results=res) if n not in res]
    steps = [(pat, n) for _, pat, n, _ in order_budget(CPU, names, res)]
    first = {}
    for name in names:  # the step that takes each run: the first whose pattern it matches
        first[name] = next(i for i, (pat, _) in enumerate(steps) if fnmatch.fnmatchcase(name, pat))

    def by_kind(prefix):
        return {first[n] for n in names if n.startswith(prefix)}

    retuned = max(by_kind("retuned-"))
    deep = by_kind(f"retuned-postnorm-{CPU.depths[-1]}-")
    shallow = by_kind(f"retuned-postnorm-{CPU.depths[0]}-")
    assert max(by_kind("sweep-")) < min(deep) < min(shallow) <= retuned < min(by_kind("diag-"))
    assert max(by_kind("diag-")) < min(by_kind("bigbatch-")) and steps[max(by_kind("bigbatch-"))][0] != "*"


def _committed(pattern):
    """{run: record} of the committed cpu records matching ``pattern`` (a glob, without .json)."""
    return {f.stem: json.loads(f.read_text()) for f in (REPO / plan.RECORDS / "cpu").glob(pattern + ".json")}


def _findings_after(start):
    """The findings (whitespace folded) from ``start`` to the next round's heading ("**Round 3")."""
    text = " ".join((REPO / "study" / "findings.md").read_text().split())
    return text.split(start)[1].split("**Round 3")[0]


def _between(text, start, end):
    assert start in text and end in text, (start, end)
    return text.split(start, 1)[1].split(end, 1)[0]


def test_the_committed_findings_and_readme_are_what_the_committed_records_generate(tmp_path):
    """Issue 77's "Done when": the study's report regenerates the findings from the records.  The round-4
    block of study/findings.md and the README's sentence are exactly what ``study.retune`` writes from
    the committed records alone (no work directory), and the block quotes every sweep record's valid
    NLL: a record committed without ``python -m study --report-only`` fails here."""
    from study import retune

    results = plan.finished(tmp_path, REPO / plan.RECORDS / "cpu")
    findings = (REPO / "study" / "findings.md").read_text()
    block = _between(findings, retune.FINDINGS_START, retune.FINDINGS_END)
    assert block == "\n" + retune.findings_block(CPU, results)
    readme = (REPO / "README.md").read_text()
    assert _between(readme, retune.README_START, retune.README_END) == retune.readme_sentence(CPU, results)
    sweeps = _committed("sweep-*-24-s1")
    assert len(sweeps) >= len(plan.SWEEP_FAMILIES) * len(CPU.sweep_grid)
    for name, r in sweeps.items():
        assert retune.nll_cell(plan.finite_nll(r)) in block, name
    assert "(docs/fidelity.md)" in readme and "section 5" in _between(readme, retune.README_START, retune.README_END)


def test_the_generated_words_follow_the_records():
    """Where a family leaves the plateau, where the warm-up decides it, whether the old recipe held a
    family back, and the calls made on the retuned systems: each sentence changes with the records."""
    from study import retune

    grid = list(CPU.sweep_grid)
    old = (CPU.postnorm_lr, CPU.postnorm_warmup)
    rates = sorted({lr for lr, _ in grid})
    vals = {(fam, pt): 5.8 for fam in plan.SWEEP_FAMILIES for pt in grid}
    for pt in grid:  # transparent: off the plateau from the second rate up
        if pt[0] >= rates[1]:
            vals[("transparent-post", pt)] = 4.0 - pt[0]
    vals[("deepnorm", (old[0], 1000))] = 4.2  # DeepNorm: one point off, the old recipe's rate with 1000
    res = _records(vals)
    block = retune.findings_block(CPU, res)
    line = {fam: next(x for x in block.splitlines() if x.startswith(f"- **{report_name}**"))
            for fam, report_name in (("postnorm", "post-norm"), ("deepnorm", "DeepNorm"),
                                     ("transparent-post", "transparent (post-norm)"))}
    assert "Off the plateau at no point." in line["postnorm"]
    assert f"Off the plateau at every point from {plan.rate(rates[1])} up." in line["transparent-post"]
    assert f"Off the plateau at {plan.rate(old[0])} / 1000 only." in line["deepnorm"]
    assert f"Chosen: {plan.rate(old[0])} / 1000 (4.200)" in line["deepnorm"]
    assert f"the warm-up decides where a run ends for DeepNorm at {plan.rate(old[0])} (5.800 with " \
           f"{old[1]} warm-up updates, 4.200 with 1000" in block
    assert "The old recipe kept DeepNorm on the plateau" in block
    vals[("deepnorm", old)] = 4.5  # the old point off the plateau too: no longer held back, no flip
    block = retune.findings_block(CPU, _records(vals))
    assert "The old recipe kept" not in block and "decides where a run ends (on or off the plateau, or diverged) at no rate" in block
    del vals[("admin", grid[0])]
    block = retune.findings_block(CPU, _records(vals))
    assert "Chosen: not yet" in next(x for x in block.splitlines() if x.startswith("- **Admin**"))
    assert f"({len(vals)} of the {len(plan.SWEEP_FAMILIES) * len(grid)} points run)" in block

    # a diverged point is not "on the plateau": it neither shows the old recipe holding a family back nor
    # hides a warm-up that decides divergence
    vals = {(fam, pt): 5.8 for fam in plan.SWEEP_FAMILIES for pt in grid}
    vals[("deepnorm", old)], vals[("deepnorm", (old[0], 1000))] = None, 4.2
    block = retune.findings_block(CPU, _records(vals))
    assert "The old recipe kept" not in block
    assert f"for DeepNorm at {plan.rate(old[0])} (diverged with {old[1]} warm-up updates, 4.200 with 1000" in block
    # a partial grid: "so far", and no claim about a rate that has not run
    part = {("postnorm", (rates[0], 600)): 5.8, ("postnorm", (rates[-1], 600)): 4.0}
    assert retune.where_off(grid, plan.sweep_row(CPU, _records(part), "postnorm")) == \
        f"at every point from {plan.rate(rates[-1])} up so far"
    assert f"post-norm-24 at every point from {plan.rate(rates[-1])} up so far" in retune.readme_sentence(CPU, _records(part))
    assert "post-norm: not yet" in retune.readme_sentence(CPU, _records(part))
    # a family that fails everywhere chooses nothing and is said so, never "once their sweep has chosen"
    vals = {(fam, pt): 5.8 for fam in plan.SWEEP_FAMILIES for pt in grid}
    vals.update({("admin", pt): None for pt in grid})
    res = _records(vals)
    assert "Admin: none (it failed at every point of the grid)" in retune.readme_sentence(CPU, res)
    assert "none for Admin, which failed at every point of the grid" in retune.retuned_words(CPU, res)

    # a call made on the retuned systems: the old and the new call side by side, in the block and README
    new = (1e-3, 1000)
    vals = {(fam, pt): 5.0 for fam in plan.SWEEP_FAMILIES for pt in grid}
    vals[("postnorm", new)] = vals[("deepnorm", new)] = 3.0
    vals[("admin", old)] = vals[("transparent-post", old)] = 3.0
    res = _records(vals)
    assert "No call of the post-norm column has been made" in retune.findings_block(CPU, res)
    for n in CPU.depths:
        res.update(_converged(f"conv-postnorm-{n}", [10.0, 10.2, 9.9]))
        res.update(_converged(f"conv-deepnorm-{n}", [10.1, 9.8, 10.0]))
        res.update(_converged(f"retuned-deepnorm-{n}", [19.0, 19.2, 18.9], (*new, "adam")))
        res.update(_converged(f"retuned-postnorm-{n}", [10.0, 10.1, 9.9], (*new, "adam")))
    made, unchanged, waiting = retune.column_calls(CPU, res)
    calls = {what: (o, n) for what, o, n in made}
    o, n = calls["rescue of post-norm: DeepNorm-12 (retuned) vs post-norm-12 (retuned)"]
    assert o.startswith("no difference from post-norm-12") and n.startswith("better than post-norm-12 (retuned)")
    assert waiting == len(plan.postnorm_column_pairs(CPU)) - len(made) - unchanged > 0
    block = retune.findings_block(CPU, res)
    assert f"- rescue of post-norm: DeepNorm-12 (retuned) vs post-norm-12 (retuned): {o} -> {n}" in block
    assert "DeepNorm-12 at 1e-3 / 1000 on Adam: 3 of 3 seeds (valid NLL 4.000 / 4.000 / 4.000, test BLEU " \
           "19.00 / 19.20 / 18.90; every seed off the plateau)" in block
    res.update(_converged("retuned-deepnorm-24", [19.0, 19.2, None], (*new, "adam")))  # a seed diverged
    assert "DeepNorm-24 at 1e-3 / 1000 on Adam: 3 of 3 seeds (valid NLL 4.000 / 4.000 / diverged, test BLEU " \
           "19.00 / 19.20 / -; 2 of 3 seeds off the plateau, 1 of 3 seeds diverged)" in retune.findings_block(CPU, res)
    seeds = [{"valid_nll": 5.8}, {"valid_nll": 4.0}, {"valid_nll": None, "diverged": True}]
    assert retune._plateau_count(seeds) == "1 of 3 seeds on the plateau, 1 of 3 seeds off the plateau, 1 of 3 seeds diverged"
    assert retune._plateau_count(seeds[:1] * 3) == "every seed on the plateau"
    assert f"{len(made)} of the column's calls are made on them" in retune.readme_sentence(CPU, res)


def test_the_generated_words_replace_only_the_text_between_their_markers(tmp_path):
    from study import retune

    res = _records({(fam, pt): 5.8 for fam in plan.SWEEP_FAMILIES for pt in CPU.sweep_grid})
    findings, readme, bare = tmp_path / "findings.md", tmp_path / "README.md", tmp_path / "bare.md"
    findings.write_text(f"before\n{retune.FINDINGS_START}\nold words\n{retune.FINDINGS_END}\nafter\n")
    readme.write_text(f"**bold.** {retune.README_START}old{retune.README_END} tail\n")
    bare.write_text("no markers\n")
    assert retune.write(CPU, res, findings, readme) == (True, True)
    f, r = findings.read_text(), readme.read_text()
    assert f.startswith(f"before\n{retune.FINDINGS_START}\n**Round 4") and f.endswith(f"{retune.FINDINGS_END}\nafter\n")
    assert "old words" not in f and r.startswith(f"**bold.** {retune.README_START}The recipe sweep on valid")
    assert r.endswith(f"{retune.README_END} tail\n")
    assert retune.write(CPU, res, bare, bare) == (False, False) and bare.read_text() == "no markers\n"


def test_the_findings_quote_every_diagnostic_run_as_its_record_has_it():
    """The hand-written paragraph on DeepNet's/Admin's early-change diagnostics (section 5b) quotes each
    finished ``diag-*`` run's valid NLL at update 1000 (2 decimals) as its record has it: a new or
    changed diagnostic record without the words that go with it fails here."""
    records = _committed("diag-*-24-s1")
    assert len(records) >= 2
    para = _findings_after("Built for the rest of the issue: DeepNet's/Admin's early-change diagnostics")
    for name, r in records.items():
        assert f"{r['valid_nll']:.2f}" in para, name


def test_a_grid_that_grew_keeps_its_work_directory_and_one_that_lost_a_point_is_refused(tmp_path):
    """Sweep runs are named by their point, so a directory stamped with a smaller grid is reused and its
    stamp takes the larger one; a grid that lost a point (or moved one) is refused as other settings."""
    import dataclasses

    def stamp(grid):
        (tmp_path / "preset.json").write_text(json.dumps(dataclasses.asdict(
            dataclasses.replace(CPU, sweep_grid=tuple(grid))), default=list))

    grid = list(CPU.sweep_grid)
    assert len({lr for lr, _ in grid}) == 4 and max(lr for lr, _ in grid) == 3e-3  # grown once past 2e-3
    stamp([pt for pt in grid if pt[0] != 3e-3])  # the issue's 3 x 2
    plan.stamp_settings(tmp_path, CPU, "--work-dir")
    assert [tuple(pt) for pt in json.loads((tmp_path / "preset.json").read_text())["sweep_grid"]] == grid
    stamp(grid + [(4e-3, 600)])  # the directory's grid holds a point this one lacks
    with pytest.raises(SystemExit, match="other settings.*sweep_grid"):
        plan.stamp_settings(tmp_path, CPU, "--work-dir")


class _NllStudy:
    """A Study that trains nothing: every run "finishes" with the valid NLL ``nll(run)`` and a command
    that carries its recipe (as fairseq-train's would); the names it trained are kept, in order."""

    from study.run import Study
    run_all, selected = Study.run_all, Study.selected  # the study's own scheduler, with the training faked
    p, select, short_first = CPU, None, False

    def __init__(self, work, nll):
        self.work, self.nll, self.trained, self.records = work, nll, [], None

    def result(self, name, work_only=False):
        done = self.work / "runs" / name / "done.json"
        return json.loads(done.read_text()) if done.exists() else None

    def train(self, r):
        from deepnmt_fairseq.jobs.runner import write_atomic

        done = self.work / "runs" / r.name / "done.json"
        if not done.exists():
            self.trained.append(r.name)
            done.parent.mkdir(parents=True, exist_ok=True)
            lr, w = r.lr or CPU.lr, r.warmup or CPU.warmup
            write_atomic(done, json.dumps({  # as Study._save writes it: the scheduler reads while others write
                "name": r.name, "system": r.system, "seed": r.seed, "diverged": False, "bleu": 20.0,
                "valid_nll": self.nll(r), "returncode": 0,
                "command": f"fairseq-train --lr {lr:g} --warmup-updates {w} --optimizer {r.optimizer or 'adam'}"}))
        return json.loads(done.read_text())


@pytest.mark.parametrize("prenorm_prefers_the_column", [True, False])
def test_a_pre_norm_check_that_prefers_the_columns_point_sweeps_the_pre_norm_families_in_the_same_command(
        tmp_path, prenorm_prefers_the_column):
    """Issue 77, part 2: "If the other point is better on valid, the pre-norm families get the same grid and
    their converged runs are redone as well." One study command goes the whole chain (each step waits for
    the one before): the post-norm sweep, the pre-norm check at the column's choice, the pre-norm families'
    sweep on the grid plus their own point, and the converged runs again where a choice moved; where the
    check keeps the own point, no pre-norm run is added."""
    from study import run as runner
    from study.report import sweep_section

    column, pre_best, own = (2e-3, 1000), (1e-3, 1000), (CPU.lr, CPU.warmup)

    def nll(r):
        point = (r.lr, r.warmup)
        if r.name.startswith("sweep-") and "-12-" in r.name:  # the pre-norm check (prenorm and MSC at 12 layers)
            better = prenorm_prefers_the_column and "-prenorm-" in r.name
            return 4.0 if point == (column if better else own) else 4.5
        if r.name.startswith("sweep-"):
            fam = plan.sweep_point(r.system)[0]
            return 4.0 if point == (column if fam in plan.SWEEP_FAMILIES else pre_best) else 5.0
        return 4.0

    study = _NllStudy(tmp_path, nll)
    runner.run_study(study, CPU, ["postnorm-sweep", "converged"], [1, 2], jobs=1)
    res = plan.finished(tmp_path)
    pre = [f for f in plan.PRENORM_FAMILIES if f in (CPU.families or plan.FAMILIES)]
    n = plan.sweep_depth(CPU)
    pre_sweep = {plan.sweep_name(f, n, *pt) for f in pre for pt in plan.family_grid(CPU, f)}
    retuned_pre = {x for x in study.trained if x.startswith("retuned-") and x.split("-")[1] in ("prenorm", "dlcl", "msc", "transparent")
                   and "-post-" not in x}
    if not prenorm_prefers_the_column:
        assert plan.prenorm_check_verdict(CPU, res) == {"prenorm": "own", "msc": "own"}
        assert not pre_sweep & set(study.trained) and not retuned_pre
        assert plan.tuned_families(CPU, res) == plan.SWEEP_FAMILIES
        return
    assert plan.prenorm_check_verdict(CPU, res) == {"prenorm": "other", "msc": "own"}
    assert own in plan.family_grid(CPU, "prenorm") and own not in plan.family_grid(CPU, "postnorm")
    assert len(plan.family_grid(CPU, "prenorm")) == len(CPU.sweep_grid) + 1
    assert pre_sweep <= set(study.trained)  # every pre-norm family, every point, in this one command
    # and --runs can name them: its check is against plan.planned
    assert pre_sweep | retuned_pre <= set(plan.planned(CPU, [1, 2], results=res))
    check = study.trained.index(plan.sweep_name("prenorm", plan.middle_depth(CPU), *column))
    assert check < min(study.trained.index(x) for x in pre_sweep) < min(study.trained.index(x) for x in retuned_pre)
    for fam in pre:
        assert plan.sweep_choice(CPU, res, fam) == pre_best and plan.chosen_recipe(CPU, res, fam) == (*pre_best, "adam")
        depths = [d for d in CPU.depths if fam in plan.converged_families(CPU, d, res)]
        assert {f"retuned-{fam}-{d}-s{s}" for d in depths for s in (1, 2, 3)} <= retuned_pre
        for d in depths:  # the old converged system is superseded, with the pre-norm default named
            why = plan.superseded(CPU, res)[f"conv-{fam}-{d}"]
            assert f"pre-norm default {plan.point_text(*own)}" in why and "chosen on test" not in why
            assert plan.current_system(CPU, res, fam, d) == f"retuned-{fam}-{d}"
    assert "transparent-pre" not in plan.converged_families(CPU, CPU.depths[-1], res)  # not run at 24 before
    assert not any(x.startswith(f"retuned-transparent-pre-{CPU.depths[-1]}-") for x in study.trained)
    text = "\n".join(sweep_section(CPU, res))
    assert f"| prenorm-{n} |" in text and f"| {plan.point_text(*pre_best)} |" in text
    assert f"| postnorm-{n} |" in text.split(f"| prenorm-{n} |")[0]
    post_row = next(line for line in text.splitlines() if line.startswith(f"| postnorm-{n} |"))
    assert post_row.count("—") == 1  # the pre-norm families' own point is outside the column's grid
    # a second command finds nothing left to train
    before = list(study.trained)
    runner.run_study(study, CPU, ["postnorm-sweep", "converged"], [1, 2], jobs=1)
    assert study.trained == before


def test_the_runs_still_to_go_leave_out_and_name_the_families_whose_sweep_has_not_chosen(tmp_path):
    """The count of converged runs still to go covers the families with a choice; those whose sweep has
    not chosen yet are named apart, as not counted (the committed pre-norm check prefers the column's
    point, so with none of the pre-norm families' 24-layer sweep runs, all four are unchosen)."""
    from study import retune

    results = plan.finished(tmp_path, REPO / plan.RECORDS / "cpu")
    results = {k: v for k, v in results.items()
               if not (k.startswith("sweep-") and plan.sweep_point(v["system"])[0] in plan.PRENORM_FAMILIES
                       and f"-{plan.sweep_depth(CPU)}-" in k)}
    words = retune.retuned_words(CPU, results)
    left = len([x for x in plan.planned(CPU, [1, 2, 3], results=results)
                if x.startswith("retuned-") and x not in results])
    assert re.search(rf"; {left} runs? still to go, and those of pre-norm, transparent \(pre-norm\), DLCL and MSC "
                     r"once their sweep has chosen \(not counted yet\)\.$", words), words


def test_a_sweep_name_is_parsed_back_to_its_point_even_where_the_rate_holds_a_hyphen():
    """sweep_name writes the rate with :g, so 1e-05 puts a hyphen into the name: the family, rate,
    warm-up and depth still come back as written, from the run's name and its system's."""
    for fam in ("postnorm", "transparent-post", "msc"):
        for lr in (3e-3, 1e-05, 2.5e-4, 1.0):
            name = plan.sweep_name(fam, 24, lr, 600, seed=2)
            assert plan.sweep_point(name) == plan.sweep_point(name.rsplit("-s", 1)[0]) == (fam, lr, 600, 24)
    assert plan.sweep_point("conv-postnorm-24-s1") is None and plan.sweep_point("retuned-admin-6") is None
    assert plan.reference_family("deepnorm") == plan.reference_family("postnorm") == "postnorm"
    assert plan.reference_family("msc") == plan.reference_family("transparent-pre") == "prenorm"


def test_the_retuned_mark_names_a_pre_norm_familys_own_point_only_where_its_sentence_reads_one():
    """The [retuned] note names the grid a call's recipes were chosen on: a pre-norm family's grid holds its
    own point (3e-3 / 150) besides the column's, so the note says so where a [retuned] call reads a pre-norm
    family, and not in a sentence of post-norm families only, even once the pre-norm side is tuned."""
    from study import report

    grid, new, n = list(CPU.sweep_grid), (1e-3, 1000), CPU.depths[-1]
    at_new, own = (*new, "adam"), f"a pre-norm family's with its own point {plan.point_text(CPU.lr, CPU.warmup)}"
    vals = {(fam, pt): 5.0 for fam in plan.SWEEP_FAMILIES for pt in grid}
    for fam in plan.SWEEP_FAMILIES:
        vals[(fam, new)] = 3.0
    res = _records(vals)
    for r in plan.prenorm_check_runs(CPU, res):  # the check prefers the column's point: pre-norm is tuned too
        res[r.name] = {"name": r.name, "valid_nll": 4.0 if (r.lr, r.warmup) == new else 4.5, "diverged": False}
    pre = [f for f in plan.tuned_families(CPU, res) if f not in plan.SWEEP_FAMILIES]
    assert "prenorm" in pre and "msc" in pre
    for fam, bleus in (("postnorm", [10.0, 10.1, 9.9]), ("deepnorm", [20.0, 20.2, 19.9])):
        res.update(_converged(f"conv-{fam}-{n}", [10.0, 10.1, 9.9]))
        res.update(_converged(f"retuned-{fam}-{n}", bleus, at_new))

    def sentence(head):
        return next(s for s in report.paper_sentences(res, CPU) if s.startswith(f"- **{head}**"))

    deep = sentence("DeepNorm")
    assert re.search(rf"{n} layers: better \(\+[\d.]+\)[^;]* \[retuned\]", deep), deep
    assert "[retuned]: both sides" in deep and own not in deep
    # the pre-norm families' sweep chooses the same point; MSC's call against pre-norm is then [retuned]
    res.update(_records({(fam, pt): 3.0 if pt == new else 5.0 for fam in pre for pt in plan.family_grid(CPU, fam)}))
    assert all(plan.sweep_choice(CPU, res, fam) == new for fam in pre)
    for fam, bleus in (("prenorm", [15.0, 15.1, 14.9]), ("msc", [18.0, 18.2, 17.9])):
        res.update(_converged(f"conv-{fam}-{n}", [15.0, 15.1, 14.9]))
        res.update(_converged(f"retuned-{fam}-{n}", bleus, at_new))
    msc = sentence("MSC")
    assert re.search(rf"{n} layers: better \(\+[\d.]+\)[^;]* \[retuned\]", msc) and own in msc, msc
    assert own not in sentence("DeepNorm")


def test_a_long_run_of_the_first_phase_does_not_hold_back_the_tuning_chain(tmp_path):
    """With --jobs 2, Admin's large-batch run (phase 1, hours on a CPU) used to keep the second slot idle
    until it ended, since the tuning chain (the pre-norm check, the pre-norm sweep, the retuned converged
    runs) was planned only after the whole phase.  Now each finished run lets the chain go on at once.  The
    large-batch run, the phase's costliest (16 micro-batches an update: `_cost` counts them), starts first
    and holds its slot until a retuned run (planned once the sweep has chosen) has finished in the other."""
    import threading

    from study import run as runner

    chain_ran, started = threading.Event(), []
    big = plan.bigbatch_name(CPU)

    class Study(_NllStudy):
        def train(self, r):
            started.append(r.name)
            if r.name == big:
                assert chain_ran.wait(60), "the tuning chain waited for the large-batch run"
            out = super().train(r)
            if r.name.startswith("retuned-"):
                chain_ran.set()
            return out

    study = Study(tmp_path, lambda r: 4.0 if (r.lr, r.warmup) == (2e-3, 1000) else 5.0)
    runner.run_study(study, CPU, ["postnorm-sweep", "converged", "postnorm-diag"], [1, 2], jobs=2)
    assert started[0] == big and chain_ran.is_set()
    assert study.trained.index(big) > min(i for i, x in enumerate(study.trained) if x.startswith("retuned-"))
    assert len(study.trained) == len(set(study.trained))  # none trained twice


def test_a_setting_that_was_off_in_the_stamp_is_taken_and_one_that_changes_runs_is_refused(tmp_path):
    """A report of a preset without the sweep stamps its work directory with `sweep_grid: []`; turning the
    sweep (or the diagnostics, or the large batch) on later adds runs and changes none, so the stamp takes
    the new setting.  A changed setting of runs that may exist (the sweep's budget once on) is refused."""
    import dataclasses

    off = dataclasses.replace(CPU, sweep_updates=0, sweep_grid=(), diag_updates=0, bigbatch_freq=0)
    plan.stamp_settings(tmp_path, off, "--work-dir")
    plan.stamp_settings(tmp_path, CPU, "--work-dir")  # switched on: taken
    stamp = json.loads((tmp_path / "preset.json").read_text())
    assert stamp["sweep_updates"] == CPU.sweep_updates and stamp["bigbatch_freq"] == CPU.bigbatch_freq
    assert [tuple(pt) for pt in stamp["sweep_grid"]] == list(CPU.sweep_grid)
    with pytest.raises(SystemExit, match='sweep_updates'):
        plan.stamp_settings(tmp_path, dataclasses.replace(CPU, sweep_updates=CPU.sweep_updates + 1), "--work-dir")
    with pytest.raises(SystemExit, match='"lr"'):
        plan.stamp_settings(tmp_path, dataclasses.replace(off, lr=CPU.lr * 2), "--work-dir")


def test_the_large_batch_table_shows_an_unfinished_runs_curve_up_to_its_last_update():
    """Admin's large batch trains for hours: a deadline's partial record fills its row up to the update it
    reached, marked unfinished, and never carries a value past it; the finished record replaces it."""
    from study.report import diag_section

    big = plan.bigbatch_name(CPU)
    log = [(u, 10.0 - u / 100) for u in range(10, 631, 10)]
    part = {big: {"updates": 630, "valid_log": log, "unfinished": True}}
    row = next(x for x in diag_section(CPU, {}, part) if x.startswith(f"| {CPU.bigbatch_freq * CPU.max_tokens}"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "unfinished: 630 updates" in cells[0]
    assert cells[1:] == ["7.50", "5.00", "…", "…"]  # @250, @500 read; @750 and @1000 not reached
    done = {big: {"name": big, "valid_log": log + [(1000, 1.0)], "valid_nll": 3.0}}
    row = next(x for x in diag_section(CPU, done, part) if x.startswith(f"| {CPU.bigbatch_freq * CPU.max_tokens}"))
    assert "unfinished" not in row and row.rstrip(" |").endswith("1.00")
