"""The project's one speed protocol (issue 78): timed runs interleaved, pinned, repeated, calibrated to a
minimum of work, and a claim that is the lower bound of a bootstrap interval.

Every speed figure the README and docs cite goes through this module: ``deepnmt-distill``'s report
(:mod:`deepnmt_fairseq.distill.report`, the quickstart's step 7), the command-line protocol
``benchmarks/speed_protocol.py`` (tune / measure / compare whole commands) and the benchmarks that
compare speeds (``benchmarks/serve_study.py``, ``benchmarks/deploy_speed.py``).  What it fixes:

* **tuning, then frozen**: each engine's settings grid is fixed in code; a separate tuning pass times
  every setting once and records the grid, every timing and the choice; the timed runs use the
  choice unchanged (:func:`tune`, :func:`frozen`);
* **calibration**: a timed repeat holds at least ``min_seconds`` (:data:`MIN_SECONDS`) of work: where
  one pass is shorter the work is repeated ``k`` times, ``k`` from an untimed warm-up pass with a
  margin (:data:`CALIBRATION_MARGIN`; :func:`executions_needed`);
* **interleaving**: reference, candidate, reference, candidate, ... (:func:`interleave`), at least
  :data:`MIN_REPEATS` rounds, every run pinned to fixed cores (:func:`pinned`), each with its wall
  time, CPU time (user + system of the child processes) and the 1-minute load average before and
  after (:func:`timed_call`);
* **statistics**: the speed ratio of each interleaved pair, their median, a seeded percentile
  bootstrap 95% interval of the median (:func:`summarize`); **the claim is the interval's lower
  bound**;
* **the machine**: the CPU model and its vector extensions in every record (:func:`machine`).

Standard library only, and no import of torch, fairseq or ``deepnmt_fairseq`` (this package's rule):
it ships in the serving distribution too, and ``benchmarks/speed_protocol.py`` starts without the
training stack.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

BOOTSTRAP = 10000
CONFIDENCE = 0.95
FORMAT = 1
#: the protocol's minimum number of interleaved repeats and of seconds of work in one timed repeat
MIN_REPEATS = 5
MIN_SECONDS = 10.0
#: untimed warm-up executions of a command before its calibration (benchmarks/speed_protocol.py)
WARM_UPS = 2
#: a repeat is planned for CALIBRATION_MARGIN x min_seconds: one slow warm-up must not make it short
CALIBRATION_MARGIN = 1.25


# ------------------------------------------------------------------------------ statistics
def ratios(reference: Sequence[float], candidate: Sequence[float]) -> List[float]:
    """Speed ratio of each interleaved pair: the reference's time over the candidate's (> 1: the
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
    """The result of one candidate against the reference from their interleaved pairs' times for the
    same work (seconds per execution, or per token): the ratios, their median, the interval, the claim
    (its lower bound)."""
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


def meets_protocol(repeats: int, min_seconds: float, short_repeats: int = 0) -> bool:
    """Whether a measurement is one the protocol makes a claim from: >= :data:`MIN_REPEATS` repeats of
    >= :data:`MIN_SECONDS` s of work, none of them short.  A shortened one (the quickstart's, a test's)
    still reports its interval and lower bound, marked as shortened."""
    return repeats >= MIN_REPEATS and min_seconds >= MIN_SECONDS and not short_repeats


# ------------------------------------------------------------------------------ the machine
#: the vector extensions that matter for the engines (``/proc/cpuinfo`` flags), in this order
VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                     "amx_tile", "avx_vnni")


def _cpuinfo_field(name: str) -> Optional[str]:
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def vector_extensions() -> List[str]:
    """The vector extensions of this CPU among :data:`VECTOR_EXTENSIONS` (``/proc/cpuinfo`` flags)."""
    flags = set((_cpuinfo_field("flags") or "").split())
    return [f for f in VECTOR_EXTENSIONS if f in flags]


