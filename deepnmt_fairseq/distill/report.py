"""The report of a distillation: quality, speed and size of the teacher and the served student,
measured in one run on the raw test set (``report.json`` and ``report.md``).

Quality: sacreBLEU (default 13a tokenization) of detokenized output against the raw references.
fairseq-generate's subword output goes back to text through the exported model's own text
pipeline (:class:`deepnmt_deploy.text.TextPipeline`, the one ``deepnmt-translate`` uses), so the
three systems are detokenized alike.

Speed: target tokens per second, ``</s>`` counted as fairseq counts it, each engine at its best
setting on this machine, found by a search in the same run (issue 71: "each engine at its best
thread setting", "fairseq-generate's best batch size and threads"; :func:`search`):

* the teacher's fairseq-generate (its own "Translated ... tokens" count and timer, model loading
  excluded): batched, ``--batch-size`` of :data:`FAIRSEQ_BATCH_SIZES` (and ``batch_size``) with
  every core's torch threads, then 1 torch thread at the fastest size; one sentence at a time,
  every core's threads and 1 thread;
* the served student's ``deepnmt-translate`` (its own count and timer, tokenization and
  detokenization included: what a user gets): batched, ``--batch-size`` of :data:`CT2_BATCH_SIZES`
  (and ``ct2_batch_size``) with ``--inter-threads <cores> --intra-threads 1`` (parallel batches),
  then ``--inter-threads 1 --intra-threads <cores>`` at the fastest size; one sentence at a time,
  ``--intra-threads`` 1 and every core;
* each candidate is timed on a probe: every :data:`PROBE_EVERY`-th sentence of the set it is chosen
  for; the chosen setting is then measured on the whole set (the batched rows: the whole test set;
  the one-sentence rows: ``--batch-size 1`` on an evenly spread subset of about ``single_sentences``
  test sentences, fairseq-generate's batch sharding ``--distributed-world-size K
  --distributed-rank 0``, every K-th sentence in length order, the same sentences for every
  engine).  The student's fairseq-generate rows (for its BLEU) use the teacher's chosen settings.
  Every candidate's rate is in ``report.json`` (``settings_search``) and ``report.md``;
* ``search=False`` (``deepnmt-distill --tiny``, ``--no-speed-search``): no probes; fairseq with
  every core's threads (1 when the machine is already loaded as the report starts: there OpenMP's
  spinning makes more threads many times slower), batches of ``batch_size``; CTranslate2 with
  parallel batches of ``ct2_batch_size`` and 1 intra thread.

CTranslate2 runs with ``OMP_NUM_THREADS=1`` in its environment (its threads are its own flags).  On
a GPU (no ``--cpu``) the thread settings do not apply: only batch sizes are searched.  Before each
measurement the 1-minute load average is recorded; a measurement started with a load average
at or above the number of cores is marked as taken on a loaded machine (other processes were
competing for every core).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from ..jobs.decode import Search, generate, generate_command

# its rate is computed from the unrounded time (the seconds printed are rounded to 0.1 s)
_TRANSLATE = re.compile(r"deepnmt-translate: (\d+) lines, (\d+) target tokens in ([\d.]+) s \((\d+) tok/s\)")


@dataclass
class ReportInputs:
    out: Path  # report directory
    data: Path
    teacher: Path
    student: Path
    ct2: Path
    test_source: Path
    test_reference: Path
    cpu: bool = True
    beam: int = 5
    lenpen: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    batch_size: int = 64
    ct2_batch_size: int = 32
    single_sentences: int = 300
    settings_note: str = ""
    search: bool = True  # each engine's best setting searched first (module doc)


#: the batch sizes tried for each engine's batched speed (module doc), with the report's own
FAIRSEQ_BATCH_SIZES = (32, 64, 128, 256)
CT2_BATCH_SIZES = (4, 8, 16, 32, 64)
#: a candidate setting is timed on every PROBE_EVERY-th sentence of the set it is chosen for
PROBE_EVERY = 3


@dataclass(frozen=True)
class Setting:
    """How an engine runs: its batch size, its threads on the CPU (fairseq-generate: torch threads,
    ``OMP_NUM_THREADS``; deepnmt-translate: ``--intra-threads``; 0: not set, the GPU) and
    CTranslate2's ``--inter-threads`` (batches translated in parallel)."""
    batch_size: int
    threads: int = 0
    inter: int = 1

    def describe(self, engine: str) -> str:
        size = "one sentence at a time" if self.batch_size == 1 else f"batches of {self.batch_size}"
        if not self.threads:
            return f"{engine}, GPU, {size}"
        if engine == "fairseq-generate":
            return f"{engine}, {self.threads} torch thread{'s' if self.threads > 1 else ''}, {size}"
        return f"{engine} (CTranslate2), inter_threads {self.inter} x intra_threads {self.threads}, {size}"


