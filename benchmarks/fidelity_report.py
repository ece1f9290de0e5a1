"""docs/fidelity.md from the finished runs of benchmarks/fidelity.py: per comparison a table of
mean ± spread over seeds, the verdicts that the spreads allow, the plots, and every command.
Imports the plan (fidelity_plan) only: the report is written from the records, without the runner."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fidelity_plan import (CONVERGED_SEEDS, DD_KINDS, FAMILIES, REPO, by_system, converged_families, dd_choice, headline_pairs,
                           partials, run_order, run_updates, stat, valid_interval)
from fidelity_stats import ALPHA, BOOTSTRAP_SAMPLES, decode_stats, paired_bootstrap

FINDINGS = Path(__file__).with_name("fidelity_findings.md")
METRICS = (("final_train_loss", "train loss", False), ("valid_nll", "valid NLL", False),
           ("bleu", "test BLEU", True), ("train_bleu", "train-sample BLEU", True))


def fmt(s: Optional[Tuple[float, float, int]], digits: int = 2) -> str:
    if s is None:
        return "-"
    mean, spread, n = s
    return f"{mean:.{digits}f} ± {spread:.{digits}f}" if n > 1 else f"{mean:.{digits}f} (1 seed)"


def verdict(name_a: str, a: List[dict], name_b: str, b: List[dict], key: str = "bleu",
            higher_better: bool = True, close: float = 0.0) -> str:
    """The study's one rule for a call, applied to every headline comparison:

    * both systems have >= 2 seeds, and the means differ by more than each system's spread
      (max - min over seeds);
    * for test BLEU, when every run of both systems kept its sentence statistics: the paired
      bootstrap over the test sentences of the seed-mean BLEU (:mod:`fidelity_stats`) gives
      p < ALPHA.  Records without them (made before the statistics were kept) are called on the
      seed rule alone, and the call says so.

    A difference under ``close`` with fewer than 3 seeds is marked as waiting for its third seed."""
    sa, sb = stat(a, key), stat(b, key)
    if sa is None or sb is None:
        return f"{name_a} vs {name_b}: not measured"
    diff = sa[0] - sb[0]
    if min(sa[2], sb[2]) < 2:
        return f"{name_a} vs {name_b}: {diff:+.2f} {key}, fewer than 2 seeds: no call"
    seeds = f"{sa[2]} vs {sb[2]} seeds"
    if abs(diff) < close and min(sa[2], sb[2]) < 3:
        seeds += f"; under {close:g} apart, so a third seed is planned (issue 16) and this call waits for it"
    boot = paired_bootstrap([decode_stats(r.get("test_stats")) for r in a if isinstance(r.get(key), (int, float))],
                            [decode_stats(r.get("test_stats")) for r in b if isinstance(r.get(key), (int, float))]
                            ) if key == "bleu" else None
    paired = ("" if key != "bleu" else "; no paired bootstrap: records without sentence statistics" if boot is None
              else f"; paired bootstrap over {boot['sentences']} test sentences: p = {boot['p']:.3f}, 95% interval "
                   f"{boot['low']:+.2f} to {boot['high']:+.2f}")
    if abs(diff) <= max(sa[1], sb[1]):
        return (f"{name_a} vs {name_b}: {diff:+.2f} {key}, within the spread ({max(sa[1], sb[1]):.2f}): "
                f"no difference ({seeds}{paired})")
    if boot is not None and boot["p"] >= ALPHA:
        return (f"{name_a} vs {name_b}: {diff:+.2f} {key}, beyond the spreads ({sa[1]:.2f}, {sb[1]:.2f}) but not "
                f"over the test sentences (p >= {ALPHA:g}): no difference ({seeds}{paired})")
    better = (diff > 0) == higher_better
    return (f"{name_a} {'better' if better else 'worse'} than {name_b}: {diff:+.2f} {key} "
            f"(spreads {sa[1]:.2f}, {sb[1]:.2f}; {seeds}{paired})")


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
        if failed:
            seeds += f" ({len(failed)} failed/diverged: seed {','.join(str(r.get('seed')) for r in failed)})"
        lines.append(f"| {n} | {seeds} | " + " | ".join(cells) + " |")
    return lines


def _postnorm_schedule(p) -> str:
    lr = p.postnorm_lr if p.postnorm_lr is not None else p.lr
    warmup = p.postnorm_warmup if p.postnorm_warmup is not None else p.warmup
    return "" if (lr, warmup) == (p.lr, p.warmup) else f" (post-norm runs: lr {lr}, {warmup} warm-up updates)"


def write_report(results: Dict[str, dict], preset, path: Path, work: Path,
                 planned: Optional[List[str]] = None, records: Optional[Path] = None) -> None:
    p = preset
    systems = by_system(results)
    dd_sel = dd_choice(work, records)
    pairs = headline_pairs(p, dd_sel["depth"] if dd_sel else None)

    def calls(section: str) -> List[str]:  # the headline test-BLEU calls of one study
        return ([f"- {verdict(a, systems[a], b, systems.get(b, []), close=p.close_bleu)}"
                 for a, b in pairs[section] if a in systems]
                or ["- none yet: the systems compared with a baseline have not finished"])
    img = path.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    tag = f"fidelity-{p.name}"
    lines = ["# Evidence study: each paper's effect, with models that learn", "",
             f"Generated by `python benchmarks/fidelity.py --preset {p.name}` ({time.strftime('%Y-%m-%d')}) from "
             f"{len(results)} finished runs (their records: `{_rel(records or work)}`). Setting (preset `{p.name}`): width {p.dim}, FFN "
             f"{p.ffn}, {p.heads} heads, shared embeddings, dropout 0.1, Adam (0.9, 0.98), lr {p.lr}, inverse-sqrt "
             f"with {p.warmup} warm-up updates{_postnorm_schedule(p)}, {p.updates} updates of at most {p.max_tokens} tokens, label "
             f"smoothing 0.1, {p.bpe} joint BPE merges{', ' + ' '.join(p.extra) if p.extra else ''}; the last 3 "
             f"checkpoints ({p.save_every} updates apart) are averaged and evaluated. Train loss: mean of the last "
             "5 logged intervals (base 2, label-smoothed). Valid NLL: bits/token of the valid references, no "
             "label smoothing (`benchmarks/fidelity_eval.py`). BLEU: detokenized "
             "sacreBLEU (13a) of beam-4 translations against the raw references, on the test split and on the "
             f"first {p.train_sample} training pairs (train-sample BLEU, the degradation test of MSC Fig. 2). "
             "Each cell is the mean ± spread (max − min) over seeds; the last column is the standard deviation "
             "of test BLEU over seeds (n − 1). One rule makes every call "
             "(`fidelity_report.verdict`): a difference is called only when it exceeds both systems' spreads "
             f"and, for test BLEU, when the paired bootstrap over the test sentences ({BOOTSTRAP_SAMPLES} "
             f"resamples of the seed-mean sacreBLEU, `benchmarks/fidelity_stats.py`) gives p < {ALPHA:g}; "
             "runs recorded before their sentence statistics were kept are called on the spreads alone, "
             "and their calls say so.", ""]
    unfinished = partials(records, results)  # runs a deadline stopped: section 1c
    if planned is not None:
        missing = [n for n in planned if n not in results]
        failed = sorted(n for n, r in results.items() if r.get("diverged"))
        extra = sorted(set(results) - set(planned))  # records of runs the plan no longer holds
        hours = remaining_hours(p, missing, results)
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
                     "finished runs of its encoder depth (`fidelity_report.remaining_hours`); early stopping "
                     "shortens the converged runs. Order (`fidelity_plan.run_order`, the cheapest decisive runs "
                     f"first), one `python benchmarks/fidelity.py --preset {p.name} --order short-first --runs "
                     "PATTERN` after another, each with the runs not yet finished and their core-hours at the cap: "
                     + "; ".join(f"{i}. {what} (`{pat}`: {n} runs, ≤ {h:.1f} core-hours)" if n else
                                 f"{i}. {what} (`{pat}`): done" for i, (what, pat, n, h)
                                 in enumerate(order_budget(p, missing, results), 1))
                     + ". A stopped run resumes from the checkpoints in its work directory only: where `work/` "
                     "does not outlive a session (a fresh checkout each time), start only what finishes before "
                     "the session ends." if missing and hours else ""), ""]
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
                lines.append(f"- degradation, {verdict(hi, systems[hi], lo, systems[lo], 'train_bleu')}")
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
        lines += ["", "Calls (test BLEU):", ""] + calls("converged")
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
                      "`EncoderMemory.learned_weights`; `fidelity_report.weights_table`):", ""] + weights + [""]
        lines.append("")

    # 1c. runs a deadline stopped: their logs' valid curves, no call
    if unfinished:
        lines += ["## 1c. Unfinished runs: valid NLL by updates, from their training logs", "",
                  "Runs stopped by `--deadline-minutes` before their rule stopped them (a machine lent for "
                  "minutes loses their checkpoints with it), kept as `<records>/partial/<run>.json` "
                  "(`fidelity_runner.partial_record`): fairseq's valid NLL (bits/token, no label smoothing, "
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
            lines += [f"- {verdict(n, systems[n], names[0], systems.get(names[0], []), 'unk_gap')}"
                      for n in names[1:] if n in systems]
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

    curves = {k: v for k, v in results.items() if v.get("losses")}
    if curves:
        _plot_curves(curves, img / f"{tag}-curves.png")
        lines += [f"![training curves](img/{tag}-curves.png)", ""]
    lines += ["## Commands", "", "Every number above comes from these commands (paths relative to the "
              "repository; the data directory is built by `benchmarks/fidelity.py`).", ""]
    for name in sorted(results):
        r = results[name]
        lines.append(f"- `{name}`: `{r.get('command', '')}`" + (f"; metrics: `{r['eval_command']}`"
                                                                if r.get("eval_command") else ""))
    for name, r in unfinished.items():
        lines.append(f"- `{name}` (unfinished, section 1c; stopped after {r.get('train_seconds', 0):.0f} s of "
                     f"training): `{r.get('command', '')}`")
    path.write_text("\n".join(lines) + "\n")


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


def _plot_depth(systems, p, path: Path) -> None:
    plt = _pyplot()

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.6 * len(METRICS), 3.6))
    for ax, (key, label, _) in zip(axes, METRICS):
        for fam in FAMILIES:
            pts = [(n, stat(systems.get(f"{fam}-{n}", []), key)) for n in p.depths]
            pts = [(n, s) for n, s in pts if s]
            if pts:
                ax.errorbar([n for n, _ in pts], [s[0] for _, s in pts], yerr=[s[1] / 2 for _, s in pts],
                            marker="o", capsize=3, label=fam)
        ax.set_xlabel("encoder layers")
        ax.set_ylabel(label)
        ax.set_xticks(list(p.depths))
    axes[0].legend(fontsize=7)
    _save(plt, fig, path)


def remaining_hours(p, missing: List[str], results: Dict[str, dict]) -> float:
    """Core-hours of the missing runs, each at its update cap (:func:`fidelity_plan.run_updates`) and
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
        if r.get("train_seconds") and steps and machine.get("device") != "cuda":
            rate.setdefault(depth(n), []).append(r["train_seconds"] * int(machine.get("threads") or 1) / steps)
    every = [x for xs in rate.values() for x in xs]
    if not every:
        return 0.0
    total = 0.0
    for n in missing:
        updates = run_updates(p, n)
        per = statistics.median(rate.get(depth(n)) or every)
        points = updates // p.curve_every if n.startswith("conv-") and p.curve_every else 0
        total += per * updates + 60 + 40 * points
    return total / 3600


def order_budget(p, missing: List[str], results: Dict[str, dict]) -> List[Tuple[str, str, int, float]]:
    """(what, ``--runs`` pattern, runs not yet finished, their core-hours) for each step of
    :func:`fidelity_plan.run_order`; a run is counted in the first step whose pattern it matches."""
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
    validate there)."""
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
        out.append(f"| {n} | {m.get('gpu') or m.get('cpu', '-')} | {r['updates']} | {r['final_train_loss']:.3f} | "
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
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for n in names:
        points = curve_points(systems.get(n, []))
        if points:
            xs = sorted(points)
            ax.plot(xs, [statistics.fmean(points[x]) for x in xs], marker=".", label=n, linewidth=0.9)
    ax.set_xlabel("update")
    ax.set_ylabel("test sacreBLEU (single checkpoint)")
    ax.legend(fontsize=5, ncol=2)
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
        for n in names:
            xs, ys = zip(*results[n]["losses"])
            ax.plot(xs, ys, label=n, linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("update")
        ax.set_ylabel("train loss")
        ax.legend(fontsize=4, ncol=2)
    _save(plt, fig, path)