def machine(cores: Optional[Sequence[int]] = None) -> dict:
    """What every record names: the CPU model, its vector extensions, the online cores and the cores
    the timed runs were pinned to."""
    return {"cpu": cpu_model(), "vector_extensions": vector_extensions(), "online_cores": os.cpu_count(),
            "pinned_cores": list(cores) if cores else None, "python": sys.version.split()[0]}


# ------------------------------------------------------------------------------ pinning and timing
def parse_cores(text: Optional[str]) -> Optional[List[int]]:
    """``0``, ``0-1``, ``0,2``: a list of existing cores (None for no text)."""
    if not text:
        return None
    out: List[int] = []
    for part in str(text).split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    online = os.cpu_count() or 1
    bad = [c for c in out if c < 0 or c >= online]
    if bad:
        raise ValueError(f"cores {text}: cores {bad} do not exist here (0-{online - 1})")
    return out


def allowed_cores() -> Optional[List[int]]:
    """The cores this process may run on now (None where the OS does not say)."""
    with contextlib.suppress(AttributeError, OSError):
        return sorted(os.sched_getaffinity(0))
    return None


@contextlib.contextmanager
def pinned(cores: Optional[Sequence[int]]) -> Iterator[Optional[List[int]]]:
    """This process (and so every child it starts) pinned to ``cores`` while the block runs; the
    previous affinity restored after.  Yields the cores pinned to (None where the OS has no
    ``sched_setaffinity``, or for no cores)."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield sorted(cores)
    finally:
        os.sched_setaffinity(0, before)


def load1() -> float:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")


def timed_call(fn: Callable[[], Optional[dict]]) -> dict:
    """Run ``fn`` (which starts and waits for its child processes); its wall seconds, the CPU seconds
    (user + system) of the children it waited for, the 1-minute load average before and after, and
    whatever ``fn`` returned (a dict) merged in."""
    load0 = load1()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    extra = fn() or {}
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": round(wall, 4), "cpu": round(cpu, 4), "load_before": load0, "load_after": load1(), **extra}


Command = Union[str, Sequence[str]]


def run_once(command: Command, cores: Optional[Sequence[int]] = None, times: int = 1,
             env: Optional[Dict[str, str]] = None) -> dict:
    """Run ``command`` (a shell command line, or an argv list) ``times`` times back to back, pinned to
    ``cores``: :func:`timed_call`'s record, with ``times``."""
    pin = (lambda: os.sched_setaffinity(0, set(cores))) if cores else None

    def go():
        for _ in range(times):
            res = subprocess.run(command, shell=isinstance(command, str), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, preexec_fn=pin, text=True, env=env)
            if res.returncode != 0:
                raise RuntimeError(f"command failed (exit {res.returncode}): {command}\n{res.stderr[-2000:]}")
        return {"times": times}

    return timed_call(go)


def executions_needed(one_pass_seconds: float, min_seconds: float) -> int:
    """How many passes of the work make :data:`CALIBRATION_MARGIN` x ``min_seconds`` at the pace of
    one (warm-up) pass of ``one_pass_seconds``: at least 1."""
    if min_seconds <= 0:
        return 1
    return max(1, math.ceil(CALIBRATION_MARGIN * min_seconds / max(one_pass_seconds, 1e-6)))


def executions_for(command: Command, min_seconds: float, cores=None) -> Tuple[int, dict]:
    """:data:`WARM_UPS` untimed warm-up executions, and :func:`executions_needed` at the faster one's
    pace."""
    warm = min((run_once(command, cores) for _ in range(WARM_UPS)), key=lambda r: r["wall"])
    return executions_needed(warm["wall"], min_seconds), warm


