#!/usr/bin/env python
"""The project's one speed protocol (issue 78): whole commands, interleaved, pinned, repeated, and a
claim that is the lower bound of a bootstrap interval.

    # 1. a tuning pass: each setting of a fixed grid timed once (>= --min-seconds of work), the fastest
    #    recorded and then frozen (measure reads it; re-tuning is a new record)
    python benchmarks/speed_protocol.py tune --name student --out tune-student.json \\
        --command 'deepnmt-translate --model served --input test.src --output /dev/null --batch-size {batch}' \\
        --grid batch=4,8,16,32,64
    # 2. the measurement: reference and candidates interleaved (ref, cand, ref, cand, ...)
    python benchmarks/speed_protocol.py measure --out record.json --cores 0 --repeats 5 --min-seconds 10 \\
        --reference teacher 'fairseq-generate ... --batch-size 64' \\
        --candidate student 'deepnmt-translate ... --batch-size {batch}' --tuned student=tune-student.json
    # 3. the comparison of two records (a rerun must give lower bounds within 10%)
    python benchmarks/speed_protocol.py compare a.json b.json

What each record holds (``measure``): the machine (CPU model, its vector extensions from
``/proc/cpuinfo``, the cores the commands were pinned to), every timed run (wall seconds, CPU
seconds of the command and its children, the 1-minute load average before and after, the number of
back-to-back executions that made it >= ``--min-seconds`` of work), and per candidate the speed ratio
(reference wall / candidate wall for the same work) of each interleaved pair, their median, a
bootstrap 95% interval of the median (``BOOTSTRAP`` resamples of the pairs, seeded) and **the claim:
the interval's lower bound**.

Choices (the issue fixes the protocol, not these details): a repeat is one execution of the command,
or k back-to-back executions where one is shorter than ``--min-seconds`` (k from a warm-up run;
repeating the command rather than the input keeps any command usable, at the price of counting its
start-up k times, which the ratio then includes for both sides); pinning with ``os.sched_setaffinity``
in the child (Linux); the first (warm-up) execution of every command is not timed.  Standard library
only: a user without the project's other tools reruns it as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

BOOTSTRAP = 10000
CONFIDENCE = 0.95
FORMAT = 1


# ------------------------------------------------------------------------------ statistics
def ratios(reference: Sequence[float], candidate: Sequence[float]) -> List[float]:
    """Speed ratio of each interleaved pair: the reference's wall time over the candidate's (> 1: the
    candidate is faster) for the same work."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(f"need the same number (>= 1) of reference and candidate timings, got "
                         f"{len(reference)} and {len(candidate)}")
    if min(reference) <= 0 or min(candidate) <= 0:
        raise ValueError("timings must be positive")
    return [r / c for r, c in zip(reference, candidate)]


def bootstrap_interval(values: Sequence[float], samples: int = BOOTSTRAP, confidence: float = CONFIDENCE,
                       seed: int = 0) -> Tuple[float, float, float]:
    """``(median, low, high)``: the median of ``values`` and the percentile bootstrap interval of the
    median (``samples`` resamples with replacement, a seeded generator: the same timings give the same
    interval).  With one value the interval is that value."""
    vals = list(values)
    if not vals:
        raise ValueError("no values")
    med = statistics.median(vals)
    if len(vals) == 1:
        return med, med, med
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(samples))
    lo_i = int(math.floor((1 - confidence) / 2 * samples))
    hi_i = min(samples - 1, int(math.ceil((1 + confidence) / 2 * samples)) - 1)
    return med, meds[lo_i], meds[hi_i]


def summarize(reference: Sequence[float], candidate: Sequence[float], **kw) -> dict:
    """The result of one candidate against the reference: the pairs' ratios, median, interval, claim."""
    rs = ratios(reference, candidate)
    med, lo, hi = bootstrap_interval(rs, **kw)
    return {"ratios": [round(r, 4) for r in rs], "median": round(med, 4), "interval": [round(lo, 4), round(hi, 4)],
            "claim": round(lo, 4), "confidence": kw.get("confidence", CONFIDENCE)}


def rerun_agreement(a: dict, b: dict) -> Dict[str, dict]:
    """Per candidate in both records: the two claims and their relative difference (the issue's
    "two reruns give lower bounds within 10% of each other")."""
    out = {}
    for name in sorted(set(a.get("results", {})) & set(b.get("results", {}))):
        ca, cb = a["results"][name]["claim"], b["results"][name]["claim"]
        out[name] = {"claims": [ca, cb], "relative_difference": round(abs(ca - cb) / max(ca, cb), 4),
                     "within_10_percent": abs(ca - cb) <= 0.10 * max(ca, cb)}
    return out


