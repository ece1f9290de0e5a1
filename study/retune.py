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
from .report import DISPLAY, FINDINGS, README, _call_cell, _short, call, replace_between

FINDINGS_START, FINDINGS_END = "<!-- retune:start -->", "<!-- retune:end -->"
README_START, README_END = "<!-- retune-readme:start -->", "<!-- retune-readme:end -->"

#: "off the plateau": valid NLL (bits/token) below this after the sweep's budget (2000 updates on the CPU
#: preset).  Our reading of the issue's "the plateau" (valid NLL 5.7-6.0 where the failing runs sat; the
#: issue's "below ~4.6, the working runs' level" was said of 1600 updates): a line between the lowest
#: plateau point of the sweep (5.6) and the highest point of a run that trains on (pre-norm-12 at its own
#: point, 4.96 after 2000 updates, 21 BLEU when converged).  A description of the curves, not a call.
PLATEAU_BELOW = 5.3

Point = Tuple[float, int]


def _lr(x: float) -> str:
    """A peak rate as the papers write it: 0.002 -> 2e-3, 0.0015 -> 1.5e-3."""
    mant, exp = f"{x:.6e}".split("e")
    return f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"


def _pt(point: Optional[Point]) -> str:
    return "not chosen yet" if point is None else f"{_lr(point[0])} / {point[1]}"


OPTIMIZER = {"adam": "Adam", "radam": "RAdam"}


def _nll(x: Optional[float]) -> str:
    return "…" if x is None else ("diverged" if not math.isfinite(x) else f"{x:.3f}")