def search(measure: Callable[[Setting], float], sizes, layouts: List[Setting], engine: str,
           log: Callable[[str], None] = print) -> Tuple[Setting, List[dict]]:
    """The fastest setting by ``measure`` (tokens/s on a probe): each batch size of ``sizes`` with the
    first thread layout of ``layouts``, then the other layouts at the fastest size.  Returns it and
    every candidate's rate, in the order tried.  One candidate: returned untimed."""
    sizes = sorted(set(sizes))
    first = [replace(layouts[0], batch_size=b) for b in sizes]
    if len(first) == 1 and len(layouts) == 1:
        return first[0], []
    rates: Dict[Setting, float] = {}

    def rate(s: Setting) -> float:
        if s not in rates:
            rates[s] = measure(s)
            log(f"  probe: {s.describe(engine)}: {rates[s]:.0f} tok/s")
        return rates[s]

    best = max(first, key=rate)
    best = max([best, *(replace(lay, batch_size=best.batch_size) for lay in layouts[1:])], key=rate)
    return best, [{"setting": k.describe(engine), "tokens_per_s": v} for k, v in rates.items()]


def params_of(checkpoint: Path) -> int:
    """Parameters of a checkpoint's model: the floating-point tensors of its state dict."""
    from ..checkpoint_safety import load_checkpoint

    state = load_checkpoint(str(checkpoint))["model"]
    return int(sum(v.numel() for k, v in state.items() if v.is_floating_point() and not k.endswith("_float_tensor")))


