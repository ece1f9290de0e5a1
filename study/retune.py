"""Issue 77's findings in words, generated from the records: the recipe sweep of each side (the post-norm
column's, then the pre-norm families' once the pre-norm check calls for it), the pre-norm check, the
converged runs at the chosen recipes, and the calls made on them.

``python -m study --report-only`` (the committed CPU report) rewrites the block between
:data:`FINDINGS_START` / :data:`FINDINGS_END` in ``study/findings.md`` and the sentence between
:data:`README_START` / :data:`README_END` in the README; nothing outside the markers is touched.  Every
number and every "leaves the plateau" below is computed from the records, so a new record changes the
words with it (the sweep's choice itself is :func:`study.plan.sweep_choice`'s)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import plan
from .report import DISPLAY, FINDINGS, README, column_call_rows, nll_cell, replace_between, short_name

FINDINGS_START, FINDINGS_END = "<!-- retune:start -->", "<!-- retune:end -->"
README_START, README_END = "<!-- retune-readme:start -->", "<!-- retune-readme:end -->"

#: "off the plateau": valid NLL (bits/token) below this.  Our reading of the issue's "the plateau" (valid
#: NLL 5.7-6.0, where the failing runs sat; its "below ~4.6, the working runs' level" was said of 1600
#: updates): for the sweep's points (2000 updates on the CPU preset), a line between the sweep's lowest
#: plateau point (5.6) and the highest point of a run that trains on (pre-norm-12 at its own point, 4.96
#: after 2000 updates, 21 BLEU when converged).  Also applied to a converged run's best valid NLL, where the
#: plateau is the same (the failing converged runs ended at 5.7-6.0, the working ones below 4).  A
#: description of the curves, not a call: a sweep point above the line at a low rate may still be
#: descending (slow, not stuck), which its one number cannot tell.
PLATEAU_BELOW = 5.3

Point = Tuple[float, int]
OPTIMIZER = {"adam": "Adam", "radam": "RAdam"}


def _pt(point: Point) -> str:
    return plan.point_text(point[0], point[1])


def _names(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def side(v: float) -> str:
    """Where a finished point or run ended: "off" the plateau, "on" it, or "diverged" (inf)."""
    return "diverged" if not math.isfinite(v) else "off" if v < PLATEAU_BELOW else "on"


def where_off(grid: Sequence[Point], row: Dict[Point, Optional[float]]) -> str:
    """Where a family leaves the plateau among its finished points, in words: "at no point", "at every
    point", "at every point from <rate> up" when the points off it are exactly the finished ones at or above
    a finished rate, else the list; "so far" while the row is not complete."""
    done = [pt for pt in grid if row.get(pt) is not None]
    off = [pt for pt in done if side(row[pt]) == "off"]
    so_far = "" if len(done) == len(grid) else " so far"
    if not off:
        return "at no point" + so_far
    if off == done:
        return "at every point" + so_far
    for lr in sorted({lr for lr, _ in done}):
        if set(off) == {pt for pt in done if pt[0] >= lr}:
            return f"at every point from {plan.rate(lr)} up" + so_far
    return "at " + _names([_pt(pt) for pt in sorted(off)]) + " only" + so_far


def warmup_words(fam: str, grid: Sequence[Point], row: Dict[Point, Optional[float]]
                 ) -> Tuple[List[str], Optional[float]]:
    """(the rates at which the warm-up decides where a run ends, on or off the plateau or diverged, in
    words; the largest difference between two warm-ups of one rate that end on the same side, None where no
    rate has two such finished points)."""
    flips, same = [], None
    for lr in sorted({lr for lr, _ in grid}):
        pts = sorted((w, row[(lr, w)]) for l2, w in grid if l2 == lr and row.get((lr, w)) is not None)
        if len(pts) < 2:
            continue
        if len({side(v) for _, v in pts}) > 1:
            flips.append(f"{DISPLAY[fam]} at {plan.rate(lr)} (" + ", ".join(
                f"{nll_cell(v)} with {w} warm-up updates" for w, v in pts) + ")")
        elif all(math.isfinite(v) for _, v in pts):
            d = max(v for _, v in pts) - min(v for _, v in pts)
            same = d if same is None else max(same, d)
    return flips, same


def choice_words(p, results: Dict[str, dict], fam: str) -> str:
    """A family's choice in words: the point, "none (it failed at every point)" or "not yet"."""
    choice = plan.sweep_choice(p, results, fam)
    return (_pt(choice) if choice else "none (it failed at every point of the grid)"
            if plan.sweep_failed(p, results, fam) else "not yet")