# ------------------------------------------------------------------------------ the machine
def cpu_flags() -> List[str]:
    """The vector extensions of this CPU that matter for the engines (``/proc/cpuinfo`` flags)."""
    info = Path("/proc/cpuinfo")
    flags: set = set()
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    wanted = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
              "avx_vnni")
    return [f for f in wanted if f in flags]


def machine(cores: Optional[Sequence[int]]) -> dict:
    model = "unknown"
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "vector_extensions": cpu_flags(), "online_cores": os.cpu_count(),
            "pinned_cores": list(cores) if cores else None, "python": sys.version.split()[0]}


# ------------------------------------------------------------------------------ timing
def parse_cores(text: Optional[str]) -> Optional[List[int]]:
    if not text:
        return None
    out: List[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    online = os.cpu_count() or 1
    bad = [c for c in out if c < 0 or c >= online]
    if bad:
        raise ValueError(f"--cores {text}: cores {bad} do not exist here (0-{online - 1})")
    return out


def run_once(command: str, cores: Optional[Sequence[int]] = None, times: int = 1) -> dict:
    """Run ``command`` (a shell command line) ``times`` times back to back, pinned to ``cores``;
    wall seconds, CPU seconds (user + system of the children) and the load before and after."""
    load0 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pin = (lambda: os.sched_setaffinity(0, set(cores))) if cores else None
    t0 = time.perf_counter()
    for _ in range(times):
        res = subprocess.run(command, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=pin, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"command failed (exit {res.returncode}): {command}\n{res.stderr[-2000:]}")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": round(wall, 4), "cpu": round(cpu, 4), "times": times, "load_before": round(load0, 2),
            "load_after": round(os.getloadavg()[0], 2)}


CALIBRATION_MARGIN = 1.25  # a repeat is planned for 1.25 x min_seconds: one slow warm-up must not make it short


def executions_for(command: str, min_seconds: float, cores=None) -> Tuple[int, dict]:
    """Two untimed warm-up executions, and how many back-to-back executions make
    ``CALIBRATION_MARGIN`` x ``min_seconds`` at the faster warm-up's pace."""
    warm = min((run_once(command, cores) for _ in range(2)), key=lambda r: r["wall"])
    return max(1, math.ceil(CALIBRATION_MARGIN * min_seconds / max(warm["wall"], 1e-6))), warm


