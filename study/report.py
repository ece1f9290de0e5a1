"""docs/fidelity.md from the finished runs of the study (``python -m study``): per comparison a table of
mean ± spread over seeds, the verdicts that the spreads allow, the plots, and every command.
Imports the plan (study.plan) only: the report is written from the records, without the runner."""

from __future__ import annotations

import math
import re
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .plan import (CONVERGED_SEEDS, DD_KINDS, FAMILIES, RECORDS, REPO, REPORTS, by_system,
                   converged_families, dd_choice, dd_depth, headline_pairs, partials, run_order, run_updates,
                   postnorm_point, prenorm_check_runs, stat, sweep_choice, sweep_depth, sweep_edge, sweep_table,
                   valid_interval, diag_runs, sweep_name, BIGBATCH, chosen_recipe, old_recipe,
                   retuned_name, superseded, SWEEP_FAMILIES, current_system, family_grid, tuned_families, retuned_runs,
                   postnorm_column_pairs, waiting_runs, column_sides, finite_nll,
                   prenorm_check_verdict, sweep_failed, middle_depth, postnorm_schedule, sweep_point, reference_family,
                   point_text, rate)
from .stats import ALPHA, BOOTSTRAP_SAMPLES, SEED_SAMPLES, decode_stats, paired_bootstrap, seed_bootstrap

FINDINGS = Path(__file__).with_name("findings.md")
#: the study's scripts that moved (issue 80, part 2: benchmarks/ -> study/), as the records made before cite
#: them (the evaluation script at its removed benchmarks/fidelity_eval.py): the records keep what was run,
#: the report prints the command a reader can type today
MOVED = ((re.compile(r"\bbenchmarks/fidelity_eval\.py\b"), "study/evaluate.py"),)
METRICS = (("final_train_loss", "train loss", False), ("valid_nll", "valid NLL", False),
           ("bleu", "test BLEU", True), ("train_bleu", "train-sample BLEU", True))


def current(command: str) -> str:
    """A recorded command with the study's moved scripts at their place today (:data:`MOVED`)."""
    for old, new in MOVED:
        command = old.sub(new, command)
    return command


def fmt(s: Optional[Tuple[float, float, int]], digits: int = 2) -> str:
    if s is None:
        return "-"
    mean, spread, n = s
    return f"{mean:.{digits}f} ± {spread:.{digits}f}" if n > 1 else f"{mean:.{digits}f} (1 seed)"


#: a call whose margin beyond the larger spread is under this many BLEU is labelled "narrowly"
#: (evidence round 3: one rule labels every thin call the same way)
NARROW_MARGIN = 0.5
#: still improving (evidence round 3): the valid NLL fell at each of the last K kept validations
#: (the curve checkpoints of a converged run, ``curve_every`` updates apart), by at least MIN_FALL bits each
IMPROVING_K = 3
IMPROVING_MIN_FALL = 0.01
BLEU_KEYS = ("bleu", "train_bleu")
UNKNOWN = "unknown"


def machine_of(r: dict) -> Dict[str, str]:
    """CPU model, ISA (the kernels torch used) and threads of a record's training, each "unknown"
    where neither the record nor the study's logs say it (``machine``, backfilled in round 3)."""
    m = r.get("machine") or {}
    return {"cpu": str(m.get("gpu") or m.get("cpu") or UNKNOWN), "isa": str(m.get("kernels") or UNKNOWN),
            "threads": str(m.get("threads") if m.get("threads") not in (None, "") else UNKNOWN)}


def cpu_type(r: dict) -> str:
    """The CPU type of a run: its model and ISA ("unknown" when either is)."""
    m = machine_of(r)
    if UNKNOWN in (m["cpu"], m["isa"]):
        return UNKNOWN
    cpu = m["cpu"].replace("(R)", "").replace(" Processor", "")
    return f"{cpu} {m['isa']}"


def machine_mark(a: List[dict], b: List[dict]) -> Tuple[str, str]:
    """("confounded" | "unknown" | "", text): a call is confounded when the CPU types of its two
    sides' runs differ (as sets), its machine unknown when every run of a side has no known type."""
    ta, tb = [cpu_type(r) for r in a], [cpu_type(r) for r in b]
    ka, kb = {t for t in ta if t != UNKNOWN}, {t for t in tb if t != UNKNOWN}

    def desc(ts):
        return ", ".join(f"{ts.count(t)}× {t}" for t in sorted(set(ts)))
    if ka and kb and ka != kb:
        return "confounded", f"confounded with the machine: {desc(ta)} against {desc(tb)}"
    if not ka or not kb:
        return "unknown", "machine unknown" + ("" if not (ka or kb) else f": {desc(ta)} against {desc(tb)}")
    if UNKNOWN in ta + tb:
        return "", f"machine partly unknown: {desc(ta)} against {desc(tb)}"
    return "", ""


def still_improving(r: dict) -> bool:
    """Whether a run's valid NLL still fell at each of its last IMPROVING_K kept validations (its
    curve checkpoints), by at least IMPROVING_MIN_FALL bits each: the early-stopping rule stopped it
    while its kept checkpoints were still improving."""
    vals = [pt.get("valid_nll") for pt in r.get("curve") or []]
    vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)][-IMPROVING_K:]
    return len(vals) == IMPROVING_K and all(x - y >= IMPROVING_MIN_FALL for x, y in zip(vals, vals[1:]))


def improving_seeds(runs: List[dict]) -> List[int]:
    return [r.get("seed") for r in runs if still_improving(r)]