def family_line(p, results: Dict[str, dict], fam: str) -> str:
    """One family's row of the sweep in words: its valid NLL at every point (by warm-up, rates ascending),
    its choice, where it leaves the plateau, the old recipe's point and an edge of the grid."""
    grid, row = plan.family_grid(p, fam), plan.sweep_row(p, results, fam)
    rates = sorted({lr for lr, _ in grid})
    parts = []
    for w in sorted({w for _, w in grid}, reverse=True):
        rs = [lr for lr in rates if (lr, w) in grid]
        parts.append(" / ".join(nll_cell(row[(lr, w)]) for lr in rs) + f" with {w} warm-up updates"
                     + ("" if rs == rates else f" (at {' / '.join(plan.rate(lr) for lr in rs)})"))
    choice, old = plan.sweep_choice(p, results, fam), plan.old_recipe(p, fam)
    opt = plan.SWEEP_OPTIMIZER.get(fam, "adam")
    text = f"- **{DISPLAY[fam]}** ({OPTIMIZER[opt]}): " + "; ".join(parts) + ". Chosen: "
    if choice is None:
        text += choice_words(p, results, fam) + ". "
    else:
        edge = plan.sweep_edge(p, results, fam)
        text += f"{_pt(choice)} ({nll_cell(row[choice])})" + (
            f", at the grid's {edge} rate (reported, not chased: the rule chooses inside the grid). " if edge else ". ")
    if any(v is not None for v in row.values()):
        text += f"Off the plateau {where_off(grid, row)}."
    if row.get(old[:2]) is not None:
        text += (f" At the old point ({_pt(old[:2])}"
                 + ("" if opt == old[2] else f"; on {OPTIMIZER[opt]} here, the old runs used {OPTIMIZER[old[2]]}")
                 + f"): {nll_cell(row[old[:2]])}.")
    return text.rstrip()


def _progress(p, results: Dict[str, dict], families: Sequence[str]) -> Tuple[int, int]:
    """(finished points, all points) of the families' grids."""
    rows = [plan.sweep_row(p, results, fam) for fam in families]
    return sum(v is not None for row in rows for v in row.values()), sum(len(row) for row in rows)


def sweep_words(p, results: Dict[str, dict], families: Sequence[str], who: str) -> List[str]:
    """The paragraph of one side's sweep: its design, one line per family, what the grid shows."""
    done, total = _progress(p, results, families)
    common = [tuple(pt) for pt in p.sweep_grid]
    extra = sorted({pt for fam in families for pt in plan.family_grid(p, fam)} - set(common))
    rates, warm = sorted({lr for lr, _ in common}), sorted({w for _, w in common})
    count = f"{done} of the {total} points run" if done else f"none of its {total} points has run yet"
    lines = [f"{who}: {_names([DISPLAY[f] for f in families])} at {plan.sweep_depth(p)} encoder layers, "
             f"{p.sweep_updates} updates, seed 1, at peak rates {' / '.join(plan.rate(lr) for lr in rates)} x warm-ups "
             f"{' / '.join(str(w) for w in warm)}"
             + (f", plus each family's own point {_names([_pt(pt) for pt in extra])}" if extra else "")
             + f" ({count}); the rule chooses the lowest valid NLL (bits/token), and test is not read. Off the "
             f"plateau: valid NLL below {PLATEAU_BELOW:g} after the budget (`study.retune.PLATEAU_BELOW`); a point above "
             "it at a low rate may be slow rather than stuck, which one number cannot tell. A fixed "
             "budget favours the faster schedules, a bias of any fixed-budget tuning that the issue's rule accepts.", ""]
    if not done:
        return lines
    lines += [family_line(p, results, fam) for fam in families] + [""]
    flips, same = [], None
    for fam in families:
        f, s = warmup_words(fam, plan.family_grid(p, fam), plan.sweep_row(p, results, fam))
        flips += f
        same = s if same is None else same if s is None else max(same, s)
    shows = [f"the warm-up decides where a run ends for {_names(flips)}"
             if flips else "the warm-up decides where a run ends (on or off the plateau, or diverged) at no rate"]
    if same is not None:
        shows.append(f"; {'elsewhere ' if flips else ''}two warm-ups of one rate differ by at most {same:.3f} bits, "
                     "on the same side of it")
    shows.append(".")
    held = [fam for fam in families if _old_held_back(p, results, fam)]
    if held:
        shows.append(f" The old recipe kept {_names([DISPLAY[f] for f in held])} on the plateau, and the chosen "
                     "point leaves it: at this one seed, the recipe, not the method, held "
                     + ("it" if len(held) == 1 else "them") + " back there.")
    lines += ["What the grid shows (one seed per point, no call): " + "".join(shows), ""]
    return lines