def measure(reference: Tuple[str, str], candidates: Sequence[Tuple[str, str]], repeats: int = 5,
            min_seconds: float = 10.0, cores: Optional[Sequence[int]] = None, log=print) -> dict:
    """The protocol: warm-up and calibration of every command, then ``repeats`` rounds, each running
    the reference and every candidate in turn (reference, candidate 1, reference, candidate 2, ...: each
    candidate's pair is adjacent in time), each for the same number of executions as calibrated (the
    same work in every round); the results per candidate (:func:`summarize`)."""
    if repeats < 5:
        raise ValueError(f"--repeats {repeats}: the protocol needs at least 5 interleaved repeats")
    systems = [reference, *candidates]
    names = [n for n, _ in systems]
    if len(set(names)) != len(names):
        raise ValueError(f"system names must differ: {names}")
    times, warm = {}, {}
    for name, cmd in systems:
        times[name], warm[name] = executions_for(cmd, min_seconds, cores)
        log(f"[speed] {name}: one execution {warm[name]['wall']:.2f} s -> {times[name]} per repeat")
    runs: Dict[str, List[dict]] = {n: [] for n in names}
    ref_runs: Dict[str, List[dict]] = {n: [] for n, _ in candidates}
    for k in range(repeats):
        for name, cmd in candidates:
            r = run_once(reference[1], cores, times[reference[0]])
            c = run_once(cmd, cores, times[name])
            runs[reference[0]].append(r)
            ref_runs[name].append(r)
            runs[name].append(c)
            log(f"[speed] repeat {k + 1}/{repeats}: {reference[0]} {r['wall']:.2f} s, {name} {c['wall']:.2f} s "
                f"(load {r['load_before']:.2f} -> {c['load_after']:.2f})")
    short = sum(1 for rs in runs.values() for r in rs if r["wall"] < min_seconds)
    if short:
        log(f"[speed] warning: {short} timed repeats ran under {min_seconds} s (the machine sped up after the "
            "warm-up?): rerun on an idle machine")
    results = {}
    for name, _ in candidates:
        # the same work on both sides: per-execution wall times (the two may need different counts)
        ref = [r["wall"] / r["times"] for r in ref_runs[name]]
        cand = [c["wall"] / c["times"] for c in runs[name]]
        results[name] = summarize(ref, cand)
    return {"format": FORMAT, "protocol": {"repeats": repeats, "min_seconds": min_seconds, "bootstrap": BOOTSTRAP,
                                           "confidence": CONFIDENCE, "interleaved": True},
            "machine": machine(cores), "reference": {"name": reference[0], "command": reference[1]},
            "candidates": [{"name": n, "command": c} for n, c in candidates],
            "executions_per_repeat": times, "warm_up": warm, "runs": runs, "short_repeats": short,
            "results": results,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def expand_grid(command: str, grid: Dict[str, List[str]]) -> List[Tuple[Dict[str, str], str]]:
    """Every setting of a grid, substituted into ``{name}`` fields of the command."""
    settings: List[Dict[str, str]] = [{}]
    for key, values in grid.items():
        settings = [{**s, key: v} for s in settings for v in values]
    out = []
    for s in settings:
        try:
            out.append((s, command.format(**s)))
        except KeyError as e:
            raise ValueError(f"--grid: the command has no field {e} for the grid's settings {sorted(s)}") from None
    return out


def tune(name: str, command: str, grid: Dict[str, List[str]], min_seconds: float = 10.0, cores=None,
         log=print) -> dict:
    """The tuning pass: each setting of the grid timed once for >= ``min_seconds`` of work after a
    warm-up; the fastest setting (per-execution wall time) is the choice, recorded with every timing."""
    rows = []
    for setting, cmd in expand_grid(command, grid):
        n, _ = executions_for(cmd, min_seconds, cores)
        r = run_once(cmd, cores, n)
        rows.append({"setting": setting, "seconds_per_execution": round(r["wall"] / n, 4), **r})
        log(f"[tune] {name} {setting}: {r['wall'] / n:.3f} s an execution")
    best = min(rows, key=lambda r: r["seconds_per_execution"])
    return {"format": FORMAT, "name": name, "command": command, "grid": grid, "timings": rows,
            "choice": best["setting"], "machine": machine(cores), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def frozen(command: str, tuned: Optional[dict]) -> str:
    """The command at the tuning record's choice (unchanged without one)."""
    return command.format(**tuned["choice"]) if tuned else command


# ------------------------------------------------------------------------------ command line
def _grid(items: Sequence[str]) -> Dict[str, List[str]]:
    out = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not values:
            raise ValueError(f"--grid {item}: expected NAME=V1,V2,...")
        out[key] = values.split(",")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune", help="time every setting of a grid once; record the fastest")
    t.add_argument("--name", required=True)
    t.add_argument("--command", required=True, help="shell command with {NAME} fields of the grid")
    t.add_argument("--grid", nargs="+", required=True, metavar="NAME=V1,V2")
    t.add_argument("--out", required=True)
    m = sub.add_parser("measure", help="the reference and candidates, interleaved; the claims")
    m.add_argument("--reference", nargs=2, required=True, metavar=("NAME", "COMMAND"))
    m.add_argument("--candidate", nargs=2, action="append", required=True, metavar=("NAME", "COMMAND"))
    m.add_argument("--tuned", nargs="+", default=[], metavar="NAME=TUNE.json",
                   help="fill a system's {fields} from its tuning record's choice")
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="two records of the same measurement: do their claims agree within 10%%?")
    c.add_argument("records", nargs=2)
    for p in (t, m):
        p.add_argument("--min-seconds", type=float, default=10.0, help="work in one timed repeat")
        p.add_argument("--cores", help="pin every command to these cores (e.g. 0 or 0-1)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "compare":
            agree = rerun_agreement(*(json.loads(Path(r).read_text()) for r in a.records))
            print(json.dumps(agree, indent=1))
            return 0 if agree and all(v["within_10_percent"] for v in agree.values()) else 1
        cores = parse_cores(a.cores)
        if a.cmd == "tune":
            rec = tune(a.name, a.command, _grid(a.grid), a.min_seconds, cores)
        else:
            tuned = {}
            for item in a.tuned:
                name, _, path = item.partition("=")
                tuned[name] = json.loads(Path(path).read_text())
            ref = (a.reference[0], frozen(a.reference[1], tuned.get(a.reference[0])))
            cands = [(n, frozen(cmd, tuned.get(n))) for n, cmd in a.candidate]
            rec = measure(ref, cands, a.repeats, a.min_seconds, cores)
            rec["tuned"] = {n: t["choice"] for n, t in tuned.items()}
            for name, res in rec["results"].items():
                print(f"{name} vs {ref[0]}: median {res['median']:.2f}x, 95% interval "
                      f"[{res['interval'][0]:.2f}, {res['interval'][1]:.2f}], claim {res['claim']:.2f}x")
    except (ValueError, RuntimeError, OSError) as e:
        print(f"speed_protocol: error: {e}", file=sys.stderr)
        return 2
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(a.out).with_suffix(".partial")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(a.out)
    print(f"[speed] record: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