def interleave(reference: str, candidates: Sequence[str], repeats: int, run: Callable[[str], dict],
               log: Callable[[str], None] = print, min_repeats: int = MIN_REPEATS
               ) -> Tuple[Dict[str, List[dict]], Dict[str, List[dict]]]:
    """``repeats`` rounds, each running the reference and every candidate in turn (reference,
    candidate 1, reference, candidate 2, ...: each candidate's pair adjacent in time); ``run(name)``
    times one run (a :func:`timed_call` record).  Returns every system's runs and, per candidate, the
    reference runs of its pairs."""
    if repeats < min_repeats:
        raise ValueError(f"--repeats {repeats}: the protocol needs at least {min_repeats} interleaved repeats")
    names = [reference, *candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"system names must differ: {names}")
    runs: Dict[str, List[dict]] = {n: [] for n in names}
    pairs: Dict[str, List[dict]] = {n: [] for n in candidates}
    for k in range(repeats):
        for name in candidates:
            r = run(reference)
            c = run(name)
            runs[reference].append(r)
            pairs[name].append(r)
            runs[name].append(c)
            log(f"[speed] repeat {k + 1}/{repeats}: {reference} {r['wall']:.2f} s, {name} {c['wall']:.2f} s "
                f"(load {r['load_before']:.2f} -> {c['load_after']:.2f})")
    return runs, pairs


def short_repeats(runs: Dict[str, List[dict]], min_seconds: float, key: str = "wall") -> int:
    """How many timed runs held less than ``min_seconds`` of work (by ``key``)."""
    return sum(1 for rs in runs.values() for r in rs if r[key] < min_seconds)


def measure(reference: Tuple[str, Command], candidates: Sequence[Tuple[str, Command]], repeats: int = MIN_REPEATS,
            min_seconds: float = MIN_SECONDS, cores: Optional[Sequence[int]] = None, log=print) -> dict:
    """The protocol on whole commands: warm-up and calibration of every command, then ``repeats``
    interleaved rounds, each command executed as often as calibrated (the same work in every
    round); per candidate :func:`summarize` of the per-execution wall times."""
    if repeats < MIN_REPEATS:
        raise ValueError(f"--repeats {repeats}: the protocol needs at least {MIN_REPEATS} interleaved repeats")
    systems = dict([reference, *candidates])
    if len(systems) != 1 + len(candidates):
        raise ValueError(f"system names must differ: {[reference[0], *(n for n, _ in candidates)]}")
    times, warm = {}, {}
    for name, cmd in systems.items():
        times[name], warm[name] = executions_for(cmd, min_seconds, cores)
        log(f"[speed] {name}: one execution {warm[name]['wall']:.2f} s -> {times[name]} per repeat")
    runs, pairs = interleave(reference[0], [n for n, _ in candidates], repeats,
                             lambda name: run_once(systems[name], cores, times[name]), log)
    short = short_repeats(runs, min_seconds)
    if short:
        log(f"[speed] warning: {short} timed repeats ran under {min_seconds} s (the machine sped up after the "
            "warm-up?): rerun on an idle machine")
    results = {}
    for name, _ in candidates:
        # the same work on both sides: per-execution wall times (the two may need different counts)
        results[name] = summarize([r["wall"] / r["times"] for r in pairs[name]],
                                  [c["wall"] / c["times"] for c in runs[name]])
    return {"format": FORMAT, "protocol": protocol_settings(repeats, min_seconds, short),
            "machine": machine(cores), "reference": {"name": reference[0], "command": reference[1]},
            "candidates": [{"name": n, "command": c} for n, c in candidates],
            "executions_per_repeat": times, "warm_up": warm, "runs": runs, "short_repeats": short,
            "results": results, "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def protocol_settings(repeats: int, min_seconds: float, short: int = 0) -> dict:
    """The protocol's parameters as a record states them."""
    return {"repeats": repeats, "min_seconds": min_seconds, "bootstrap": BOOTSTRAP, "confidence": CONFIDENCE,
            "calibration_margin": CALIBRATION_MARGIN, "interleaved": True,
            "meets_protocol": meets_protocol(repeats, min_seconds, short)}


# ------------------------------------------------------------------------------ tuning
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


def tune(name: str, command: str, grid: Dict[str, List[str]], min_seconds: float = MIN_SECONDS, cores=None,
         log=print) -> dict:
    """The tuning pass: each setting of the grid timed once for >= ``min_seconds`` of work after the
    warm-ups; the fastest setting (per-execution wall time) is the choice, recorded with every timing."""
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