def _old_held_back(p, results: Dict[str, dict], fam: str) -> bool:
    """The old recipe's point ended on the plateau (finite, not diverged) and the chosen one off it."""
    row, old, choice = plan.sweep_row(p, results, fam), plan.old_recipe(p, fam), plan.sweep_choice(p, results, fam)
    at_old = row.get(old[:2])
    return choice is not None and at_old is not None and side(at_old) == "on" and side(row[choice]) == "off"


def check_words(p, results: Dict[str, dict]) -> str:
    """The pre-norm check (issue 77, part 2) in words, from its records."""
    mid, point = plan.middle_depth(p), plan.postnorm_point(p, results)
    fams = [DISPLAY[f] + f"-{mid}" for f in plan.PRENORM_CHECK]
    if point is None and all(plan.sweep_failed(p, results, f) for f in plan.SWEEP_FAMILIES):
        return ("The pre-norm side's check: no post-norm family chose a point (each failed at every point of the "
                "grid), so there is no column point to check; the pre-norm side keeps its recipe.")
    tie = plan.postnorm_point_tied(p, results)
    head = (f"The pre-norm side's check: {_names(fams)} at their own point ({_pt((p.lr, p.warmup))}) and at the "
            f"post-norm column's ({_pt(point) if point else 'not chosen yet'}, "
            + ("a tie of the families' choices, broken as `study.plan.postnorm_point` says" if tie else "the point most of its families chose")
            + f"; `study.plan.postnorm_point`), {p.sweep_updates} updates, seed 1: ")
    runs = {r.name: r for r in plan.prenorm_check_runs(p, results)}
    if point is None or any(name not in results for name in runs):
        return head + "not complete yet."
    vals = "; ".join(
        f"{DISPLAY[f]}-{mid} " + " against ".join(nll_cell(plan.finite_nll(results[r.name])) for r in runs.values()
                                                  if plan.sweep_point(r.system)[0] == f)
        for f in plan.PRENORM_CHECK)
    better = [DISPLAY[f] for f, v in plan.prenorm_check_verdict(p, results).items() if v == "other"]
    return head + vals + (". The column's point is better for " + _names(better) + ", so every pre-norm family "
                          "gets the grid too (`study.plan.prenorm_tuned`)." if better else
                          ". The own point is better (or as good) for both: the pre-norm side keeps its recipe.")


def _plateau_count(recs: Sequence[dict]) -> str:
    """Where a converged system's seeds ended (:func:`side` of their valid NLL), in words."""
    sides = [side(plan.finite_nll(x)) for x in recs]
    words = {"on": "on the plateau", "off": "off the plateau", "diverged": "diverged"}
    if len(set(sides)) == 1:
        return ("every seed " if len(recs) > 1 else "") + words[sides[0]]
    return ", ".join(f"{sides.count(k)} of {len(recs)} seeds {w}" for k, w in words.items() if sides.count(k))


def retuned_words(p, results: Dict[str, dict]) -> str:
    """Per retuned system with records: its seeds so far, valid NLL, test BLEU and where they ended; then
    what is left, and which families' reruns wait for their sweep."""
    prog, left = [], 0
    for fam, n, r in plan.retuned_systems(p, results):
        recs = sorted(plan.retuned_records(p, results, fam, n), key=lambda x: x.get("seed", 0))
        left += max(0, plan.CONVERGED_SEEDS - len(recs))
        if recs:
            prog.append(f"{DISPLAY[fam]}-{n} at {_pt((r.lr, r.warmup))} on {OPTIMIZER[r.optimizer]}: {len(recs)} of "
                        f"{plan.CONVERGED_SEEDS} seeds (valid NLL "
                        + " / ".join(nll_cell(plan.finite_nll(x)) for x in recs) + ", test BLEU "
                        + " / ".join("-" if x.get("bleu") is None else f"{x['bleu']:.2f}" for x in recs) + "; "
                        + _plateau_count(recs) + ")")
    tuned = plan.tuned_families(p, results)
    unchosen = [DISPLAY[f] for f in tuned if plan.sweep_choice(p, results, f) is None and not plan.sweep_failed(p, results, f)]
    failed = [DISPLAY[f] for f in tuned if plan.sweep_failed(p, results, f)]
    rest = [f"{left} run{'s' if left != 1 else ''} still to go" if left else "none left to run"]
    rest += [f"and those of {_names(unchosen)} once their sweep has chosen (not counted yet)"] if unchosen else []
    rest += [f"none for {_names(failed)}, which failed at every point of the grid"] if failed else []
    head = ("The converged runs at the chosen recipes (the study's convergence rule, where the choice moved from "
            "the old recipe): ")
    return head + ("; ".join(prog) if prog else "none finished yet") + "; " + ", ".join(rest) + "."