def disk_size(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def load_now() -> Dict[str, float]:
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cores = os.cpu_count() or 1
    return {"load1": round(load1, 2), "cores": cores, "loaded": bool(load1 >= cores)}


class Measure:
    """Runs the engines on the test set (or a probe of it) with a given :class:`Setting`."""

    def __init__(self, r: ReportInputs, runner_log: Callable[[str], None]):
        from ..console import child_env, exe
        from ..machine import cores

        self.r, self.log, self.exe, self.child_env = r, runner_log, exe, child_env
        self.base = dict(os.environ, PYTHONUNBUFFERED="1")
        self.cores = cores()
        # without a search: every core's torch threads, 1 on a loaded machine (module doc)
        self.default_threads = (1 if load_now()["loaded"] else self.cores) if r.cpu else 0
        self.tmp = r.out
        self.tmp.mkdir(parents=True, exist_ok=True)

    def env(self, threads: int) -> dict:
        """The child environment with ``threads`` OpenMP/MKL threads (0: left as it is)."""
        env = dict(self.base)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        return self.child_env(env)

    def _run(self, argv: List[str], stdout: Path, stderr: Path, env: dict) -> None:
        cmd = [self.exe(argv[0]), *[str(a) for a in argv[1:]]]
        self.log("$ " + " ".join([argv[0], *cmd[1:]]))
        with open(stdout, "w", encoding="utf-8") as o, open(stderr, "w", encoding="utf-8") as e:
            res = subprocess.run(cmd, stdout=o, stderr=e, env=env)
        if res.returncode:
            tail = stderr.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RuntimeError(f"{argv[0]} failed (exit {res.returncode}); end of {stderr}:\n{tail}")

    def fairseq(self, name: str, model: Path, s: Setting, shards: int = 1, tag: str = "") -> dict:
        """fairseq-generate on the test split (every ``shards``-th sentence in length order when
        ``shards`` > 1): hypotheses (subword strings by id) and speed."""
        from ..generate_output import parse_generate

        r = self.r
        argv = generate_command(r.data, model, Search(beam=r.beam, lenpen=r.lenpen, batch_size=s.batch_size,
                                                      max_len_a=r.max_len_a, max_len_b=r.max_len_b), "test",
                                shard=(0, shards) if shards > 1 else None, cpu=r.cpu)
        load = load_now()
        out = self.tmp / f"{name}-{tag or ('single' if s.batch_size == 1 else 'batched')}.generate.txt"
        self.log("$ " + " ".join(argv))
        generate(argv, out, stderr=out.with_suffix(".log"), env=self.env(s.threads))
        parsed = parse_generate(out.read_text(encoding="utf-8") + out.with_suffix(".log").read_text(encoding="utf-8"))
        if "gen_tokens" not in parsed:
            raise RuntimeError(f"{out.with_suffix('.log')}: no 'Translated ... tokens' line from fairseq-generate")
        return {"hyps": parsed["hyps"], "tokens": parsed["gen_tokens"], "seconds": parsed["decode_seconds"],
                "tokens_per_s": round(parsed["gen_tokens"] / max(parsed["decode_seconds"], 1e-9), 1),
                "sentences": len(parsed["hyps"]), "load": load, "setting": s.describe("fairseq-generate")}

    def ct2(self, name: str, source: Path, s: Setting, tag: str = "") -> dict:
        """deepnmt-translate on the raw lines of ``source``: translations and speed."""
        r = self.r
        out = self.tmp / f"{name}-{tag or ('single' if s.batch_size == 1 else 'batched')}.hyp"
        argv = ["deepnmt-translate", "--model", r.ct2, "--input", source, "--output", out, "--beam", r.beam,
                "--lenpen", r.lenpen, "--max-len-a", r.max_len_a, "--max-len", r.max_len_b,
                "--batch-size", s.batch_size, "--no-progress", "--device", "cpu" if r.cpu else "cuda",
                *(["--inter-threads", s.inter, "--intra-threads", s.threads] if s.threads else [])]
        load = load_now()
        # CTranslate2's OpenMP pool follows its own --intra-threads only with OMP_NUM_THREADS=1 in its
        # environment: with fairseq's 2, one-sentence decoding measured 10x slower (271 against 2941
        # tok/s, the quickstart's student, idle machine)
        self._run(argv, out.with_suffix(".stdout"), out.with_suffix(".log"), self.env(1 if r.cpu else 0))
        m = None
        for m in _TRANSLATE.finditer(out.with_suffix(".log").read_text(encoding="utf-8")):
            pass
        if not m:
            raise RuntimeError(f"{out.with_suffix('.log')}: no summary line from deepnmt-translate")
        lines = out.read_text(encoding="utf-8").split("\n")[:-1]
        rate = float(m[4])
        return {"lines": lines, "tokens": int(m[2]), "seconds": round(int(m[2]) / max(rate, 1e-9), 3),
                "tokens_per_s": rate, "sentences": len(lines), "load": load,
                "setting": s.describe("deepnmt-translate")}

    def layouts(self, engine: str, single: bool) -> List[Setting]:
        """The thread layouts :func:`search` tries (module doc); the first alone without a search."""
        c = self.cores
        if not self.r.cpu:
            return [Setting(0)]
        if engine == "fairseq-generate":
            found = [Setting(0, c), Setting(0, 1)] if self.r.search else [Setting(0, self.default_threads)]
        else:  # CTranslate2: parallel batches first (one sentence: one thread first)
            found = [Setting(0, 1, 1), Setting(0, c, 1)] if single else [Setting(0, 1, c), Setting(0, c, 1)]
        return list(dict.fromkeys(found))[:None if self.r.search else 1]


def sacrebleu_of(hyps: List[str], refs: List[str]) -> Dict[str, object]:
    """A system's row of the report: sacreBLEU (the one scorer, :func:`deepnmt_fairseq.scoring.corpus_bleu`)
    rounded to 2 places, and its signature."""
    from ..scoring import corpus_bleu

    bleu = corpus_bleu(hyps, refs)
    return {"sacrebleu": round(bleu.score, 2), "signature": bleu.signature}


def build_report(r: ReportInputs, log: Callable[[str], None] = print) -> dict:
    """Measure everything (module doc) and write ``report.json`` and ``report.md`` into ``r.out``
    (the JSON last: it marks the report complete)."""
    from deepnmt_deploy.text import TextPipeline, Tokenization
    from deepnmt_deploy.translate import read_metadata

    for flag, path in (("--test-source", r.test_source), ("--test-reference", r.test_reference)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    srcs = Path(r.test_source).read_text(encoding="utf-8").split("\n")
    refs = Path(r.test_reference).read_text(encoding="utf-8").split("\n")
    srcs, refs = srcs[:-1] if srcs[-1] == "" else srcs, refs[:-1] if refs[-1] == "" else refs
    if len(srcs) != len(refs):
        raise ValueError(f"--test-source {r.test_source} has {len(srcs)} lines, --test-reference {r.test_reference} "
                         f"{len(refs)}")
    meta = read_metadata(str(r.ct2))
    pipeline = TextPipeline(Tokenization.from_dict(meta["tokenization"]), str(r.ct2))
    from ..machine import describe

    m = Measure(r, log)
    n = len(srcs)
    shards = max(2, math.ceil(n / max(1, r.single_sentences))) if r.single_sentences < n else 1

    def text_of(run: dict, name: str, flag: str) -> List[str]:
        ids = sorted(run["hyps"])
        if ids != list(range(n)):
            raise ValueError(f"fairseq-generate translated {len(ids)} sentences of the test split of --data {r.data}, "
                             f"{flag} has {n} lines: the raw test set must be the one binarized in --data")
        return [pipeline.decode(run["hyps"][i].split()) for i in ids]

    t0 = time.time()
    # each engine's fastest setting, batched and one sentence at a time (module doc); CTranslate2's
    # probes: every PROBE_EVERY-th raw line (of the whole set / of every `shards`-th line)
    probes = {}
    for single, every in ((False, PROBE_EVERY), (True, shards * PROBE_EVERY)):
        probe_src = m.tmp / f"probe-{'single' if single else 'batched'}.src"
        probe_src.write_text("".join(line + "\n" for line in srcs[::every]), encoding="utf-8")
        fs_sizes = (1,) if single else ((*FAIRSEQ_BATCH_SIZES, r.batch_size) if r.search else (r.batch_size,))
        ct_sizes = (1,) if single else ((*CT2_BATCH_SIZES, r.ct2_batch_size) if r.search else (r.ct2_batch_size,))
        probes[single] = {
            "teacher fairseq-generate": search(
                lambda st, k=every: m.fairseq("teacher", r.teacher, st, k, tag="probe")["tokens_per_s"],
                fs_sizes, m.layouts("fairseq-generate", single), "fairseq-generate", log),
            "student deepnmt-translate": search(
                lambda st, f=probe_src: m.ct2("student-ct2", f, st, tag="probe")["tokens_per_s"],
                ct_sizes, m.layouts("deepnmt-translate", single), "deepnmt-translate", log)}
    best = {(name, single): probes[single][name][0] for single in probes for name in probes[single]}
    fs_batched, fs_single = best["teacher fairseq-generate", False], best["teacher fairseq-generate", True]
    log("measuring with each engine's setting: batched (whole test set), then one sentence at a time")
    runs = {"teacher fairseq-generate": m.fairseq("teacher", r.teacher, fs_batched),
            "student fairseq-generate": m.fairseq("student", r.student, fs_batched),
            "student deepnmt-translate": m.ct2("student-ct2", Path(r.test_source),
                                               best["student deepnmt-translate", False])}
    systems = {}
    for name, run in runs.items():
        hyps = run.pop("lines") if "lines" in run else text_of(run, name, "--test-source")
        run.pop("hyps", None)
        if len(hyps) != n:
            raise ValueError(f"{name}: {len(hyps)} translations for {n} test sentences")
        (m.tmp / f"{name.replace(' ', '.')}.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        systems[name] = {**sacrebleu_of(hyps, refs), "batched": run}
    teacher_single = m.fairseq("teacher", r.teacher, fs_single, shards)
    student_single = m.fairseq("student", r.student, fs_single, shards)
    ids = sorted(teacher_single.pop("hyps"))
    student_single.pop("hyps")
    subset = m.tmp / "single.src"
    subset.write_text("".join(srcs[i] + "\n" for i in ids), encoding="utf-8")
    ct2_single = m.ct2("student-ct2", subset, best["student deepnmt-translate", True])
    ct2_single.pop("lines")
    systems["teacher fairseq-generate"]["single"] = teacher_single
    systems["student fairseq-generate"]["single"] = student_single
    systems["student deepnmt-translate"]["single"] = ct2_single
    settings_search = {name: {("single" if single else "batched"): probes[single][name][1] for single in probes}
                       for name in probes[False]}
    base = systems["teacher fairseq-generate"]
    served = systems["student deepnmt-translate"]
    summary = {
        "bleu_served_minus_teacher": round(served["sacrebleu"] - base["sacrebleu"], 2),
        "speedup_batched": round(served["batched"]["tokens_per_s"] / max(base["batched"]["tokens_per_s"], 1e-9), 2),
        "speedup_single": round(served["single"]["tokens_per_s"] / max(base["single"]["tokens_per_s"], 1e-9), 2),
    }
    sizes = {"teacher": {"checkpoint": str(r.teacher), "parameters": params_of(r.teacher),
                         "bytes": disk_size(r.teacher)},
             "student": {"checkpoint": str(r.student), "parameters": params_of(r.student),
                         "bytes": disk_size(r.student)},
             "served": {"model": str(r.ct2), "quantization": meta.get("quantization"), "bytes": disk_size(r.ct2)}}
    loaded = [f"{name} ({kind})" for name, s in systems.items() for kind in ("batched", "single") if
              s[kind]["load"]["loaded"]]
    report = {"test": {"source": str(r.test_source), "reference": str(r.test_reference), "sentences": n,
                       "single_sentences": len(ids)},
              "search": {"beam": r.beam, "lenpen": r.lenpen, "max_len_a": r.max_len_a, "max_len_b": r.max_len_b},
              "device": "cpu" if r.cpu else "cuda", "systems": systems, "summary": summary, "sizes": sizes,
              "machine": {k: v for k, v in describe().items() if k != "threads"},
              "loaded_machine": loaded, "settings_search": settings_search,
              "probe_every": PROBE_EVERY, "measured_seconds": round(time.time() - t0, 1),
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": r.settings_note}
    (r.out / "report.md").write_text(markdown(report), encoding="utf-8")
    tmp = r.out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, r.out / "report.json")
    return report


def _machine(rep: dict) -> str:
    mc = rep.get("machine")
    if not mc:
        return ""
    gpu = f", {mc['gpu']}" if mc.get("gpu") else ""
    return f" ({mc['cpu']}, {mc['kernels']} kernels, {mc['cores']} cores{gpu}; torch {mc['torch']})"


def _mb(b: int) -> str:
    return f"{b / 1e6:.1f} MB"


def markdown(rep: dict) -> str:
    s = rep["systems"]
    lines = ["# Distillation report", "",
             f"Raw test set: {rep['test']['source']} ({rep['test']['sentences']} sentences; one at a time: "
             f"{rep['test']['single_sentences']} of them, evenly spread in length order). Search: beam "
             f"{rep['search']['beam']}, lenpen {rep['search']['lenpen']}, max length {rep['search']['max_len_a']} x "
             f"source + {rep['search']['max_len_b']}. Device: {rep['device']}{_machine(rep)}. Measured {rep['measured_at']} in one run "
             f"({rep['measured_seconds']} s).", "",
             "| system | sacreBLEU | batched tok/s | one sentence tok/s | setting (batched; single) |",
             "|---|---|---|---|---|"]
    for name, v in s.items():
        flag = lambda k: " (loaded)" if v[k]["load"]["loaded"] else ""  # noqa: E731
        lines.append(f"| {name} | {v['sacrebleu']} | {v['batched']['tokens_per_s']:.0f}{flag('batched')} | "
                     f"{v['single']['tokens_per_s']:.0f}{flag('single')} | {v['batched']['setting']}; "
                     f"{v['single']['setting']} |")
    sm, sz = rep["summary"], rep["sizes"]
    lines += ["", f"Served student vs teacher: {sm['bleu_served_minus_teacher']:+.2f} sacreBLEU, "
                  f"{sm['speedup_batched']}x batched, {sm['speedup_single']}x one sentence at a time.", "",
              "| model | parameters | size on disk |", "|---|---|---|",
              f"| teacher ({sz['teacher']['checkpoint']}) | {sz['teacher']['parameters']:,} | "
              f"{_mb(sz['teacher']['bytes'])} |",
              f"| student ({sz['student']['checkpoint']}) | {sz['student']['parameters']:,} | "
              f"{_mb(sz['student']['bytes'])} |",
              f"| served student, CTranslate2 {sz['served']['quantization']} ({sz['served']['model']}) | "
              f"{sz['student']['parameters']:,} | {_mb(sz['served']['bytes'])} |", ""]
    loads = [f"{n} {k}: {v[k]['load']['load1']}" for n, v in s.items() for k in ("batched", "single")]
    if rep["loaded_machine"]:
        lines.append(f"Measured on a loaded machine (1-minute load average >= {s[next(iter(s))]['batched']['load']['cores']}"
                     f" cores when the measurement started): {', '.join(rep['loaded_machine'])}. Load averages: "
                     f"{', '.join(loads)}.")
    else:
        lines.append(f"No measurement started on a loaded machine (load averages: {', '.join(loads)}).")
    searched = rep.get("settings_search") or {}
    if any(tried for v in searched.values() for tried in v.values()):
        lines += ["", f"Settings searched (tok/s on a probe, one sentence in {rep['probe_every']} of the set; the "
                      "fastest is measured on the whole set above):"]
        for name, kinds in searched.items():
            for kind, tried in kinds.items():
                if tried:
                    lines.append(f"- {name}, {kind}: " + "; ".join(
                        f"{t['setting'].split(', ', 1)[1]}: {t['tokens_per_s']:.0f}" for t in tried))
    if rep.get("settings"):
        lines += ["", f"Command: `{rep['settings']}`"]
    return "\n".join(lines) + "\n"