def _names(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def off_plateau(row: Dict[Point, Optional[float]]) -> List[Point]:
    """The finished points of a family's sweep row below :data:`PLATEAU_BELOW`, in the row's order."""
    return [pt for pt, v in row.items() if v is not None and math.isfinite(v) and v < PLATEAU_BELOW]


def where_off(grid: Sequence[Point], row: Dict[Point, Optional[float]]) -> str:
    """Where a family leaves the plateau, in words: "at no point", "at every point", "at every point
    from <rate> up" when the points off it are exactly those at or above a rate, else the list."""
    off = off_plateau(row)
    done = [pt for pt in grid if row.get(pt) is not None]
    if not off:
        return "at no point"
    if set(off) == set(done):
        return "at every point"
    for lr in sorted({lr for lr, _ in grid}):
        if set(off) == {pt for pt in done if pt[0] >= lr}:
            return f"at every point from {_lr(lr)} up"
    return "at " + _names([_pt(pt) for pt in sorted(off)]) + " only"


def warmup_words(fam: str, grid: Sequence[Point], row: Dict[Point, Optional[float]]) -> Tuple[List[str], float]:
    """(the rates at which the warm-up decides the side of the plateau, in words; the largest difference
    between two warm-ups of one rate that stay on the same side)."""
    flips, same = [], 0.0
    for lr in sorted({lr for lr, _ in grid}):
        pts = [(w, row.get((lr, w))) for l2, w in grid if l2 == lr and row.get((lr, w)) is not None]
        pts = [(w, v) for w, v in pts if math.isfinite(v)]
        if len(pts) < 2:
            continue
        sides = {v < PLATEAU_BELOW for _, v in pts}
        if len(sides) > 1:
            flips.append(f"{DISPLAY[fam]} at {_lr(lr)} (" + ", ".join(
                f"{_nll(v)} with {w} warm-up updates" for w, v in sorted(pts)) + ")")
        else:
            same = max(same, max(v for _, v in pts) - min(v for _, v in pts))
    return flips, same


def family_line(p, results: Dict[str, dict], fam: str) -> str:
    """One family's row of the sweep in words: its valid NLL at every point (by warm-up, rates ascending),
    its choice, where it leaves the plateau, the old recipe's point and an edge of the grid."""
    grid, row = plan.family_grid(p, fam), plan.sweep_row(p, results, fam)
    rates = sorted({lr for lr, _ in grid})
    parts = []
    for w in sorted({w for _, w in grid}, reverse=True):
        rs = [lr for lr in rates if (lr, w) in grid]
        parts.append(" / ".join(_nll(row[(lr, w)]) for lr in rs) + f" with {w} warm-up updates"
                     + ("" if rs == rates else f" (at {' / '.join(_lr(lr) for lr in rs)})"))
    choice = plan.sweep_choice(p, results, fam)
    old = plan.old_recipe(p, fam)
    opt = plan.SWEEP_OPTIMIZER.get(fam, "adam")
    text = f"- **{DISPLAY[fam]}** ({OPTIMIZER[opt]}): " + "; ".join(parts) + ". "
    done = [v for v in row.values() if v is not None]
    if plan.sweep_failed(p, results, fam):
        text += "It diverged at every point of the grid: a finding, not a recipe. "
    elif choice is None:
        text += "Chosen: not yet (its grid is not complete). "
    else:
        text += f"Chosen: {_pt(choice)} ({_nll(row[choice])})"
        edge = plan.sweep_edge(p, results, fam)
        text += (f", at the grid's {edge} rate (reported, not chased: the rule chooses inside the grid). "
                 if edge else ". ")
    if done:
        text += f"Off the plateau {where_off(grid, row)}" + ("" if len(done) == len(row) else " so far") + "."
    if row.get((old[0], old[1])) is not None:
        text += (f" At the old point ({_pt(old[:2])}"
                 + ("" if opt == old[2] else f"; on {OPTIMIZER[opt]} here, the old runs used {OPTIMIZER[old[2]]}")
                 + f"): {_nll(row[(old[0], old[1])])}.")
    return text


def sweep_words(p, results: Dict[str, dict], families: Sequence[str], who: str) -> List[str]:
    """The paragraph of one side's sweep: its design, one line per family, what the grid shows."""
    grid = plan.family_grid(p, families[0])
    done = sum(1 for fam in families for pt in plan.family_grid(p, fam)
               if plan.sweep_row(p, results, fam)[pt] is not None)
    total = sum(len(plan.family_grid(p, fam)) for fam in families)
    rates = sorted({lr for lr, _ in grid})
    warm = sorted({w for _, w in grid})
    lines = [f"{who}: {_names([DISPLAY[f] for f in families])} at {plan.sweep_depth(p)} encoder layers, "
             f"{p.sweep_updates} updates, seed 1, at peak rates {' / '.join(_lr(lr) for lr in rates)} x warm-ups "
             f"{' / '.join(str(w) for w in warm)} ({done} of the {total} points run); the rule chooses the lowest "
             f"valid NLL (bits/token), and test is not read. Off the plateau: valid NLL below {PLATEAU_BELOW:g} "
             "after the budget (`study.retune.PLATEAU_BELOW`). A fixed budget favours the faster schedules, a "
             "bias of any fixed-budget tuning that the issue's rule accepts.", ""]
    if not done:
        return [lines[0].replace(f"({done} of the {total} points run)", f"(none of its {total} points has run yet)"), ""]
    lines += [family_line(p, results, fam) for fam in families] + [""]
    flips, same = [], 0.0
    for fam in families:
        f, s = warmup_words(fam, plan.family_grid(p, fam), plan.sweep_row(p, results, fam))
        flips += f
        same = max(same, s)
    held = [fam for fam in families if _old_held_back(p, results, fam)]
    shows = [f"the warm-up decides the side of the plateau for {_names(flips)}; "
             if flips else "the warm-up decides the side of the plateau at no rate; ",
             f"elsewhere two warm-ups of one rate differ by at most {same:.3f} bits, on the same side of it."]
    if held:
        shows.append(f" The old recipe kept {_names([DISPLAY[f] for f in held])} on the plateau, and the chosen "
                     "point leaves it: at this one seed, the recipe, not the method, held "
                     + ("it" if len(held) == 1 else "them") + " back there.")
    lines += ["What the grid shows (one seed per point, no call): " + "".join(shows), ""]
    return lines


def _old_held_back(p, results: Dict[str, dict], fam: str) -> bool:
    row, old, choice = plan.sweep_row(p, results, fam), plan.old_recipe(p, fam), plan.sweep_choice(p, results, fam)
    at_old = row.get((old[0], old[1]))
    return (choice is not None and at_old is not None and at_old >= PLATEAU_BELOW
            and row[choice] < PLATEAU_BELOW)


def check_words(p, results: Dict[str, dict]) -> str:
    """The pre-norm check (issue 77, part 2) in words, from its records."""
    mid, point = plan.middle_depth(p), plan.postnorm_point(p, results)
    own = {fam: results.get(plan.sweep_name(fam, mid, p.lr, p.warmup)) for fam in plan.PRENORM_CHECK}
    other = {fam: results.get(plan.sweep_name(fam, mid, *point)) if point else None for fam in plan.PRENORM_CHECK}
    fams = [DISPLAY[f] + f"-{mid}" for f in plan.PRENORM_CHECK]
    head = (f"The pre-norm side's check: {_names(fams)} at their own point ({_pt((p.lr, p.warmup))}) and at the "
            f"post-norm column's ({_pt(point)}, the point most of its families chose), {p.sweep_updates} updates, "
            "seed 1: ")
    if not all(own.values()) or not all(other.values()):
        return head + "not complete yet."
    verdict = plan.prenorm_check_verdict(p, results)
    vals = "; ".join(f"{DISPLAY[f]}-{mid} {_nll(plan.finite_nll(own[f]))} against {_nll(plan.finite_nll(other[f]))}"
                     for f in plan.PRENORM_CHECK)
    better = [DISPLAY[f] for f, v in verdict.items() if v == "other"]
    return head + vals + (". The column's point is better for " + _names(better) + ", so every pre-norm family "
                          "gets the grid too (`study.plan.prenorm_tuned`)." if better else
                          ". The own point is better (or as good) for both: the pre-norm side keeps its recipe.")


def retuned_words(p, results: Dict[str, dict]) -> List[str]:
    """Per retuned system with records: its seeds so far, valid NLL and test BLEU; then what is left."""
    prog, left = [], 0
    for r in {r.system: r for r in plan.retuned_runs(p, [1], results)}.values():
        fam, n = r.system[len("retuned-"):].rsplit("-", 1)
        recs = sorted(plan.retuned_records(p, results, fam, int(n)), key=lambda x: x.get("seed", 0))
        left += plan.CONVERGED_SEEDS - len(recs)
        if recs:
            prog.append(f"{DISPLAY[fam]}-{n} at {_pt((r.lr, r.warmup))} on {OPTIMIZER[r.optimizer]}: {len(recs)} of "
                        f"{plan.CONVERGED_SEEDS} seeds (valid NLL " + " / ".join(f"{x['valid_nll']:.2f}" for x in recs)
                        + ", test BLEU " + " / ".join(f"{x['bleu']:.2f}" for x in recs) + "; "
                        + _plateau_count(recs) + ")")
    unchosen = [DISPLAY[f] for f in plan.tuned_families(p, results) if plan.chosen_recipe(p, results, f) is None]
    rest = f"{left} runs still to go" + (f", and those of {_names(unchosen)} once their sweep has chosen"
                                          if unchosen else "")
    if not prog:
        return [f"The converged runs at the chosen recipes: none finished yet ({rest})."]
    return ["The converged runs at the chosen recipes (the study's convergence rule, where the choice moved from "
            "the old recipe): " + "; ".join(prog) + f"; {rest}."]


def _plateau_count(recs: Sequence[dict]) -> str:
    """Where a converged system's seeds ended: on the plateau (valid NLL >= PLATEAU_BELOW), off it, or
    diverged (no finite valid NLL), in words."""
    nll = [plan.finite_nll(x) for x in recs]
    on = sum(1 for v in nll if math.isfinite(v) and v >= PLATEAU_BELOW)
    div = sum(1 for v in nll if not math.isfinite(v))
    off = len(recs) - on - div
    if max(on, off, div) == len(recs):
        where = "on the plateau" if on else "off the plateau" if off else "diverged"
        return (f"every seed {where}" if len(recs) > 1 else where)
    return ", ".join(f"{k} of {len(recs)} seeds {w}" for k, w in ((on, "on the plateau"), (off, "off it"),
                                                                 (div, "diverged")) if k)


def column_calls(p, results: Dict[str, dict]) -> Tuple[List[Tuple[str, str, str]], int]:
    """([(comparison, old call, new call)] for every post-norm column comparison whose sides both have
    their current system (:func:`study.plan.column_sides`), the number that still wait)."""
    systems, made, waiting = plan.by_system(results), [], 0
    for kind, fam, n, ref, rn in plan.postnorm_column_pairs(p):
        sides, wait = plan.column_sides(p, results, fam, n, ref, rn)
        if wait or any(s not in systems for s in sides):
            waiting += 1
            continue
        a_old, b_old = f"conv-{fam}-{n}", f"conv-{ref}-{rn}"
        old = (_call_cell(call(a_old, systems[a_old], b_old, systems[b_old], close=p.close_bleu))
               if a_old in systems and b_old in systems else "not measured")
        new = _call_cell(call(sides[0], systems[sides[0]], sides[1], systems[sides[1]], close=p.close_bleu))
        made.append((f"{kind}: {_short(sides[0])} vs {_short(sides[1])}", old, new))
    return made, waiting


def findings_block(p, results: Dict[str, dict]) -> str:
    """The generated round-4 block of ``study/findings.md``."""
    old = plan.old_recipe(p)
    lines = ["**Round 4 (issue 77): the recipes, chosen on valid.** Generated by `study.retune` from the records "
             "at each `python -m study --report-only`: the numbers and the words that depend on them are computed. "
             f"Every post-norm run of the study (post-norm, DeepNorm, Admin, transparent post-norm) trained at lr "
             f"{_lr(old[0])} / {old[1]} warm-up on Adam, a point picked on *test* for post-norm 6-3; the sweep of "
             "section 5 chooses each family's point on valid.", ""]
    lines += sweep_words(p, results, plan.SWEEP_FAMILIES, "The post-norm column's sweep")
    lines += [check_words(p, results), ""]
    pre = [f for f in plan.tuned_families(p, results) if f not in plan.SWEEP_FAMILIES]
    if pre:
        lines += sweep_words(p, results, pre, "The pre-norm families' sweep (their own point added to the grid)")
    lines += retuned_words(p, results) + [""]
    made, waiting = column_calls(p, results)
    if made:
        lines += [f"The post-norm column's calls made on the chosen recipes ({len(made)}; {waiting} wait for "
                  "their runs; section 5c has every one), old call -> new call:", ""]
        lines += [f"- {what}: {o} -> {n}" for what, o, n in made]
    else:
        lines += [f"No call of the post-norm column has been made on the chosen recipes yet ({waiting} wait: a "
                  "call needs every seed of both sides at their current recipes). The old calls stand, marked in "
                  "the README as made on a test-chosen recipe; section 5c gives each one beside its new one as "
                  "the runs land."]
    return "\n".join(lines).rstrip() + "\n"


def readme_sentence(p, results: Dict[str, dict]) -> str:
    """The README's generated sentence on the retuning: the choices, where each family leaves the
    plateau, the converged runs so far and the calls made."""
    n = plan.sweep_depth(p)
    done = sum(1 for fam in plan.SWEEP_FAMILIES for v in plan.sweep_row(p, results, fam).values() if v is not None)
    total = len(plan.SWEEP_FAMILIES) * len(p.sweep_grid)
    fams = []
    for fam in plan.SWEEP_FAMILIES:
        row = plan.sweep_row(p, results, fam)
        finite = [v for v in row.values() if v is not None and math.isfinite(v)]
        fams.append(f"{DISPLAY[fam]}-{n} {where_off(plan.family_grid(p, fam), row)}"
                    + (f" (best {min(finite):.2f})" if finite else ""))
    made, waiting = column_calls(p, results)
    prog = retuned_words(p, results)[0]
    return (f"The recipe sweep on valid ([docs/fidelity.md](docs/fidelity.md) section 5; {n} layers, "
            f"{p.sweep_updates} updates, one seed, {done} of {total} grid points; the plateau: valid NLL of "
            f"{PLATEAU_BELOW:g} or more) chooses "
            + "; ".join(f"{DISPLAY[f]} {_pt(plan.sweep_choice(p, results, f))}" for f in plan.SWEEP_FAMILIES)
            + ". Off the plateau: " + "; ".join(fams) + ". " + prog + " "
            + (f"{len(made)} of the column's calls are made on them (section 5c)." if made else
               f"No call below has changed yet ({waiting} wait for their runs)."))


def write(p, results: Dict[str, dict], findings: Path = FINDINGS, readme: Path = README) -> Tuple[bool, bool]:
    """Rewrite the generated block of the findings and the README's sentence (each only where its
    markers are); (findings written, README written)."""
    return (replace_between(findings, FINDINGS_START, FINDINGS_END, "\n" + findings_block(p, results)),
            replace_between(readme, README_START, README_END, readme_sentence(p, results)))