def _values(runs: List[dict], key: str) -> List[float]:
    return [r[key] for r in runs if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def call(name_a: str, a: List[dict], name_b: str, b: List[dict], key: str = "bleu",
         higher_better: bool = True, close: float = 0.0) -> dict:
    """The study's one rule for a call (evidence round 3), applied to every comparison:

    * both systems have >= 2 seeds, and the means differ by more than each system's spread
      (max - min over seeds);
    * for test BLEU, when every run of both systems kept its sentence statistics: the paired
      bootstrap over the test sentences of the seed-mean BLEU (:func:`study.stats.paired_bootstrap`)
      gives p < ALPHA (records without them are called without it, and the call says so);
    * the seed-level test (:func:`study.stats.seed_bootstrap`: seeds resampled, then sentences;
      over seeds alone where the statistics are missing) gives p < ALPHA.

    A call that passes all three is ``better``/``worse``; one whose margin beyond the larger spread is
    under NARROW_MARGIN BLEU is ``narrowly better``/``narrowly worse``, whatever its p values.  Marks
    (they do not change the label): ``confounded`` when the sides' CPU types differ
    (:func:`machine_mark`), ``still improving`` seeds (:func:`still_improving`).  A difference under
    ``close`` with fewer than 3 seeds is marked as waiting for its third seed.

    Returns {"label", "text", "delta", "margin", "boot", "seed", "machine", "improving"}."""
    sa, sb = stat(a, key), stat(b, key)
    out = {"a": name_a, "b": name_b, "key": key, "label": "not measured", "delta": None, "margin": None,
           "boot": None, "seed": None, "machine": ("", ""), "improving": {}}
    if sa is None or sb is None:
        out["text"] = f"{name_a} vs {name_b}: not measured"
        return out
    diff = sa[0] - sb[0]
    out["delta"] = diff
    ra = [r for r in a if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    rb = [r for r in b if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    out["machine"] = machine_mark(ra, rb)
    out["improving"] = {n: improving_seeds(rs) for n, rs in ((name_a, ra), (name_b, rb)) if improving_seeds(rs)}
    marks = [t for t in (out["machine"][1],) if t] + [
        f"{n} still improving (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))} of {len(rs)})"
        for (n, rs) in ((name_a, ra), (name_b, rb)) for s in [out["improving"].get(n)] if s]
    tail = "".join(f" [{m}]" for m in marks)
    if min(sa[2], sb[2]) < 2:
        out["label"] = "no call"
        out["text"] = f"{name_a} vs {name_b}: {diff:+.2f} {key}, fewer than 2 seeds: no call{tail}"
        return out
    seeds = f"{sa[2]} vs {sb[2]} seeds"
    if abs(diff) < close and min(sa[2], sb[2]) < 3:
        seeds += f"; under {close:g} apart, so a third seed is planned (issue 16) and this call waits for it"
    sta = [decode_stats(r.get("test_stats")) for r in ra]
    stb = [decode_stats(r.get("test_stats")) for r in rb]
    boot = paired_bootstrap(sta, stb) if key == "bleu" else None
    sboot = seed_bootstrap(sta if key == "bleu" else None, stb if key == "bleu" else None,
                           scores=(_values(ra, key), _values(rb, key)))
    out["boot"], out["seed"] = boot, sboot
    paired = ("" if key != "bleu" else "; no paired bootstrap: records without sentence statistics" if boot is None
              else f"; paired bootstrap over {boot['sentences']} test sentences: p = {boot['p']:.3f}, 95% interval "
                   f"{boot['low']:+.2f} to {boot['high']:+.2f}")
    if sboot is not None:
        paired += (f"; seed-level bootstrap ({'seeds, then ' + str(sboot['sentences']) + ' sentences' if sboot['sentences'] else 'over seeds alone'}): "
                   f"p = {sboot['p']:.3f}")
    spread = max(sa[1], sb[1])
    out["margin"] = abs(diff) - spread
    if abs(diff) <= spread:
        out["label"] = "no difference"
        out["text"] = (f"{name_a} vs {name_b}: {diff:+.2f} {key}, within the spread ({spread:.2f}): "
                       f"no difference ({seeds}{paired}){tail}")
        return out
    if boot is not None and boot["p"] >= ALPHA:
        out["label"] = "no difference"
        out["text"] = (f"{name_a} vs {name_b}: {diff:+.2f} {key}, beyond the spreads ({sa[1]:.2f}, {sb[1]:.2f}) but "
                       f"not over the test sentences (p >= {ALPHA:g}): no difference ({seeds}{paired}){tail}")
        return out
    if sboot is None or sboot["p"] >= ALPHA:
        out["label"] = "no difference"
        out["text"] = (f"{name_a} vs {name_b}: {diff:+.2f} {key}, beyond the spreads ({sa[1]:.2f}, {sb[1]:.2f}) but "
                       f"not over the seeds (seed-level p >= {ALPHA:g}): no difference ({seeds}{paired}){tail}")
        return out
    better = (diff > 0) == higher_better
    narrow = key in BLEU_KEYS and out["margin"] < NARROW_MARGIN
    out["label"] = ("narrowly " if narrow else "") + ("better" if better else "worse")
    out["text"] = (f"{name_a} {out['label']} than {name_b}: {diff:+.2f} {key} "
                   f"(spreads {sa[1]:.2f}, {sb[1]:.2f}" + (f"; {out['margin']:.2f} beyond the larger, under "
                                                          f"{NARROW_MARGIN:g}: narrow" if narrow else "")
                   + f"; {seeds}{paired}){tail}")
    return out


def verdict(name_a: str, a: List[dict], name_b: str, b: List[dict], key: str = "bleu",
            higher_better: bool = True, close: float = 0.0) -> str:
    """The text of :func:`call`: the study's one rule for a call."""
    return call(name_a, a, name_b, b, key, higher_better, close)["text"]


def round2_label(a: List[dict], b: List[dict], key: str = "bleu", higher_better: bool = True) -> str:
    """The label the round-2 rule gave (spreads, then the paired bootstrap over sentences; no
    seed-level test, no narrow label): what :func:`changed_calls` compares with."""
    sa, sb = stat(a, key), stat(b, key)
    if sa is None or sb is None:
        return "not measured"
    if min(sa[2], sb[2]) < 2:
        return "no call"
    diff = sa[0] - sb[0]
    if abs(diff) <= max(sa[1], sb[1]):
        return "no difference"
    if key == "bleu":
        boot = paired_bootstrap([decode_stats(r.get("test_stats")) for r in a if isinstance(r.get(key), (int, float))],
                                [decode_stats(r.get("test_stats")) for r in b if isinstance(r.get(key), (int, float))])
        if boot is not None and boot["p"] >= ALPHA:
            return "no difference"
    return "better" if (diff > 0) == higher_better else "worse"


def sd(runs: List[dict], key: str = "bleu") -> str:
    """The sample standard deviation over seeds (n - 1), with n; '-' under 2 seeds."""
    vals = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return f"{statistics.stdev(vals):.2f} (n={len(vals)})" if len(vals) > 1 else "-"


def table(systems: Dict[str, List[dict]], names: List[str], extra: Tuple[Tuple[str, str], ...] = ()) -> List[str]:
    """Mean ± spread per metric, and the test BLEU's standard deviation over seeds."""
    labels = [label for _, label, _ in METRICS] + [label for _, label in extra] + ["test BLEU sd"]
    lines = ["| system | seeds | " + " | ".join(labels) + " |", "|" + "---|" * (2 + len(labels))]
    for n in names:
        runs = systems.get(n, [])
        failed = [r for r in runs if r.get("diverged")]
        cells = [fmt(stat(runs, k), 3 if ("loss" in k or "nll" in k) else 2) for k, _, _ in METRICS]
        cells += [fmt(stat(runs, k), 0 if k in ("stopped_at", "best_update") else 3) for k, _ in extra] + [sd(runs)]
        seeds = ",".join(str(r.get("seed")) for r in runs) or "-"
        if improving_seeds(runs):
            seeds += f" (still improving: {','.join(map(str, improving_seeds(runs)))})"
        if failed:
            seeds += f" ({len(failed)} failed/diverged: seed {','.join(str(r.get('seed')) for r in failed)})"
        lines.append(f"| {n} | {seeds} | " + " | ".join(cells) + " |")
    return lines


def _postnorm_schedule(p) -> str:
    lr, warmup = postnorm_schedule(p)
    return "" if (lr, warmup) == (p.lr, p.warmup) else f" (post-norm runs: lr {rate(lr)}, {warmup} warm-up updates)"


def is_committed(p, path: Path) -> bool:
    """Whether ``path`` is the committed CPU report: the one that also writes README's generated blocks
    (the evidence table here, issue 77's words in :mod:`study.retune`) and the findings' generated block."""
    return p.name == "cpu" and Path(path).resolve() == (REPO / REPORTS[p.name]).resolve()


def write_report(results: Dict[str, dict], preset, path: Path, work: Path,
                 planned: Optional[List[str]] = None, records: Optional[Path] = None) -> None:
    p = preset
    systems = by_system(results)
    committed = is_committed(p, path)
    dd_sel = dd_choice(work, records)
    pairs = headline_pairs(p, dd_sel["depth"] if dd_sel else None)

    made: List[dict] = []  # every call of the report, for the list of calls round 3's rule changed

    def calls(section: str) -> List[str]:  # the headline test-BLEU calls of one study
        out = []
        for a, b in pairs[section]:
            if a in systems:
                made.append(dict(call(a, systems[a], b, systems.get(b, []), close=p.close_bleu),
                                 old=round2_label(systems[a], systems.get(b, []))))
                out.append(f"- {made[-1]['text']}")
        return out or ["- none yet: the systems compared with a baseline have not finished"]
    img = path.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    tag = f"fidelity-{p.name}"
    lines = ["# Evidence study: each paper's effect, with models that learn", "",
             f"Generated by `python -m study --preset {p.name}` ({time.strftime('%Y-%m-%d')}) from "
             f"{len(results)} finished runs (their records: `{_rel(records or work)}`). Setting (preset `{p.name}`): width {p.dim}, FFN "
             f"{p.ffn}, {p.heads} heads, shared embeddings, dropout 0.1, Adam (0.9, 0.98), lr {rate(p.lr)}, inverse-sqrt "
             f"with {p.warmup} warm-up updates{_postnorm_schedule(p)}, {p.updates} updates of at most {p.max_tokens} tokens, label "
             f"smoothing 0.1, {p.bpe} joint BPE merges{', ' + ' '.join(p.extra) if p.extra else ''}; the last 3 "
             f"checkpoints ({p.save_every} updates apart) are averaged and evaluated. Train loss: mean of the last "
             "5 logged intervals (base 2, label-smoothed). Valid NLL: bits/token of the valid references, no "
             "label smoothing (`study/evaluate.py`). BLEU: detokenized "
             "sacreBLEU (13a) of beam-4 translations against the raw references, on the test split and on the "
             f"first {p.train_sample} training pairs (train-sample BLEU, the degradation test of MSC Fig. 2). "
             "Each cell is the mean ± spread (max − min) over seeds; the last column is the standard deviation "
             "of test BLEU over seeds (n − 1). One rule makes every call "
             "(`study.report.call`): a difference is called only when it exceeds both systems' spreads, "
             f"when, for test BLEU, the paired bootstrap over the test sentences ({BOOTSTRAP_SAMPLES} "
             f"resamples of the seed-mean sacreBLEU, `study/stats.py`) gives p < {ALPHA:g} "
             "(runs recorded before their sentence statistics were kept are called without it, and their calls "
             f"say so), and when the seed-level test gives p < {ALPHA:g}: a hierarchical bootstrap "
             f"({SEED_SAMPLES} resamples) that draws each system's seeds with replacement, then the test "
             "sentences, and compares the resampled seed means (over the seeds' scores alone where the "
             "sentence statistics are missing; `study.stats.seed_bootstrap`). A call whose difference "
             f"exceeds the larger spread by less than {NARROW_MARGIN:g} BLEU is labelled *narrowly* better or "
             "worse. Marks that do not change a label: *confounded* when the two sides' runs ran on different "
             "CPU types (model and ISA, the records' `machine`), *still improving* when a seed's valid NLL "
             f"still fell at each of its last {IMPROVING_K} kept validations (converged runs). BLEU is always "
             "that of the average of the last 3 checkpoints at the stop, not of the valid-best checkpoint.", ""]
    unfinished = partials(records, results)  # runs a deadline stopped: section 1c
    if planned is not None:
        missing = [n for n in planned if n not in results]
        failed = sorted(n for n, r in results.items() if r.get("diverged"))
        extra = sorted(set(results) - set(planned))  # records of runs the plan no longer holds
        hours = remaining_hours(p, missing, results)
        waiting = {pat for _, pat, n, _ in order_budget(p, [r.name for r in waiting_runs(p, results, planned)], results)
                   if n and pat != "*"}  # steps whose runs wait for the sweep's choice (not planned yet)
        lines += [f"**Status: {len(planned) - len(missing)} of {len(planned)} planned runs finished"
                  + (f" ({len(failed)} failed or diverged: {', '.join(failed)})" if failed else "") + ".**"
                  + (f" Of the others, {len(unfinished)} {'was' if len(unfinished) == 1 else 'were'} stopped part-way by a "
                     f"deadline ({'its valid curve' if len(unfinished) == 1 else 'their valid curves'}: section 1c)."
                     if unfinished else "")
                  + (f" The other {len(extra)} of the {len(results)} finished records ({', '.join(extra)}) are of "
                     "runs the plan no longer holds, kept where the findings read them." if extra else "")
                  + (f" Not yet run: {', '.join(missing)}. The same command resumes the study; every "
                     "comparison below is read only from what has finished." if missing else "")
                  + (f" Budget of what is left: at most {hours:.0f} core-hours (about {hours / 2:.0f} hours on "
                     "2 cores with `--jobs 2`), each run at its update cap, at the core-seconds per update of the "
                     "finished runs of its encoder depth (`study.report.remaining_hours`); early stopping "
                     "shortens the converged runs. Order (`study.plan.run_order`, the cheapest decisive runs "
                     f"first), one `python -m study --preset {p.name} --order short-first --runs "
                     "PATTERN` after another, each with the runs not yet finished and their core-hours at the cap: "
                     + "; ".join(f"{i}. {what} (`{pat}`: {n} run{'s' if n > 1 else ''}, ≤ {h:.1f} core-hours)" if n else
                                 f"{i}. {what} (`{pat}`): " + ("waits for the sweep" if pat in waiting else
                                                               "done" if _matches(planned, pat) else
                                                               "none planned")
                                 for i, (what, pat, n, h) in enumerate(order_budget(p, missing, results), 1))
                     + ". A stopped run resumes from the checkpoints in its work directory only: where `work/` "
                     "does not outlive a session (a fresh checkout each time), start only what finishes before "
                     "the session ends." if missing and hours else "") + waiting_sentence(p, results, planned), ""]
    if p.name == "cpu":  # the hand-written findings (both presets) live in one report, the CPU one's
        lines += [FINDINGS.read_text().strip(), ""] if FINDINGS.exists() else []
    elif p.name != "tiny":
        lines += ["The findings, written by hand for both presets, are in "
                  "[docs/fidelity.md](fidelity.md#findings).", ""]

    # 1. depth
    depth_names = [f"{fam}-{n}" for fam in FAMILIES for n in p.depths]
    if any(n in systems for n in depth_names):
        lines += ["## 1. Depth (MSC Fig. 2 / Table 3; Bapna et al. Table 1)", "",
                  f"Encoders of {'/'.join(map(str, p.depths))} layers, {p.decoder_layers} decoder layers; MSC has "
                  f"{p.decoder_layers} blocks of N/{p.decoder_layers} layers.", ""]
        lines += table(systems, [n for n in depth_names if n in systems])
        lines += ["", "Calls (test BLEU):", ""] + calls("depth")
        for fam in FAMILIES:  # degradation: does the deepest model fit its training data worse than the shallowest?
            lo, hi = f"{fam}-{p.depths[0]}", f"{fam}-{p.depths[-1]}"
            if lo != hi and lo in systems and hi in systems:
                made.append(dict(call(hi, systems[hi], lo, systems[lo], 'train_bleu'),
                                 old=round2_label(systems[hi], systems[lo], 'train_bleu')))
                lines.append(f"- degradation, {made[-1]['text']}")
        _plot_depth(systems, p, img / f"{tag}-depth.png")
        lines += ["", f"![depth](img/{tag}-depth.png)", ""]

    # 1b. converged depth comparison
    conv_names = [f"conv-{fam}-{n}" for n in p.depths for fam in converged_families(p, n, results)]
    if any(n in systems for n in conv_names):
        lines += ["## 1b. Depth, converged: every system stops by one rule on the valid set", "",
                  f"The systems of section 1, trained until the valid loss (validated every {valid_interval(p)} "
                  "updates, at every checkpoint save, and at the end of every epoch, as fairseq-train does) has "
                  f"not improved for {p.converged_patience} validations (about "
                  f"{p.converged_patience * valid_interval(p)} updates), or {p.converged_cap} updates "
                  f"at most; the last 3 checkpoints averaged and evaluated as in section 1, {CONVERGED_SEEDS} seeds at "
                  "least. `stopped at` / `best` are update counts. At the deepest depth: post-norm, pre-norm, DLCL, "
                  "MSC, DeepNorm and the transparent variant with the lower valid NLL at the middle depth. The section-1 "
                  f"tables are the short-budget setting ({p.updates} updates).", ""]
        lines += table(systems, [n for n in conv_names if n in systems],
                       (("stopped_at", "stopped at"), ("best_update", "best")))
        gone = superseded(p, results)
        if gone:
            lines += ["", "Superseded (issue 77; the records stay, the findings read the new systems: section 5c):", ""]
            lines += [f"- {old}: {why}" for old, why in gone.items()]
        lines += ["", "Calls (test BLEU):", ""] + calls("converged")
        lines += ["", "Every converged run: where it ran and whether it was still improving when it stopped. "
                  f"A run is *still improving* when its valid NLL fell at each of its last {IMPROVING_K} kept "
                  f"validations (the single checkpoints every {p.curve_every} updates of the curves) by at least "
                  f"{IMPROVING_MIN_FALL:g} bits each (`study.report.still_improving`): the patience rule "
                  "stopped it after about "
                  f"{p.converged_patience * valid_interval(p)} updates without a new best, while its kept checkpoints "
                  "were still falling. Its test BLEU, like every run's, is that of the average of the last 3 "
                  f"checkpoints at the stop (`stopped at`, {p.save_every} updates apart), about "
                  f"{p.converged_patience * valid_interval(p)} updates past the valid-best checkpoint (`best`): "
                  "chosen without the test set, but not the valid-best model. CPU, ISA and threads are the "
                  "record's `machine` (\"unknown\" where neither the record nor the study's notes say it).", ""]
        lines += run_table([r for n in conv_names for r in systems.get(n, [])])
        if any(r.get("curve") for n in conv_names for r in systems.get(n, [])):
            _plot_converged(systems, conv_names, img / f"{tag}-converged.png")
            lines += ["", f"![BLEU vs updates](img/{tag}-converged.png)", "",
                      f"Test BLEU of the single checkpoint every {p.curve_every} updates (not averaged), mean over "
                      "the seeds that reached it (their number in brackets where fewer than the system's seeds "
                      "did: the others had stopped, or lost the point, as the findings say): where each system "
                      "would be at any budget.", ""]
            lines += curve_table(systems, [n for n in conv_names if n in systems]) + [""]
        weights = weights_table({n: systems[n] for n in conv_names if n in systems})
        if weights:
            lines += ["Learned layer weights of the averaged checkpoints (`layer_weights` of the records, "
                      "`EncoderMemory.learned_weights`; `study.report.weights_table`):", ""] + weights + [""]
        lines.append("")

    # 1c. runs a deadline stopped: their logs' valid curves, no call
    if unfinished:
        lines += ["## 1c. Unfinished runs: valid NLL by updates, from their training logs", "",
                  "Runs stopped by `--deadline-minutes` before their rule stopped them (a machine lent for "
                  "minutes loses their checkpoints with it), kept as `<records>/partial/<run>.json` "
                  "(`study.run.partial_record`): fairseq's valid NLL (bits/token, no label smoothing, "
                  "the training model at that update, not an average of checkpoints) at each validation, the "
                  "train loss (mean of the last 5 logged intervals) and the speed at the stop. No checkpoint "
                  "is averaged and no test sentence is translated: no call is made on them, and the run's "
                  "record replaces its partial one when it finishes.", ""] + partial_table(unfinished, valid_interval(p)) + [""]

    # 2. deep decoder
    search = [f"dd-plain-{p.dd_encoder}-{d}" for d in p.dd_depths]
    if any(n in systems for n in search):
        gap = (("unk_gap", "UNK-source gap (bits)"),)
        lines += ["## 2. Deep decoder: CAD and collapse-reducing training (Sec. 3-4)", "",
                  f"Search (plain, {p.dd_encoder}-layer encoder, seed 1): decoder depths "
                  f"{'/'.join(map(str, p.dd_depths))}; the shallow ({p.dd_depths[0]}) and the chosen depth then "
                  "get every seed, so that the premise (the deeper plain decoder is worse) is a call of its own. "
                  "The UNK-source gap is the valid NLL with every source token "
                  "replaced by `<unk>` minus the NLL with the real source (bits/token): a decoder that ignores its "
                  "source has a gap near 0.", ""]
        lines += table(systems, [n for n in search if n in systems], gap)
        if dd_sel:
            dec = dd_sel["depth"]
            lines += ["", f"Chosen depth: {dd_sel['why']}.", ""]
            names = [f"dd-{k}-{p.dd_encoder}-{dec}" for k in DD_KINDS]
            lines += table(systems, [n for n in names if n in systems], gap)
            lines += ["", "Calls:", ""] + calls("deep-decoder")
            for n in names[1:]:
                if n in systems:
                    made.append(dict(call(n, systems[n], names[0], systems.get(names[0], []), 'unk_gap'),
                                     old=round2_label(systems[n], systems.get(names[0], []), 'unk_gap')))
                    lines.append(f"- {made[-1]['text']}")
        lines.append("")

    # 3. GPKD
    base = f"prenorm-{p.depths[0]}"
    gp_names = [f"gpkd-teacher-{p.teacher_layers}", base, f"gpkd-student-{p.depths[0]}", f"skd-only-{p.depths[0]}",
                f"{base}-matched", f"skd-only-{p.depths[0]}-matched"]
    if any(n in systems for n in gp_names[:1] + gp_names[2:]):
        lines += ["## 3. GPKD (Li et al. Tables 1, 6)", "",
                  f"Teacher: {p.teacher_layers}-layer pre-norm encoder GP-trained with group size h = "
                  f"{p.teacher_layers // p.depths[0]} for {int(p.updates * p.stage1_factor)} updates, averaged; seed 1's "
                  "translations of the training set are the SKD data and its layers initialise the student (the "
                  "paper distils one teacher; the other seeds measure the teacher against the baseline). Student: "
                  f"{p.depths[0]}-{p.decoder_layers}, initialised with one layer per group "
                  "(`deepnmt-extract-student`) or from scratch, trained on the SKD data; baseline: the same "
                  "shape on the references. Matched compute (`-matched`): the baseline and the SKD-only student "
                  f"trained for {int(p.updates * p.stage1_factor) + p.updates} updates, as long as the GPKD student "
                  "with its teacher's training; the GPKD ordering is called against these.", ""]
        lines += table(systems, [n for n in gp_names if n in systems])
        lines += ["", "Calls:", ""] + calls("gpkd") + [""]

    # 4. skipping sub-layer
    s1 = f"ssl-stage1-{p.ssl_layers}"
    ssl_names = [s1, f"ssl-stage2-plain-{p.ssl_layers}", f"ssl-stage2-skip-{p.ssl_layers}"]
    if any(n in systems for n in ssl_names):
        st = systems.get(s1, [{}])[0]
        lines += ["## 4. Skipping sub-layer, two-stage training (Li et al. Tables 3-4)", "",
                  f"Stage 1: {p.ssl_layers}-layer pre-norm encoder, validated every {valid_interval(p)} updates, "
                  f"patience {p.patience}, at most {int(p.updates * p.stage1_factor)} updates (best valid loss at "
                  f"update {st.get('best_update')}, stopped at {st.get('stopped_at')}). Stage 2: "
                  f"{int(p.updates * p.stage2_factor)} more updates from stage 1's best checkpoint with its Adam "
                  "state, schedule and update count (`--continue-once`), with skipping (phi 0.4) or without.", ""]
        lines += table(systems, [n for n in ssl_names if n in systems])
        lines += ["", "Calls:", ""] + calls("ssl")
        lines.append("")

    if p.sweep_updates:
        lines += sweep_section(p, results)
    if p.diag_updates:
        lines += diag_section(p, results, unfinished)
    if p.sweep_updates and p.converged_cap:
        lines += column_calls_section(p, results)

    if made:
        changed = changed_calls(made)
        confounded = [c for c in made if c["machine"][0] == "confounded"]
        improving = [c for c in made if c["improving"]]
        lines += ["## Round 3: the calls the seed-level rule changed, and the marks", "",
                  f"Of the report's {len(made)} calls, {len(changed)} changed label from the round-2 rule (spreads "
                  "and the paired bootstrap over sentences) to round 3's (the same, plus the seed-level bootstrap and "
                  f"the narrow label: `study.report.call`); {len(confounded)} are confounded with the machine (their "
                  f"sides ran on different CPU types) and {len(improving)} compare a system with a still-improving "
                  "seed.", ""] + (changed or ["- none"]) + [""]
        if confounded:
            lines += ["Confounded with the machine (the call stands as the rule makes it; the CPU type cannot be "
                      "told apart from the system):", ""]
            lines += [f"- {c['a']} vs {c['b']} ({c['key']}, {c['label']}): {c['machine'][1]}" for c in confounded] + [""]
    curves = {k: v for k, v in results.items() if v.get("losses") and not k.startswith("sweep-")}
    if curves:
        _plot_curves(curves, img / f"{tag}-curves.png")
        lines += [f"![training curves](img/{tag}-curves.png)", ""]
    lines += ["## Commands", "", "Every number above comes from these commands (paths relative to the "
              "repository; the data directory is built by `python -m study`).", ""]
    for name in sorted(results):
        r = results[name]
        lines.append(f"- `{name}`: `{current(r.get('command', ''))}`" +
                     (f"; metrics: `{current(r['eval_command'])}`" if r.get("eval_command") else ""))
    for name, r in unfinished.items():
        lines.append(f"- `{name}` (unfinished, section 1c; stopped after {r.get('train_seconds', 0):.0f} s of "
                     f"training): `{current(r.get('command', ''))}`")
    path.write_text("\n".join(lines) + "\n")
    if committed:
        write_evidence_table(results, p)  # the committed report's records: README's table and its page


def nll_cell(v: Optional[float]) -> str:
    """A sweep point's valid NLL as the report and the findings write it: ``…`` not run yet, ``diverged``
    (inf: :func:`study.plan.finite_nll`), else 3 decimals."""
    return "…" if v is None else "diverged" if not math.isfinite(v) else f"{v:.3f}"


def sweep_section(p, results: Dict[str, dict]) -> List[str]:
    """Section 5: the post-norm column's tuning sweep (issue 77): family x grid point -> valid NLL at the
    budget, the chosen point (:func:`study.plan.sweep_choice`: the lowest valid NLL) in bold."""
    n, tab = sweep_depth(p), sweep_table(p, results)
    grid = list(dict.fromkeys(pt for fam in tab for pt in family_grid(p, fam)))  # a pre-norm family's own point last
    head = [point_text(lr, w) for lr, w in grid]
    pre = [fam for fam in tab if fam not in SWEEP_FAMILIES]
    out = ["## 5. The post-norm column's recipe, chosen on valid (issue 77)", "",
           f"Every post-norm family" + (f" and, since the pre-norm check below called for it, every pre-norm family "
                                        f"({', '.join(DISPLAY[f] for f in pre)}; with its own point {point_text(p.lr, p.warmup)}"
                                        f" added to the grid)" if pre else "")
           + f" at {n} encoder layers ({p.decoder_layers} decoder layers), seed 1, "
           f"{p.sweep_updates} updates of at most {p.max_tokens} tokens, no clipping, at each peak lr / warm-up "
           "of the grid (inverse-sqrt decay); Admin on RAdam (`--optimizer radam`, as its authors train it), the "
           "others on Adam (0.9, 0.98). Each cell is the valid NLL (bits/token) of the average of the last 3 "
           "checkpoints; the test set is not translated (`study/evaluate.py --valid-only`). The rule "
           "(`study.plan.sweep_choice`): a family's recipe is its grid point with the lowest valid NLL, "
           "chosen once every point has finished (**bold**); `…` not run yet, `diverged` a run that failed, "
           "`—` a point outside the family's grid.", "",
           "| family | " + " | ".join(head) + " | chosen |", "|---" * (len(head) + 2) + "|"]
    for fam, row in tab.items():
        best = sweep_choice(p, results, fam)
        cells = []
        for pt in grid:
            v = row.get(pt, "—")
            cell = v if v == "—" else nll_cell(v)
            cells.append(f"**{cell}**" if pt == best else cell)
        out.append(f"| {fam}-{n} | " + " | ".join(cells) + " | "
                   + (point_text(*best[:2]) if best else "none: failed at every point of the grid"
                      if sweep_failed(p, results, fam) else f"not yet ({sum(v is None for v in row.values())} "
                                                             f"of {len(row)} to run)") + " |")
    edges = [(fam, sweep_edge(p, results, fam)) for fam in tab]
    edges = [(fam, e) for fam, e in edges if e]
    if edges:
        rates = sorted({lr for lr, _ in grid})
        out += ["", "On the grid's edge (`study.plan.sweep_edge`): the lowest valid NLL so far lies at the grid's "
                + "; ".join(f"{e} peak rate ({rate(rates[-1] if e == 'highest' else rates[0])}) for {fam}" for fam, e in edges)
                + ". The rule chooses inside the grid, so a rate beyond it was not tried: the optimum may lie there."]
    point = postnorm_point(p, results)
    check = prenorm_check_runs(p, results)
    mid = middle_depth(p)
    out += ["", f"The pre-norm side's check (issue 77, part 2): pre-norm and MSC at {mid} layers, the same budget "
            f"and rule, at their own point ({point_text(p.lr, p.warmup)}) and at the post-norm column's (the point most "
            "of its families chose, `study.plan.postnorm_point`: "
            + (point_text(*point[:2]) if point else "not chosen yet") + "). Where the other point is better "
            "on valid for either, every pre-norm family gets the grid (with its own point; `study.plan.prenorm_tuned`) "
            "and its converged runs are redone where its choice moves.", "",
            "| system | point | valid NLL |", "|---|---|---|"]
    for r in check:
        res = results.get(r.name)
        v = None if res is None else finite_nll(res)
        out.append(f"| {sweep_point(r.system)[0]}-{mid} | {point_text(r.lr, r.warmup)} | {nll_cell(v)} |")
    verdict = prenorm_check_verdict(p, results)
    if verdict:
        out += [""] + [f"- {fam}-{mid}: " + ("its own point is better on valid (or as good): its runs stand" if v == "own"
                                              else "the column's point is better on valid: the pre-norm families "
                                                   "get the grid (the rows above) and, where it chooses another "
                                                   "recipe, their converged runs again (the table below)")
                       for fam, v in verdict.items()]
    old = old_recipe(p)
    out += ["", "The converged runs again (issue 77, part 3): each family whose chosen recipe differs from the one "
            f"its converged runs used ({point_text(*old[:2])} on Adam for the post-norm column"
            + (f", {point_text(p.lr, p.warmup)} on Adam for the pre-norm families" if pre else "")
            + ") is retrained by the converged rule with 3 seeds, as `retuned-<family>-<depth>`: a post-norm "
            f"family at every depth ({', '.join(map(str, p.depths))}; the shallower ones at the {n}-layer choice, no "
            "grid is run there)" + (", a pre-norm family at the depths of its converged runs" if pre else "")
            + "; the old records stay, marked superseded once the new system has every seed.", "",
            "| family | recipe | converged runs |", "|---|---|---|"]
    gone = superseded(p, results)
    planned_retuned = {r.system for r in retuned_runs(p, [1], results)}
    for fam in tab:
        rec = chosen_recipe(p, results, fam)
        if rec is None:
            what, runs = "not chosen yet", "wait for the sweep"
        elif rec == old_recipe(p, fam):
            what, runs = f"{point_text(*rec[:2])} on {rec[2]}", "unchanged: the old converged runs stand"
        else:
            what = f"{point_text(*rec[:2])} on {rec[2]}"
            runs = "; ".join(f"{retuned_name(fam, d)}: " + ("done, supersedes conv-" + f"{fam}-{d}"
                                                             if f"conv-{fam}-{d}" in gone else "planned")
                             for d in p.depths if retuned_name(fam, d) in planned_retuned)
        out.append(f"| {fam} | {what} | {runs} |")
    systems = by_system(results)
    new = [retuned_name(fam, d) for d in p.depths for fam in tab if retuned_name(fam, d) in systems]
    if new:
        out += ["", "The retuned systems so far (as section 1b; a system supersedes its `conv-` one once it has a "
                "record of every seed at its family's chosen recipe):", ""]
        out += table(systems, new, (("stopped_at", "stopped at"), ("best_update", "best")))
        out += [""] + run_table([r for n in new for r in systems[n]])
    return out + [""]


def current_pair(p, results: Dict[str, dict], fam: str, n: int, ref: Optional[str], rn: Optional[int]
                 ) -> Tuple[str, Optional[str]]:
    """The systems a finding compares: both sides' current systems (:func:`study.plan.column_sides`),
    or both old ``conv-`` ones while a side waits for its rerun; ``ref`` None: the baseline row itself."""
    if ref is None:
        return current_system(p, results, fam, n), None
    sides, _ = column_sides(p, results, fam, n, ref, rn)
    return sides or (f"conv-{fam}-{n}", f"conv-{ref}-{rn}")


def column_call_rows(p, results: Dict[str, dict]) -> List[dict]:
    """Every converged comparison that involves the post-norm column (:func:`study.plan.postnorm_column_pairs`),
    called by the study's one rule (:func:`call`) on the old systems (``conv-``, the old recipe) and on the
    current ones (:func:`study.plan.current_system`): {"kind", "old" (the old pair), "sides" (the current
    pair, None while a side waits), "wait" (why), "old_call", "new_call" (the cells; None while waiting)}."""
    systems = by_system(results)

    def cell(a: str, b: str) -> str:
        if a not in systems or b not in systems:
            return "not measured: " + ", ".join(short_name(x) for x in (a, b) if x not in systems)
        return call_cell(call(a, systems[a], b, systems[b], close=p.close_bleu))

    rows = []
    for kind, fam, n, ref, rn in postnorm_column_pairs(p):  # in the order of COLUMN_CALLS
        old = (f"conv-{fam}-{n}", f"conv-{ref}-{rn}")
        sides, wait = column_sides(p, results, fam, n, ref, rn)
        rows.append({"kind": kind, "old": old, "sides": sides, "wait": wait, "old_call": cell(*old),
                     "new_call": None if wait else cell(*sides)})
    return rows


def column_calls_section(p, results: Dict[str, dict]) -> List[str]:
    """Section 5c (issue 77, part 4): :func:`column_call_rows`, the old call and the new one side by side."""
    old = old_recipe(p)
    out = ["### 5c. The post-norm column's calls: old recipe and chosen recipe, side by side", "",
           f"Every converged comparison that involves plain post-norm, DeepNorm, Admin or transparent post-norm "
           f"(`study.plan.postnorm_column_pairs`), called by the study's one rule on the old systems (`conv-`, "
           f"trained at {point_text(*old[:2])} on Adam) and on the current ones (`retuned-` at the sweep's choice "
           "where it has every seed; a family whose choice is the old recipe keeps its runs). Test BLEU.", "",
           "| comparison | old call | new call |", "|---|---|---|"]
    for r in column_call_rows(p, results):
        new = "waits: " + "; ".join(r["wait"]) if r["wait"] else r["new_call"]
        out.append(f"| {r['kind']}: {short_name(r['old'][0])} vs {short_name(r['old'][1])} | {r['old_call']} | {new} |")
    return out + [""]


DIAG_AT = (100, 300, 1000)  # the updates the diagnostics table shows (the nearest logged point at or before)


def _at(log: List[dict], update: int) -> Optional[dict]:
    before = [e for e in log if e["update"] <= update]
    return before[-1] if before else None


def diag_section(p, results: Dict[str, dict], unfinished: Optional[Dict[str, dict]] = None) -> List[str]:
    """Section 5b: why a post-norm family fails (issue 77, part 4): DeepNet's and Admin's diagnostics
    (the relative output change of encoder layers 1, N/2 and N on a fixed probe batch since the start,
    ``--log-change-norms``) of the diagnostic runs, and Admin's large batch against its 2K-token sweep run."""
    runs = diag_runs(p)
    if not runs:
        return []
    n = sweep_depth(p)
    layers = (1, n // 2, n)
    head = [f"dF @{u}" for u in DIAG_AT]
    out = ["### 5b. Why a post-norm family fails: early output and parameter change (issue 77, part 4)", "",
           f"Each family at {n} encoder layers, seed 1, the first {p.diag_updates} updates at the study's old post-norm "
           "point and at the sweep's 1e-3 / 1000, pre-norm at its own point as the working reference, with "
           f"`--task deep_translation --log-change-norms --log-grad-norms-every {p.diag_every}`. dF is the relative "
           "change ||h_i - h_i^0|| / ||h_i^0|| of encoder layer i's output on one fixed batch since update 0 "
           "(DeepNet's \"model update\", Admin's \"output change\"; the reading is in "
           "`deepnmt_fairseq/tasks/deep_translation.py`), shown for layers "
           + " / ".join(map(str, layers)) + "; dW the same for the parameters of the top layer. "
           "A post-norm stack that stalls is expected (DeepNet Sec. 3) to show a large early dF in its upper layers "
           "followed by a plateau. `…`: not run yet.", "",
           f"| run | valid NLL | train loss | " + " | ".join(head) + f" | dW L{n} @{DIAG_AT[-1]} |",
           "|---" * (len(head) + 4) + "|"]
    for r in runs:
        if r.update_freq > 1:
            continue
        res = results.get(r.name)
        if res is None:
            out.append(f"| {r.system} | … | … | " + " | ".join("…" for _ in head) + " | … |")
            continue
        log = res.get("change_log") or []
        cells = []
        for u in DIAG_AT:
            e = _at(log, u)
            cells.append("—" if e is None or len(e["enc_dF"]) < n else
                         " / ".join(f"{e['enc_dF'][i - 1]:.2g}" for i in layers))
        e = _at(log, DIAG_AT[-1])
        dw = "—" if e is None or len(e["enc_dW"]) < n else f"{e['enc_dW'][n - 1]:.2g}"
        v = "diverged" if res.get("diverged") else f"{res.get('valid_nll', math.nan):.3f}"
        out.append(f"| {r.system} | {v} | {res.get('final_train_loss', math.nan):.3f} | " + " | ".join(cells)
                   + f" | {dw} |")
    big = [r for r in runs if r.update_freq > 1]
    if big:
        r = big[0]
        fam, lr, w = BIGBATCH
        res, small = results.get(r.name), results.get(sweep_name(fam, n, lr, w))
        marks = [u for u in range(p.diag_updates // 4, p.diag_updates + 1, p.diag_updates // 4)]

        part = None if res is not None else (unfinished or {}).get(r.name)  # a deadline's partial record

        def curve(rec, upto=math.inf):
            if rec is None:
                return ["…"] * len(marks)
            log = [(u, v) for u, v in rec.get("valid_log") or []]
            return [next((f"{v:.2f}" for u, v in reversed(log) if u <= m), "—") if m <= upto else "…" for m in marks]

        out += ["", f"Is the batch the cause? {fam} at {n} layers, {point_text(lr, w)}, valid NLL (fairseq's, the training "
                f"model) by update with {p.bigbatch_freq} x {p.max_tokens} tokens an update (`--update-freq "
                f"{p.bigbatch_freq}`: Admin's 32K) against its sweep run at {p.max_tokens}:", "",
                "| tokens an update | " + " | ".join(f"@{m}" for m in marks) + " |", "|---" * (len(marks) + 1) + "|",
                f"| {p.bigbatch_freq * p.max_tokens}"
                + (f" (unfinished: {part['updates']} updates, section 1c)" if part else "") + " | "
                + " | ".join(curve(res) if part is None else curve(part, part.get("updates") or 0)) + " |",
                f"| {p.max_tokens} | " + " | ".join(curve(small)) + " |"]
    return out + [""]


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _pyplot():
    """matplotlib's pyplot on the file-only backend (the report is written without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: one colour per depth-study system in every figure of the report (matplotlib's tab10)
FAMILY_COLOURS = dict(zip(FAMILIES, ("#d62728", "#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c", "#8c564b",
                                     "#e377c2", "#17becf")))
OTHER_COLOURS = ("#7f7f7f", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
                 "#000000", "#e6550d", "#31a354", "#756bb1", "#636363", "#ad494a", "#a55194", "#6baed6")


def _system_of(name: str) -> str:
    return name.rsplit("-s", 1)[0] if name.rsplit("-s", 1)[-1].isdigit() else name


def family_of(name: str) -> Optional[str]:
    """The depth-study system (a key of FAMILIES) of a run or system name, None for the others."""
    import re

    m = re.match(r"^(?:conv-|retuned-)?(.+?)-\d+(?:-s\d+)?$", name)
    return m.group(1) if m and m.group(1) in FAMILIES else None


def colour_of(name: str, others: Sequence[str] = ()) -> str:
    """The colour of a system in every figure: its family's (FAMILY_COLOURS); the other systems
    (deep decoder, GPKD, SSL: drawn in one figure only) by their place in ``others``, sorted."""
    import zlib

    fam = family_of(name)
    if fam:
        return FAMILY_COLOURS[fam]
    base, others = _system_of(name), sorted(set(others))
    i = others.index(base) if base in others else zlib.crc32(base.encode())
    return OTHER_COLOURS[i % len(OTHER_COLOURS)]


def _plot_depth(systems, p, path: Path) -> None:
    plt = _pyplot()

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.6 * len(METRICS), 3.6))
    for ax, (key, label, _) in zip(axes, METRICS):
        for fam in FAMILIES:
            pts = [(n, stat(systems.get(f"{fam}-{n}", []), key)) for n in p.depths]
            pts = [(n, s) for n, s in pts if s]
            if pts:
                ax.errorbar([n for n, _ in pts], [s[0] for _, s in pts], yerr=[s[1] / 2 for _, s in pts],
                            marker="o", capsize=3, label=fam, color=FAMILY_COLOURS[fam])
        ax.set_xlabel("encoder layers")
        ax.set_ylabel(label)
        ax.set_xticks(list(p.depths))
    axes[0].legend(fontsize=7)
    _save(plt, fig, path)


def remaining_hours(p, missing: List[str], results: Dict[str, dict]) -> float:
    """Core-hours of the missing runs, each at its update cap (:func:`study.plan.run_updates`) and
    the median core-seconds per update of the finished runs with the same encoder depth (all
    finished runs when none has it), plus 60 s of evaluation (and 40 s per curve point: no train
    sample).  A run's core-seconds are its wall seconds times the threads it trained with
    (``machine.threads``; 1 in the records made before it was kept): a 2-thread run keeps both
    cores busy.  Runs that ``--cuda`` moved to a GPU (``machine.device``) do not set the rate."""
    import re

    def depth(name):
        m = re.search(r"-(\d+)(?:-\d+)?-s\d+$", name)
        return int(m.group(1)) if m else None

    rate: Dict[Optional[int], List[float]] = {}
    for n, r in results.items():
        steps = r.get("losses")[-1][0] if r.get("losses") else None
        machine = r.get("machine") or {}
        if r.get("train_seconds") and steps and machine.get("device") != "cuda" and not n.startswith("bigbatch-"):
            rate.setdefault(depth(n), []).append(r["train_seconds"] * _threads(machine) / steps)
    every = [x for xs in rate.values() for x in xs]
    if not every:
        return 0.0
    total = 0.0
    for n in missing:
        updates = run_updates(p, n)
        per = statistics.median(rate.get(depth(n)) or every)
        points = updates // p.curve_every if n.startswith(("conv-", "retuned-")) and p.curve_every else 0
        total += per * updates + 60 + 40 * points
    return total / 3600


def waiting_sentence(p, results: Dict[str, dict], planned: Sequence[str]) -> str:
    """The status line's forecast of the runs that wait for the post-norm sweep's choice
    (:func:`study.plan.waiting_runs`): how many, and their core-hours at the cap and, for the converged
    ones, as long as the old runs of the same family and depth took (the patience rule stopped those)."""
    wait = waiting_runs(p, results, planned) if p.sweep_updates else []
    if not wait:
        return ""
    checks = [r.name for r in wait if not r.name.startswith("retuned-")]
    conv = [r for r in wait if r.name.startswith("retuned-")]
    parts = []
    if checks:
        point = postnorm_point(p, results, provisional=True)
        at = f" at {point_text(*point[:2])}" if point else ""  # no family has chosen yet: own-point runs only
        parts.append(f"the pre-norm check{at} ({', '.join(checks)}: ≤ "
                     f"{remaining_hours(p, checks, results):.1f} core-hours)")
    if conv:
        like, guess = [], 0.0
        for r in conv:
            old = [x for x in results.values() if x.get("system") == f"conv-{r.system[len('retuned-'):]}"
                   and x.get("train_seconds")]
            if old:
                guess += statistics.mean(x["train_seconds"] * _threads(x.get("machine") or {}) for x in old) / 3600
                like.append(r.name)
        fams = sorted({family_of(r.system) for r in conv}, key=list(DISPLAY).index)
        parts.append(f"the converged runs again for {', '.join(DISPLAY[f] for f in fams)} ({len(conv)} runs at "
                     f"{', '.join(sorted({f'{point_text(r.lr, r.warmup)} on {r.optimizer}' for r in conv}))}: ≤ "
                     f"{remaining_hours(p, [r.name for r in conv], results):.0f} core-hours at the cap"
                     + (f"; about {guess:.0f} core-hours for the {len(like)} of them whose old runs stopped by the "
                        "patience rule, if they stop as early" if like else "") + ")")
    return (" Waiting for the sweep's choice, as the grid points finished so far would make it "
            "(`study.plan.waiting_runs`; planned once the grid is complete): " + "; and ".join(parts) + ".")


def _threads(machine: dict) -> int:
    """The threads a record trained with; 1 where unknown (the records made before they were kept)."""
    try:
        return int(machine.get("threads") or 1)
    except (TypeError, ValueError):
        return 1


def _matches(names: Sequence[str], pat: str) -> bool:
    """Whether any of ``names`` matches the ``--runs`` pattern ``pat``."""
    import fnmatch

    return any(fnmatch.fnmatchcase(n, pat) for n in names)


def order_budget(p, missing: List[str], results: Dict[str, dict]) -> List[Tuple[str, str, int, float]]:
    """(what, ``--runs`` pattern, runs not yet finished, their core-hours) for each step of
    :func:`study.plan.run_order`; a run is counted in the first step whose pattern it matches."""
    import fnmatch

    left, out = list(missing), []
    for what, pat in run_order(p):
        mine = [n for n in left if fnmatch.fnmatchcase(n, pat)]
        left = [n for n in left if n not in mine]
        out.append((what, pat, len(mine), remaining_hours(p, mine, results)))
    return out


def partial_table(runs: Dict[str, dict], step: int, columns: int = 6) -> List[str]:
    """Unfinished runs by name: where each stopped, its train loss and speed, and its valid NLL at
    at most ``columns`` evenly spaced multiples of the validation interval ``step`` (``valid_interval``;
    fairseq also validates at each epoch's end, at updates no two runs share; "-": the run did not
    validate there).  A run whose training finished and whose evaluation the deadline stopped reads
    "N (trained, not yet evaluated)"."""
    logs = {n: dict((int(u), v) for u, v in r.get("valid_log", [])) for n, r in runs.items()}
    top = max((u for log in logs.values() for u in log), default=0)
    every = step * max(1, math.ceil(top / (columns * step)))
    cols = list(range(every, top + 1, every))
    out = ["| run | machine | stopped at | train loss | updates/s | "
           + " | ".join(f"valid NLL @{u}" for u in cols) + " | last valid NLL (at) |",
           "|---" * (6 + len(cols)) + "|"]
    for n, r in runs.items():
        m = r.get("machine") or {}
        ups = r.get("updates_per_second")
        at = f"{r['updates']} (trained, not yet evaluated)" if r.get("trained") else r["updates"]
        out.append(f"| {n} | {m.get('gpu') or m.get('cpu', '-')} | {at} | {r['final_train_loss']:.3f} | "
                   f"{'-' if ups is None else f'{ups:.2f}'} | "
                   + " | ".join("-" if u not in logs[n] else f"{logs[n][u]:.2f}" for u in cols)
                   + (f" | {logs[n][max(logs[n])]:.2f} ({max(logs[n])}) |" if logs[n] else " | - |"))
    return out


def curve_points(runs: List[dict]) -> Dict[int, List[float]]:
    """{update: [test BLEU of each seed's checkpoint at that update]} of a converged system's runs."""
    points: Dict[int, List[float]] = {}
    for r in runs:
        for pt in r.get("curve") or []:
            if isinstance(pt.get("bleu"), (int, float)):
                points.setdefault(pt["updates"], []).append(pt["bleu"])
    return points


def curve_table(systems: Dict[str, List[dict]], names: List[str]) -> List[str]:
    """Systems by curve points: the mean test BLEU at every budget, and the number of seeds where
    fewer than all reached it."""
    pts = {n: curve_points(systems.get(n, [])) for n in names}
    ups = sorted({u for d in pts.values() for u in d})
    if not ups:
        return []
    lines = ["| system | " + " | ".join(str(u) for u in ups) + " |", "|" + "---|" * (1 + len(ups))]
    for n in names:
        seeds = len(systems.get(n, []))
        cells = [("-" if u not in pts[n] else f"{statistics.fmean(pts[n][u]):.2f}"
                  + (f" ({len(pts[n][u])})" if len(pts[n][u]) < seeds else "")) for u in ups]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def weight_rows(record: dict) -> Optional[Tuple[str, List[List[float]]]]:
    """The rows of a record's learned layer weights that combine the whole stack: transparent
    attention's s of Eq. 1 (one row per decoder layer, over the embeddings and the N layers), or
    DLCL's output row of W (Wang et al. 2019a, Eq. 6: the encoder's output over y_0 .. y_N)."""
    lw = record.get("layer_weights") or {}
    if lw.get("transparent_s"):
        return "transparent s (decoder rows)", lw["transparent_s"]
    if lw.get("dlcl_w"):
        return "DLCL W (output row)", lw["dlcl_w"][-1:]
    return None


def _range(vals: List[float]) -> str:
    return f"{min(vals):.2f}" if min(vals) == max(vals) else f"{min(vals):.2f} to {max(vals):.2f}"


def weights_table(systems: Dict[str, List[dict]]) -> List[str]:
    """Where the learned layer weights put their mass, over every row and seed (min - max): the
    embeddings and the first layer together, the top layer, each layer of the upper half; uniform
    is 1/(N+1). Read from the records (``layer_weights``), so the analysis is checkable."""
    lines = ["| system | seeds | weights | embeddings + layer 1 | top layer | each of the upper half | uniform (one layer) |",
             "|---|---|---|---|---|---|---|"]
    for name in sorted(systems):
        found = [w for w in map(weight_rows, systems[name]) if w]
        if not found:
            continue
        rows = [row for _, rs in found for row in rs]
        n = len(rows[0]) - 1
        upper = [v for row in rows for v in row[n // 2 + 1:]]
        lines.append(f"| {name} | {len(found)} | {found[0][0]} | {_range([r[0] + r[1] for r in rows])} | "
                     f"{_range([r[-1] for r in rows])} | {_range(upper)} | {1 / (n + 1):.3f} |")
    return lines if len(lines) > 2 else []


def _plot_converged(systems, names, path: Path) -> None:
    """One panel per encoder depth: each system's seed mean of the single-checkpoint test BLEU at
    every curve point, with a band from the lowest to the highest seed, in its colour
    (FAMILY_COLOURS); a point that fewer seeds reached is the mean of those (curve_table says how many)."""
    import re

    plt = _pyplot()

    depths = sorted({int(m.group(1)) for n in names for m in [re.search(r"-(\d+)$", n)] if m})
    fig, axes = plt.subplots(1, len(depths), figsize=(4.8 * len(depths), 3.8), squeeze=False, sharey=True)
    for ax, depth in zip(axes[0], depths):
        for n in names:
            if not n.endswith(f"-{depth}"):
                continue
            points = curve_points(systems.get(n, []))
            if not points:
                continue
            xs = sorted(points)
            seeds = len(systems.get(n, []))
            mean = [statistics.fmean(points[x]) for x in xs]
            colour = colour_of(n)
            improving = improving_seeds(systems.get(n, []))
            label = (family_of(n) or n) + (f" (still improving: {len(improving)} of {seeds})" if improving else "")
            ax.plot(xs, mean, marker=".", label=label, linewidth=1.2, color=colour)
            ax.fill_between(xs, [min(points[x]) for x in xs], [max(points[x]) for x in xs], color=colour, alpha=0.18,
                            linewidth=0)
        ax.set_title(f"{depth}-layer encoder (seed mean, band: min-max over seeds)", fontsize=9)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("test sacreBLEU (single checkpoint)")
    _save(plt, fig, path)


def _plot_curves(results, path: Path) -> None:
    plt = _pyplot()

    groups = [("depth", lambda n: not n.startswith(("dd-", "gpkd-", "skd-", "ssl-", "conv-"))),
              ("depth, converged", lambda n: n.startswith("conv-")),
              ("deep decoder", lambda n: n.startswith("dd-")),
              ("GPKD", lambda n: n.startswith(("gpkd-", "skd-"))),
              ("skipping sub-layer", lambda n: n.startswith("ssl-"))]
    groups = [(t, sorted(n for n in results if pick(n))) for t, pick in groups]
    groups = [(t, ns) for t, ns in groups if ns]
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.6), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups):
        shown, others = set(), [_system_of(n) for n in names if not family_of(n)]
        for n in names:
            xs, ys = zip(*results[n]["losses"])
            system = results[n].get("system", n)
            ax.plot(xs, ys, label=system if system not in shown else "_nolegend_", linewidth=0.8, color=colour_of(n, others))
            shown.add(system)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("update")
        ax.set_ylabel("train loss")
        ax.legend(fontsize=4, ncol=2)
    _save(plt, fig, path)


def run_table(runs: List[dict]) -> List[str]:
    """One row per run: its machine, where it stopped, its last kept valid NLLs and the still-improving mark."""
    lines = ["| run | CPU | ISA | threads | stopped at (best) | valid NLL of the last kept checkpoints | still improving | test BLEU |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m = machine_of(r)
        curve = [pt for pt in r.get("curve") or [] if isinstance(pt.get("valid_nll"), (int, float))][-IMPROVING_K:]
        kept = " / ".join(f"{pt['valid_nll']:.3f}" for pt in curve) + (
            f" at {'-'.join(str(pt['updates']) for pt in curve[::max(1, len(curve) - 1)])}" if curve else "-")
        lines.append(f"| {r.get('name')} | {m['cpu']} | {m['isa']} | {m['threads']} | {r.get('stopped_at', '-')} "
                     f"({r.get('best_update', '-')}) | {kept} | {'**still improving**' if still_improving(r) else 'no'} | "
                     f"{r.get('bleu', '-')} |")
    return lines


def changed_calls(made: List[dict]) -> List[str]:
    """The calls whose label round 3's rule changed (old: :func:`round2_label`), with why."""
    out = []
    for c in made:
        if c.get("old") == c["label"]:
            continue
        why = []
        if c["label"].startswith("narrowly"):
            why.append(f"{c['margin']:.2f} BLEU beyond the larger spread, under {NARROW_MARGIN:g}: narrow")
        if c["label"] == "no difference" and c.get("seed") and c["seed"]["p"] >= ALPHA:
            why.append(f"seed-level p = {c['seed']['p']:.3f}")
        out.append(f"- {c['a']} vs {c['b']} ({c['key']}): {c['old']} → **{c['label']}**"
                   + (f" ({'; '.join(why)})" if why else ""))
    return out


# ----------------------------------------------------------------------- the README's evidence table
README = REPO / "README.md"
EVIDENCE_TABLE = REPO / "docs" / "evidence-table.md"
EVIDENCE_START, EVIDENCE_END = "<!-- evidence-table:start -->", "<!-- evidence-table:end -->"
DISPLAY = {"postnorm": "post-norm", "prenorm": "pre-norm", "transparent-post": "transparent (post-norm)",
           "transparent-pre": "transparent (pre-norm)", "dlcl": "DLCL", "msc": "MSC", "deepnorm": "DeepNorm",
           "admin": "Admin"}


def short_name(system: str) -> str:
    """conv-transparent-post-12 -> 'transparent (post-norm)-12', retuned-admin-24 -> 'Admin-24 (retuned)'
    (issue 77's runs at the sweep's recipe); other systems keep their name."""
    fam, n = family_of(system), system.rsplit("-", 1)[-1]
    return f"{DISPLAY[fam]}-{n}" + (" (retuned)" if system.startswith("retuned-") else "") if fam else system


def call_cell(c: dict, with_delta: bool = True) -> str:
    """A call as the evidence table shows it: its label against its reference, and its marks."""
    if c["label"] in ("not measured", "no call"):
        return f"{c['label']} against {short_name(c['b'])}"
    rel = "than" if c["label"] not in ("no difference",) else "from"
    text = f"{c['label']} {rel} {short_name(c['b'])}" + (f" ({c['delta']:+.2f})" if with_delta else "")
    marks = []
    if c["machine"][0] == "confounded":
        marks.append("confounded with the CPU type")
    if c["improving"]:  # which seeds: the BLEU cells of both sides' rows
        marks.append("both sides still improving" if len(c["improving"]) == 2 else
                     f"{short_name(next(iter(c['improving'])))} still improving")
    return text + "".join(f"; {m}" for m in marks)


def evidence_rows(results: Dict[str, dict], p) -> List[Tuple[str, int, List[dict], Optional[dict]]]:
    """(family, depth, runs, call against its baseline) of every converged system with records: a
    method against the plain stack of its norm placement at its depth, a plain stack against itself
    at the shallowest depth (None there: it is the baseline)."""
    systems, rows = by_system(results), []
    for n in p.depths:
        fams = converged_families(p, n, results)
        fams += [f for f in tuned_families(p, results) if f not in fams and retuned_name(f, n) in systems]
        for fam in fams:
            if fam in ("prenorm", "postnorm"):
                ref_fam, rn = (None, None) if n == p.depths[0] else (fam, p.depths[0])
            else:
                ref_fam, rn = reference_family(fam), n
            name, ref = current_pair(p, results, fam, n, ref_fam, rn)
            if name not in systems:
                continue
            c = None if ref is None else call(name, systems[name], ref, systems.get(ref, []), close=p.close_bleu)
            rows.append((fam, n, systems[name], c))
    return rows


def paper_sentences(results: Dict[str, dict], p) -> List[str]:
    """One sentence per paper, each made of the rule's labels (:func:`call`) and nothing else."""
    systems = by_system(results)
    deep = [n for n in p.depths]

    def labels(fam: str, ref_fam: str, ref_depth: Optional[int] = None) -> str:
        out = []
        for n in deep:  # the current converged systems: retuned ones where both sides have them (issue 77)
            a, b = current_pair(p, results, fam, n, ref_fam, ref_depth or n)
            if a == b:
                continue
            if a in systems and b in systems:
                c = call(a, systems[a], b, systems[b], close=p.close_bleu)
                out.append(f"{n} layers: {c['label']} ({c['delta']:+.2f})"
                           + (" [confounded]" if c["machine"][0] == "confounded" else "")
                           + (" [still improving]" if c["improving"] else "") + recipe_mark(a, b, fam, n, ref_fam, ref_depth or n))
        return "; ".join(out) or "not measured"

    seen = set()  # the recipes the sentence being built reads: "old" and/or "retuned" (issue 77)

    def recipe_mark(a: str, b: str, fam: str, n: int, ref: str, rn: int) -> str:
        """Issue 77: a call that reads systems retrained at the recipe chosen on valid is marked [retuned];
        one that reads the old runs of a family being retuned is noted once per sentence (:func:`finish`)."""
        if a.startswith("retuned-") or b.startswith("retuned-"):
            seen.add("retuned")
            if {fam, ref} - set(SWEEP_FAMILIES):  # a pre-norm family's grid holds its own point too
                seen.add("retuned-pre")
            return " [retuned]"
        if column_sides(p, results, fam, n, ref, rn)[1]:
            seen.add("old")
        return ""

    def finish(sentence: str) -> str:
        """The sentence, then what its recipes are: the grid a [retuned] call's recipe was chosen on, and
        that the unmarked calls of a family being retuned read its first recipe."""
        grid = tuple(tuple(pt) for pt in p.sweep_grid)
        rates, warm = sorted({lr for lr, _ in grid}), sorted({w for _, w in grid})
        words = {"old": "calls not marked [retuned] read runs at the study's first recipe, while their families "
                        "are retuned on valid (issue 77)",
                 "retuned": f"[retuned]: both sides at their recipe chosen on valid over the grid of peak rates "
                            f"{' / '.join(rate(lr) for lr in rates)} x warm-ups {' / '.join(str(w) for w in warm)}"
                            + (f", a pre-norm family's with its own point {point_text(p.lr, p.warmup)}"
                               if "retuned-pre" in seen and (p.lr, p.warmup) not in grid
                               else "")
                            + f" ({sweep_depth(p)} encoder layers, {p.sweep_updates} updates; docs/fidelity.md section 5)"}
        said = [words[m] for m in ("retuned", "old") if m in seen]
        seen.clear()
        return sentence if not said else sentence.rstrip(".") + " (" + "; ".join(said) + ")."

    def one(a: str, b: str) -> str:
        if a not in systems or b not in systems:
            return f"{short_name(a)} against {short_name(b)}: not measured"
        c = call(a, systems[a], b, systems[b], close=p.close_bleu)
        return f"{short_name(a)} {call_cell(c)}"

    base, lo = f"prenorm-{p.depths[0]}", p.depths[0]
    dd = dd_depth(REPO / "work" / "fidelity" / p.name, REPO / RECORDS / p.name) or p.dd_depths[-1]
    return [
        finish(f"- **MSC** (Wei et al. 2020), converged, against plain pre-norm: {labels('msc', 'prenorm')}; the plain "
        f"stacks' degradation it starts from (plain pre-norm against pre-norm-{lo}): "
        f"{labels('prenorm', 'prenorm', ref_depth=lo)}."),
        finish(f"- **Transparent attention** (Bapna et al. 2018), converged, against plain post-norm: "
               f"{labels('transparent-post', 'postnorm')}; against plain pre-norm: {labels('transparent-pre', 'prenorm')}."),
        finish(f"- **DLCL** (Wang et al. 2019a), converged, against plain pre-norm: {labels('dlcl', 'prenorm')}."),
        finish(f"- **DeepNorm** (Wang et al. 2022), converged, against plain post-norm: {labels('deepnorm', 'postnorm')}."),
        finish(f"- **Admin** (Liu et al. 2020), converged, against plain post-norm: {labels('admin', 'postnorm')}."),
        f"- **Deep decoder** (Findings of ACL 2022), at the short budget ({p.updates} updates): "
        + "; ".join(one(f"dd-{k}-{p.dd_encoder}-{dd}", f"dd-plain-{p.dd_encoder}-{dd}") for k in DD_KINDS[1:])
        + f"; its premise: {one(f'dd-plain-{p.dd_encoder}-{dd}', f'dd-plain-{p.dd_encoder}-{p.dd_depths[0]}')}.",
        f"- **GPKD and skipping sub-layer** (Li et al. 2021), short budget and matched compute: "
        f"{one(f'gpkd-student-{lo}', base + '-matched')}; {one(f'gpkd-student-{lo}', f'skd-only-{lo}-matched')}; "
        f"{one(f'gpkd-teacher-{p.teacher_layers}', base)}; "
        f"{one(f'ssl-stage2-skip-{p.ssl_layers}', f'ssl-stage2-plain-{p.ssl_layers}')}.",
    ]


def evidence_table(results: Dict[str, dict], p, prefix: str = "") -> str:
    """The README's evidence table (issue 72): system × depth, converged test BLEU ± spread over
    seeds, the call against its baseline by the study's rule (:func:`call`), links to the records
    (``prefix``: the path from the page to the repository), then one sentence per paper."""
    rec = f"{prefix}{RECORDS.as_posix()}/{p.name}"
    lines = [f"Generated by `study.report.evidence_table` from the records in `{RECORDS.as_posix()}/{p.name}` "
             f"(preset `{p.name}`; the full report, every figure and its history: [docs/fidelity.md]({prefix}docs/fidelity.md)). "
             "Converged: each run stopped by early stopping on the valid set; BLEU is sacreBLEU of the average of "
             "its last 3 checkpoints, mean ± spread (max − min) over seeds. A call needs the spreads, the paired "
             f"bootstrap over test sentences and the seed-level bootstrap (p < {ALPHA:g} each); *narrowly*: under "
             f"{NARROW_MARGIN:g} BLEU beyond the larger spread; *confounded*: its two sides ran on different CPU types; "
             f"*still improving*: a seed's valid NLL still fell at each of its last {IMPROVING_K} kept checkpoints.", "",
             "| system | encoder layers | test BLEU | call against its baseline | records |", "|---|---|---|---|---|"]
    for fam, n, runs, c in evidence_rows(results, p):
        s = stat(runs, "bleu")
        imp = improving_seeds(runs)
        bleu = ("-" if s is None else f"{s[0]:.2f} ± {s[1]:.2f} ({s[2]} seeds)") + (
            f", still improving: {len(imp)} of {len(runs)}" if imp else "")
        links = " ".join(f"[s{r.get('seed')}]({rec}/{r.get('name')}.json)" for r in runs)
        lines.append(f"| {DISPLAY[fam]} | {n} | {bleu} | {'the baseline' if c is None else call_cell(c)} | {links} |")
    lines += ["", *paper_sentences(results, p)]
    return "\n".join(lines) + "\n"


def write_evidence_table(results: Dict[str, dict], p, readme: Path = README, page: Path = EVIDENCE_TABLE) -> bool:
    """docs/evidence-table.md, and README's block between the markers where README has them (True
    then); nothing of README outside the markers is touched."""
    page.write_text("# The evidence, in one table\n\n" + evidence_table(results, p, prefix="../"))
    return replace_between(readme, EVIDENCE_START, EVIDENCE_END, "\n" + evidence_table(results, p))


def replace_between(path: Path, start: str, end: str, body: str) -> bool:
    """Put ``body`` between the markers ``start`` and ``end`` of a file (True), where it has both; the
    text outside them is kept as it is, and a file without them is not touched (False)."""
    text = path.read_text() if path.exists() else ""
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    path.write_text(head + start + body + end + rest.split(end, 1)[1])
    return True


def readme_evidence_block(readme: Path = README) -> Optional[str]:
    """The text between README's markers, None when they are missing."""
    text = readme.read_text() if readme.exists() else ""
    if EVIDENCE_START not in text or EVIDENCE_END not in text:
        return None
    return text.split(EVIDENCE_START, 1)[1].split(EVIDENCE_END, 1)[0].lstrip("\n")