def column_calls(p, results: Dict[str, dict]) -> Tuple[List[Tuple[str, str, str]], int, int]:
    """([(comparison, old call, new call)] for every post-norm column comparison made on a retuned system
    (:func:`study.report.column_call_rows`), the number that stand unchanged (both sides kept their recipe),
    the number that still wait)."""
    made, unchanged, waiting = [], 0, 0
    for r in column_call_rows(p, results):
        if r["wait"]:
            waiting += 1
        elif any(s.startswith("retuned-") for s in r["sides"]):
            made.append((f"{r['kind']}: {short_name(r['sides'][0])} vs {short_name(r['sides'][1])}",
                         r["old_call"], r["new_call"]))
        else:
            unchanged += 1
    return made, unchanged, waiting


def findings_block(p, results: Dict[str, dict]) -> str:
    """The generated round-4 block of ``study/findings.md``."""
    old = plan.old_recipe(p)
    lines = ["**Round 4 (issue 77): the recipes, chosen on valid.** Generated by `study.retune` from the records "
             "at each `python -m study --report-only`: the numbers and the words that depend on them are computed. "
             "Every converged run of the post-norm column before round 4 (post-norm, DeepNorm, Admin, transparent "
             f"post-norm) trained at lr {_pt(old[:2])} warm-up on Adam, a point picked on *test* for post-norm 6-3; "
             "the sweep of section 5 chooses each family's point on valid.", ""]
    lines += sweep_words(p, results, plan.SWEEP_FAMILIES, "The post-norm column's sweep")
    lines += [check_words(p, results), ""]
    pre = [f for f in plan.tuned_families(p, results) if f not in plan.SWEEP_FAMILIES]
    if pre:
        lines += sweep_words(p, results, pre, "The pre-norm families' sweep")
    lines += [retuned_words(p, results), ""]
    made, unchanged, waiting = column_calls(p, results)
    kept = (f"; {unchanged} stand as they were, both sides having kept their recipe" if unchanged else "")
    if made:
        lines += [f"The post-norm column's calls made on the retuned systems ({len(made)}; {waiting} wait for their "
                  f"runs{kept}; section 5c has every one), old call -> new call:", ""]
        lines += [f"- {what}: {o} -> {n}" for what, o, n in made]
    else:
        lines += [f"No call of the post-norm column has been made on a retuned system yet ({waiting} wait: a call "
                  f"needs every seed of both sides at their current recipes{kept}). Until then the old calls stand; "
                  "section 5c gives each one beside its new one as the runs land."]
    return "\n".join(lines).rstrip() + "\n"


def readme_sentence(p, results: Dict[str, dict]) -> str:
    """The README's generated sentence on the retuning: the choices, where each family leaves the
    plateau, the converged runs so far and the calls made."""
    n = plan.sweep_depth(p)
    done, total = _progress(p, results, plan.SWEEP_FAMILIES)
    fams = []
    for fam in plan.SWEEP_FAMILIES:
        row = plan.sweep_row(p, results, fam)
        finite = [v for v in row.values() if v is not None and math.isfinite(v)]
        fams.append(f"{DISPLAY[fam]}-{n} {where_off(plan.family_grid(p, fam), row)}"
                    + (f" (best {min(finite):.2f})" if finite else ""))
    made, unchanged, waiting = column_calls(p, results)
    return (f"The recipe sweep on valid ([docs/fidelity.md](docs/fidelity.md) section 5; {n} layers, "
            f"{p.sweep_updates} updates, one seed, {done} of {total} grid points; the plateau: valid NLL of "
            f"{PLATEAU_BELOW:g} or more) chooses "
            + "; ".join(f"{DISPLAY[f]}: {choice_words(p, results, f)}" for f in plan.SWEEP_FAMILIES)
            + ". Off the plateau: " + "; ".join(fams) + ". " + retuned_words(p, results) + " "
            + (f"{len(made)} of the column's calls are made on them (section 5c)." if made else
               f"No call below has changed yet ({waiting} wait for their runs)."))


def write(p, results: Dict[str, dict], findings: Path = FINDINGS, readme: Path = README) -> Tuple[bool, bool]:
    """Rewrite the generated block of the findings and the README's sentence (each only where its
    markers are); (findings written, README written)."""
    return (replace_between(findings, FINDINGS_START, FINDINGS_END, "\n" + findings_block(p, results)),
            replace_between(readme, README_START, README_END, readme_sentence(p, results)))
