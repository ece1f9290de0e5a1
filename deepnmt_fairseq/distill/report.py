"""The report of a distillation: quality, speed and size of the teacher and the served student,
measured in one run on the raw test set (``report.json`` and ``report.md``).

Quality: sacreBLEU (default 13a tokenization) of detokenized output against the raw references.
fairseq-generate's subword output goes back to text through the exported model's own text
pipeline (:class:`deepnmt_deploy.text.TextPipeline`, the one ``deepnmt-translate`` uses), so the
three systems are detokenized alike.

Speed: target tokens per second, ``</s>`` counted as fairseq counts it, each engine's own count and
decoding timer (model loading excluded), measured by the project's speed protocol
(:mod:`deepnmt_deploy.speed_protocol`, issue 78):

1. **the tuning pass** (:func:`search`): each engine's settings grid is fixed in code and each point
   is timed once on a probe, every :data:`PROBE_EVERY`-th sentence of the set it is chosen for (a
   binarized copy of those sentences for fairseq-generate, the same raw lines for deepnmt-translate:
   every candidate on the same sentences).  The teacher's fairseq-generate, batched: ``--batch-size``
   of :data:`FAIRSEQ_BATCH_SIZES` (and ``batch_size``) and ``--max-tokens`` of :data:`FAIRSEQ_MAX_TOKENS`,
   with every core's torch threads, then 1 torch thread at the fastest point; one sentence at a time,
   every core's threads and 1 thread.  The served student's ``deepnmt-translate`` (tokenization and
   detokenization included: what a user gets), batched: ``--batch-size`` of :data:`CT2_BATCH_SIZES`
   (and ``ct2_batch_size``) with ``--inter-threads <cores> --intra-threads 1`` (parallel batches),
   then ``--inter-threads 1 --intra-threads <cores>`` at the fastest size; one sentence at a time,
   ``--intra-threads`` 1 and every core.  The grid, every probe's rate and the choice are recorded
   (``tuning.json`` next to the report, ``settings_search`` and ``speed.tuning`` in it) and then
   **frozen**: a report measured again in the same directory reads the choice from ``tuning.json``
   (same grid) instead of searching again.
2. **quality**: the teacher, the student (fairseq-generate, at the teacher's chosen batched setting)
   and the served student translate the whole test set once at the chosen setting; these runs give
   the BLEU and are the batched measurement's warm-up and calibration.
3. **the timed runs**, batched (the whole test set) and one sentence at a time (``--batch-size 1`` on
   an evenly spread subset of about ``single_sentences`` test sentences in length order, the same
   sentences for both engines; an untimed pass of each first): teacher and served student
   interleaved (teacher, student, teacher, student, ...), ``speed_repeats`` rounds (the protocol's 5),
   each run holding at least ``speed_min_seconds`` of decoding (the protocol's 10 s): where one pass
   is shorter the input is repeated ``k`` times (a binarized copy of the test split holding every
   sentence ``k`` times for fairseq-generate, the raw lines ``k`` times for deepnmt-translate; ``k``
   from the untimed pass, with the protocol's calibration margin); every run pinned to fixed cores
   (``speed_cores``, default: the cores this process may use; ``os.sched_setaffinity``, inherited by
   the engines), with the engine's decoding seconds and tokens, the process's wall and CPU seconds and
   the 1-minute load average before and after.  The ratio of a pair is the student's tokens/s over the
   teacher's; the report gives their median, the seeded bootstrap 95% interval of the median and
   **the claim, the interval's lower bound** (``summary.speedup_batched`` = the median,
   ``speedup_batched_interval``, ``speedup_batched_claim``; the same for ``single``).  Fewer repeats
   or seconds than the protocol's (the quickstart's shortened protocol, the tests) are marked
   ``meets_protocol: false``.  The student's fairseq-generate one-sentence row is one run, outside
   the protocol (for reference).

``search=False`` (``deepnmt-distill --tiny``, ``--no-speed-search``): no tuning pass; fairseq with every
core's torch threads (1 when the machine is already loaded as the report starts: there OpenMP's
spinning makes more threads many times slower), batches of ``batch_size``; CTranslate2 with parallel
batches of ``ct2_batch_size`` and 1 intra thread.

CTranslate2 runs with ``OMP_NUM_THREADS=1`` in its environment (its threads are its own flags).  On
a GPU (no ``--cpu``) the thread settings do not apply: only batch sizes are searched.  A timed run
started with a load average at or above the number of cores is marked as taken on a loaded machine
(other processes were competing for every core).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from deepnmt_deploy import speed_protocol as protocol
from deepnmt_deploy.vmap import has_vmap

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
    speed_repeats: int = protocol.MIN_REPEATS  # interleaved rounds of the timed runs (module doc)
    speed_min_seconds: float = protocol.MIN_SECONDS  # decoding seconds in one timed run, at least
    speed_cores: Optional[Sequence[int]] = None  # cores the runs are pinned to (None: this process's)


#: the grids of the tuning pass (module doc), fixed here; with the report's own batch sizes.  The
#: teacher's --max-tokens points span its --batch-size points at the study's and the quickstart's
#: sentence lengths (about 15-30 subword tokens: 2048 tokens ~ 70-140 sentences)
FAIRSEQ_BATCH_SIZES = (32, 64, 128, 256)
FAIRSEQ_MAX_TOKENS = (2048, 4096, 8192)
CT2_BATCH_SIZES = (4, 8, 16, 32, 64)
#: a candidate setting is timed on every PROBE_EVERY-th sentence of the set it is chosen for
PROBE_EVERY = 3


@dataclass(frozen=True)
class Setting:
    """How an engine runs: its batch size (or, fairseq-generate's ``--max-tokens``, ``max_tokens`` with
    ``batch_size`` 0), its threads on the CPU (fairseq-generate: torch threads,
    ``OMP_NUM_THREADS``; deepnmt-translate: ``--intra-threads``; 0: not set, the GPU) and
    CTranslate2's ``--inter-threads`` (batches translated in parallel)."""
    batch_size: int
    threads: int = 0
    inter: int = 1
    max_tokens: int = 0

    def describe(self, engine: str) -> str:
        size = ("one sentence at a time" if self.batch_size == 1 else f"batches of {self.batch_size}"
                if self.batch_size else f"batches of up to {self.max_tokens} tokens")
        if not self.threads:
            return f"{engine}, GPU, {size}"
        if engine == "fairseq-generate":
            return f"{engine}, {self.threads} torch thread{'s' if self.threads > 1 else ''}, {size}"
        return f"{engine} (CTranslate2), inter_threads {self.inter} x intra_threads {self.threads}, {size}"


def search(measure: Callable[[Setting], float], sizes, layouts: List[Setting], engine: str,
           log: Callable[[str], None] = print, max_tokens=()) -> Tuple[Setting, List[dict]]:
    """The tuning pass (module doc): the fastest setting by ``measure`` (tokens/s on a probe): each
    batch size of ``sizes`` and each token budget of ``max_tokens`` with the first thread layout of
    ``layouts``, then the other layouts at the fastest point.  Returns it and every candidate's rate,
    in the order tried.  One candidate: returned untimed."""
    first = [replace(layouts[0], batch_size=b) for b in sorted(set(sizes))]
    first += [replace(layouts[0], batch_size=0, max_tokens=t) for t in sorted(set(max_tokens))]
    if len(first) == 1 and len(layouts) == 1:
        return first[0], []
    rates: Dict[Setting, float] = {}

    def rate(s: Setting) -> float:
        if s not in rates:
            rates[s] = measure(s)
            log(f"  probe: {s.describe(engine)}: {rates[s]:.0f} tok/s")
        return rates[s]

    best = max(first, key=rate)
    best = max([best, *(replace(lay, batch_size=best.batch_size, max_tokens=best.max_tokens)
                        for lay in layouts[1:])], key=rate)
    return best, [{"setting": k.describe(engine), "tokens_per_s": v} for k, v in rates.items()]


class BinarizedSplit:
    """A split of a fairseq data directory (binarized, ``SPLIT.SRC-TGT.LANG.{bin,idx}``): its sentence
    count and source lengths, and copies of some of its sentences (:meth:`copy`)."""

    def __init__(self, data: Path, split: str = "test"):
        self.data, self.split = Path(data), split
        self.prefixes = sorted(p.with_suffix("") for p in self.data.glob(f"{split}.*-*.*.idx"))
        if not self.prefixes:
            raise ValueError(f"--data {data}: no binarized {split} split ({split}.SRC-TGT.LANG.idx)")
        src = self.prefixes[0].name.split(".")[1].split("-")[0]
        self.source = next((p for p in self.prefixes if p.name.endswith("." + src)), self.prefixes[0])
        ds = self._dataset(self.source)  # alive while its sizes are read: they are a view of its memory map
        self.sizes = [int(x) for x in ds.sizes]
        del ds

    @staticmethod
    def _dataset(prefix: Path):
        from fairseq.data import indexed_dataset

        return indexed_dataset.make_dataset(str(prefix), indexed_dataset.infer_dataset_impl(str(prefix)))

    def __len__(self) -> int:
        return len(self.sizes)

    def copy(self, out: Path, ids: Sequence[int]) -> Path:
        """A data directory (``out``) whose split holds the sentences ``ids`` of this one, in that order
        (an id may repeat: the input repeated), both sides; the dictionaries linked.  Made once: an
        existing complete copy is reused."""
        from fairseq.data import indexed_dataset

        out = Path(out)
        done = out / ".ids"
        stamp = ",".join(map(str, ids))
        if done.exists() and done.read_text() == stamp:
            return out
        out.mkdir(parents=True, exist_ok=True)
        for d in self.data.glob("dict.*.txt"):
            if not (out / d.name).exists():
                os.symlink(d.resolve(), out / d.name)
        for prefix in self.prefixes:
            lang = prefix.name.rsplit(".", 1)[1]
            with open(self.data / f"dict.{lang}.txt", encoding="utf-8") as f:
                vocab = sum(1 for _ in f) + 4
            ds = self._dataset(prefix)
            builder = indexed_dataset.make_builder(str(out / f"{prefix.name}.bin"), "mmap", vocab_size=vocab)
            for i in ids:
                builder.add_item(ds[i])
            builder.finalize(str(out / f"{prefix.name}.idx"))
        done.write_text(stamp)
        return out


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

    def fairseq(self, name: str, model: Path, s: Setting, shards: int = 1, tag: str = "",
                data: Optional[Path] = None) -> dict:
        """fairseq-generate on the test split of ``data`` (default: the report's; every ``shards``-th
        batch when ``shards`` > 1): hypotheses (subword strings by id) and speed (fairseq's own count
        and rate, from its unrounded decoding time)."""
        from ..generate_output import parse_generate

        r = self.r
        argv = generate_command(data or r.data, model,
                                Search(beam=r.beam, lenpen=r.lenpen, batch_size=s.batch_size or None,
                                       max_tokens=s.max_tokens or None, max_len_a=r.max_len_a,
                                       max_len_b=r.max_len_b), "test",
                                shard=(0, shards) if shards > 1 else None, cpu=r.cpu)
        load = load_now()
        out = self.tmp / f"{name}-{tag or ('single' if s.batch_size == 1 else 'batched')}.generate.txt"
        self.log("$ " + " ".join(argv))
        generate(argv, out, stderr=out.with_suffix(".log"), env=self.env(s.threads))
        parsed = parse_generate(out.read_text(encoding="utf-8") + out.with_suffix(".log").read_text(encoding="utf-8"))
        if "gen_tokens" not in parsed:
            raise RuntimeError(f"{out.with_suffix('.log')}: no 'Translated ... tokens' line from fairseq-generate")
        rate = parsed["tokens_per_s"] or parsed["gen_tokens"] / max(parsed["decode_seconds"], 1e-9)
        return {"hyps": parsed["hyps"], "tokens": parsed["gen_tokens"],
                "seconds": round(parsed["gen_tokens"] / max(rate, 1e-9), 4), "tokens_per_s": round(rate, 1),
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
        return {"lines": lines, "tokens": int(m[2]), "seconds": round(int(m[2]) / max(rate, 1e-9), 4),
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


ENGINES = ("teacher fairseq-generate", "student deepnmt-translate")


def tuning_pass(m: "Measure", split: BinarizedSplit, srcs: List[str], subsets: Dict[bool, List[int]],
                log: Callable[[str], None] = print) -> dict:
    """The protocol's tuning pass (module doc): each engine's grid (fixed in code), batched and one
    sentence at a time (``subsets[single]``: the sentences it is chosen for), each point timed once on
    a probe (every :data:`PROBE_EVERY`-th of those sentences); the grid, every rate and the choice
    written to ``tuning.json`` and then frozen: an existing ``tuning.json`` of the same grid gives the
    choice without a search.  Returns ``{"settings": {(engine, single): Setting}, "record": ...}``."""
    r = m.r
    grid, layouts, points = {}, {}, {}
    for single in (False, True):
        kind = "single" if single else "batched"
        fs_sizes = (1,) if single else ((*FAIRSEQ_BATCH_SIZES, r.batch_size) if r.search else (r.batch_size,))
        fs_tokens = () if single or not r.search else FAIRSEQ_MAX_TOKENS
        ct_sizes = (1,) if single else ((*CT2_BATCH_SIZES, r.ct2_batch_size) if r.search else (r.ct2_batch_size,))
        for name, engine, sizes, tokens in ((ENGINES[0], "fairseq-generate", fs_sizes, fs_tokens),
                                            (ENGINES[1], "deepnmt-translate", ct_sizes, ())):
            layouts[name, single] = m.layouts(engine, single)
            points[name, single] = (sorted(set(sizes)), sorted(set(tokens)))
            grid.setdefault(name, {})[kind] = {
                "batch_size": points[name, single][0], "max_tokens": points[name, single][1],
                "layouts": [{"threads": lay.threads, "inter": lay.inter} for lay in layouts[name, single]]}
    path = m.tmp / "tuning.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    if old.get("grid") == grid and old.get("probe_every") == PROBE_EVERY and old.get("chosen"):
        log(f"tuning pass: the choice recorded in {path} (frozen; delete it to tune again)")
        settings = {(name, kind == "single"): Setting(**st) for name, kinds in old["chosen"].items()
                    for kind, st in kinds.items()}
        return {"settings": settings, "record": {**{k: old[k] for k in ("grid", "choice", "tried")}, "frozen": True,
                                                "file": str(path)}}
    settings, tried = {}, {}
    for single in (False, True):
        kind = "single" if single else "batched"
        probe_ids = subsets[single][::PROBE_EVERY]
        made: Dict[str, Path] = {}

        def probe_data(ids=probe_ids, kind=kind, made=made) -> Path:  # made at the first probe that needs it
            if "data" not in made:
                made["data"] = split.copy(m.tmp / f"probe-{kind}", ids)
                made["src"] = m.tmp / f"probe-{kind}.src"
                made["src"].write_text("".join(srcs[i] + "\n" for i in ids), encoding="utf-8")
            return made

        if any(len(points[name, single][0]) + len(points[name, single][1]) + len(layouts[name, single]) > 2
               for name in ENGINES):
            log(f"tuning pass, {kind}: each setting on {len(probe_ids)} sentences (one in {PROBE_EVERY})")
        settings[ENGINES[0], single], tried.setdefault(ENGINES[0], {})[kind] = search(
            lambda st: m.fairseq("teacher", r.teacher, st, tag="probe", data=probe_data()["data"])["tokens_per_s"],
            points[ENGINES[0], single][0], layouts[ENGINES[0], single], "fairseq-generate", log,
            max_tokens=points[ENGINES[0], single][1])
        settings[ENGINES[1], single], tried.setdefault(ENGINES[1], {})[kind] = search(
            lambda st: m.ct2("student-ct2", probe_data()["src"], st, tag="probe")["tokens_per_s"],
            points[ENGINES[1], single][0], layouts[ENGINES[1], single], "deepnmt-translate", log)
    engine = {ENGINES[0]: "fairseq-generate", ENGINES[1]: "deepnmt-translate"}
    record = {"grid": grid, "tried": tried,
              "choice": {name: {("single" if single else "batched"): st.describe(engine[name])
                                for (nm, single), st in settings.items() if nm == name} for name in ENGINES}}
    path.write_text(json.dumps({"format": protocol.FORMAT, **record, "probe_every": PROBE_EVERY,
                                "chosen": {name: {("single" if single else "batched"): asdict(st)
                                                  for (nm, single), st in settings.items() if nm == name}
                                           for name in ENGINES},
                                "machine": protocol.machine(protocol.allowed_cores()),
                                "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    return {"settings": settings, "record": {**record, "frozen": False, "file": str(path)}}


def timed_pairs(m: "Measure", split: BinarizedSplit, srcs: List[str], kind: str, ids: List[int],
                systems: Dict[str, Tuple[Setting, dict]], log: Callable[[str], None] = print) -> dict:
    """The protocol's timed runs of one kind (``batched``/``single``) on the sentences ``ids``: teacher
    (fairseq-generate) and served student (deepnmt-translate) interleaved, ``speed_repeats`` rounds,
    each run the input repeated ``k`` times (``k`` from the untimed pass in ``systems``, for at least
    ``speed_min_seconds`` of decoding); the runs and the ratios' statistics (:func:`protocol.summarize`
    of the seconds per target token: the ratio is the student's tokens/s over the teacher's)."""
    r = m.r
    passes = {who: protocol.executions_needed(run["seconds"], r.speed_min_seconds) for who, (_, run) in systems.items()}
    whole = kind == "batched" and passes["teacher"] == 1
    data = r.data if whole else split.copy(m.tmp / f"speed-{kind}-x{passes['teacher']}", ids * passes["teacher"])
    src = m.tmp / f"speed-{kind}.src"
    src.write_text("".join(srcs[i] + "\n" for i in ids) * passes["student"], encoding="utf-8")
    log(f"timed runs, {kind}: teacher and student interleaved, {r.speed_repeats} rounds; the input "
        f"({len(ids)} sentences) {passes['teacher']}x for the teacher, {passes['student']}x for the student "
        f"(>= {r.speed_min_seconds:g} s of decoding a run)")

    def one(who: str) -> dict:
        def go() -> dict:
            if who == "teacher":
                res = m.fairseq("teacher", r.teacher, systems[who][0], tag=f"speed-{kind}", data=data)
            else:
                res = m.ct2("student-ct2", src, systems[who][0], tag=f"speed-{kind}")
            return {k: res[k] for k in ("seconds", "tokens", "tokens_per_s", "sentences")}

        return protocol.timed_call(go)

    runs, _ = protocol.interleave("teacher", ["student"], r.speed_repeats, one, log=log, min_repeats=1)
    result = protocol.summarize([x["seconds"] / x["tokens"] for x in runs["teacher"]],
                                [x["seconds"] / x["tokens"] for x in runs["student"]])
    short = protocol.short_repeats(runs, r.speed_min_seconds, key="seconds")
    if short:
        log(f"warning: {short} timed {kind} runs held under {r.speed_min_seconds:g} s of decoding")
    log(f"{kind}: the served student at {result['median']:.2f}x the teacher's tokens/s (median), 95% interval "
        f"{result['interval'][0]:.2f}-{result['interval'][1]:.2f}")
    return {"sentences": len(ids), "passes": passes, "runs": runs, "result": result, "short_repeats": short}


def speed_summary(speed: Dict[str, dict], repeats: int, min_seconds: float) -> dict:
    """The report's summary of the timed runs (:func:`timed_pairs` of each kind): ``speedup_KIND``, the
    median ratio; ``speedup_KIND_interval``, its 95% interval, outwards to 2 places; ``speedup_KIND_claim``,
    the interval's lower bound (never rounded up); ``speed_meets_protocol``."""
    out: dict = {}
    for kind in ("batched", "single"):
        res = speed[kind]["result"]
        lo, hi = math.floor(res["interval"][0] * 100) / 100, math.ceil(res["interval"][1] * 100) / 100
        out.update({f"speedup_{kind}": round(res["median"], 2), f"speedup_{kind}_interval": [lo, hi],
                    f"speedup_{kind}_claim": lo})
    short = sum(speed[kind]["short_repeats"] for kind in speed)
    out["speed_meets_protocol"] = protocol.meets_protocol(repeats, min_seconds, short)
    return out


def protocol_rates(first: dict, timed: dict, who: str, cores: int) -> dict:
    """A system's row (``batched``/``single``) from its timed runs: the median tokens/s, the load (the
    highest 1-minute load average before a run; loaded: at or above the cores), and its untimed first
    pass (``first_pass``)."""
    import statistics

    runs = timed["runs"][who]
    load = max(x["load_before"] for x in runs)
    return {"tokens_per_s": round(statistics.median(x["tokens"] / x["seconds"] for x in runs), 1),
            "sentences": first["sentences"], "setting": first["setting"], "timed_runs": len(runs),
            "passes_per_run": timed["passes"][who], "protocol": True,
            "load": {"load1": load, "cores": cores, "loaded": bool(load >= cores)},
            "first_pass": {k: first[k] for k in ("tokens", "seconds", "tokens_per_s", "load")}}


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
    split = BinarizedSplit(r.data)
    if len(split) != n:
        raise ValueError(f"the test split of --data {r.data} has {len(split)} sentences, --test-source {r.test_source} "
                         f"{n} lines: the raw test set must be the one binarized in --data")
    # one sentence at a time: an evenly spread subset in length order, about single_sentences of them
    every = max(2, math.ceil(n / max(1, r.single_sentences))) if r.single_sentences < n else 1
    single_ids = sorted(sorted(range(n), key=lambda i: (split.sizes[i], i))[::every])

    def text_of(run: dict, name: str, flag: str) -> List[str]:
        ids = sorted(run["hyps"])
        if ids != list(range(n)):
            raise ValueError(f"fairseq-generate translated {len(ids)} sentences of the test split of --data {r.data}, "
                             f"{flag} has {n} lines: the raw test set must be the one binarized in --data")
        return [pipeline.decode(run["hyps"][i].split()) for i in ids]

    t0 = time.time()
    cores = list(r.speed_cores) if r.speed_cores else protocol.allowed_cores()
    with protocol.pinned(cores) as pinned_to:
        tuning = tuning_pass(m, split, srcs, {False: list(range(n)), True: single_ids}, log)
        choice = tuning["settings"]
        log("quality: each system translates the whole test set at its chosen setting (also the batched timing's "
            "warm-up and calibration)")
        runs = {"teacher fairseq-generate": m.fairseq("teacher", r.teacher, choice["teacher fairseq-generate", False]),
                "student fairseq-generate": m.fairseq("student", r.student, choice["teacher fairseq-generate", False]),
                "student deepnmt-translate": m.ct2("student-ct2", Path(r.test_source),
                                                   choice["student deepnmt-translate", False])}
        systems = {}
        for name, run in runs.items():
            hyps = run.pop("lines") if "lines" in run else text_of(run, name, "--test-source")
            run.pop("hyps", None)
            if len(hyps) != n:
                raise ValueError(f"{name}: {len(hyps)} translations for {n} test sentences")
            (m.tmp / f"{name.replace(' ', '.')}.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
            systems[name] = {**sacrebleu_of(hyps, refs), "batched": run}
        log(f"one sentence at a time: {len(single_ids)} test sentences, an untimed pass of each system first")
        single_data = split.copy(m.tmp / "single", single_ids)
        single_src = m.tmp / "single.src"
        single_src.write_text("".join(srcs[i] + "\n" for i in single_ids), encoding="utf-8")
        single = {"teacher fairseq-generate": m.fairseq("teacher", r.teacher, choice["teacher fairseq-generate", True],
                                                        data=single_data),
                  "student fairseq-generate": m.fairseq("student", r.student, choice["teacher fairseq-generate", True],
                                                        data=single_data),
                  "student deepnmt-translate": m.ct2("student-ct2", single_src,
                                                     choice["student deepnmt-translate", True])}
        for name, run in single.items():
            run.pop("hyps", None)
            run.pop("lines", None)
            systems[name]["single"] = run
        speed = {}
        for kind, ids in (("batched", list(range(n))), ("single", single_ids)):
            speed[kind] = timed_pairs(m, split, srcs, kind, ids, {
                "teacher": (choice["teacher fairseq-generate", kind == "single"],
                            systems["teacher fairseq-generate"][kind]),
                "student": (choice["student deepnmt-translate", kind == "single"],
                            systems["student deepnmt-translate"][kind])}, log)
    # the teacher's and the served student's rates: the median of their timed runs (the first pass's
    # kept as first_pass); the student's fairseq-generate rows are that one pass (outside the protocol)
    for kind in ("batched", "single"):
        for name, who in (("teacher fairseq-generate", "teacher"), ("student deepnmt-translate", "student")):
            systems[name][kind] = protocol_rates(systems[name][kind], speed[kind], who, m.cores)
        systems["student fairseq-generate"][kind]["protocol"] = False
    base = systems["teacher fairseq-generate"]
    served = systems["student deepnmt-translate"]
    short = sum(speed[kind]["short_repeats"] for kind in speed)
    summary = {"bleu_served_minus_teacher": round(served["sacrebleu"] - base["sacrebleu"], 2),
               **speed_summary(speed, r.speed_repeats, r.speed_min_seconds)}
    sizes = {"teacher": {"checkpoint": str(r.teacher), "parameters": params_of(r.teacher),
                         "bytes": disk_size(r.teacher)},
             "student": {"checkpoint": str(r.student), "parameters": params_of(r.student),
                         "bytes": disk_size(r.student)},
             "served": {"model": str(r.ct2), "quantization": meta.get("quantization"), "bytes": disk_size(r.ct2),
                        "shortlist": has_vmap(r.ct2)}}
    loaded = [f"{name} ({kind})" for name, s in systems.items() for kind in ("batched", "single") if
              s[kind]["load"]["loaded"]]
    report = {"test": {"source": str(r.test_source), "reference": str(r.test_reference), "sentences": n,
                       "single_sentences": len(single_ids)},
              "search": {"beam": r.beam, "lenpen": r.lenpen, "max_len_a": r.max_len_a, "max_len_b": r.max_len_b},
              "device": "cpu" if r.cpu else "cuda", "systems": systems, "summary": summary, "sizes": sizes,
              "machine": {**{k: v for k, v in describe().items() if k != "threads"}, "pinned_cores": pinned_to},
              "speed": {"protocol": protocol.protocol_settings(r.speed_repeats, r.speed_min_seconds, short),
                        "timed": "each engine's own decoding seconds and target tokens (model loading excluded); "
                                 "each run's process wall and CPU seconds and the load before and after recorded",
                        "ratio": "served student's tokens/s over the teacher's, per interleaved pair",
                        "pinned_cores": pinned_to, "tuning": tuning["record"], **speed},
              "loaded_machine": loaded, "settings_search": tuning["record"]["tried"],
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
    ext = f", {' '.join(mc['vector_extensions'])}" if mc.get("vector_extensions") else ""
    pin = f", pinned to cores {','.join(map(str, mc['pinned_cores']))}" if mc.get("pinned_cores") else ""
    return f" ({mc['cpu']}{ext}, {mc['kernels']} kernels, {mc['cores']} cores{pin}{gpu}; torch {mc['torch']})"


def speed_claim(sm: dict, kind: str) -> str:
    """``>= 9.2x (median 10.1x, 95% CI 9.2-11.0)``: the claim (the interval's lower bound) first; a
    report measured before the protocol (no interval): its ratio alone."""
    if f"speedup_{kind}_claim" not in sm:
        return f"{sm[f'speedup_{kind}']}x"
    lo, hi = sm[f"speedup_{kind}_interval"]
    return f"≥{sm[f'speedup_{kind}_claim']}x (median {sm[f'speedup_{kind}']}x, 95% CI {lo}-{hi})"


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
    lines += ["", f"Served student vs teacher: {sm['bleu_served_minus_teacher']:+.2f} sacreBLEU; speed, the claim being "
                  f"the lower bound of the 95% interval of the median ratio: {speed_claim(sm, 'batched')} batched, "
                  f"{speed_claim(sm, 'single')} one sentence at a time."]
    sp = rep.get("speed")
    if sp:
        pr = sp["protocol"]
        b, o = sp["batched"], sp["single"]
        lines += ["", f"Speed protocol (deepnmt_deploy/speed_protocol.py): teacher and served student interleaved, "
                      f"{pr['repeats']} rounds, each run >= {pr['min_seconds']:g} s of decoding (the input repeated: "
                      f"batched {b['passes']['teacher']}x / {b['passes']['student']}x, one sentence at a time "
                      f"{o['passes']['teacher']}x / {o['passes']['student']}x for teacher / student), pinned to cores "
                      f"{','.join(map(str, sp['pinned_cores'] or [])) or '(not pinned)'}; each engine's own decoding "
                      f"timer; the ratio of a pair is the student's tokens/s over the teacher's; the median, a seeded "
                      f"bootstrap {pr['confidence']:.0%} interval ({pr['bootstrap']} resamples) and its lower bound, "
                      "the claim. " + ("The protocol's minimum (5 rounds of >= 10 s) is met." if pr["meets_protocol"]
                                        else "Shortened: fewer rounds or seconds than the protocol's 5 of >= 10 s (or "
                                             "a run held less than asked), so these figures are not a claim of the "
                                             "protocol's."),
                  f"Ratios of the pairs: batched {', '.join(f'{x:.2f}' for x in b['result']['ratios'])}; one "
                  f"sentence at a time {', '.join(f'{x:.2f}' for x in o['result']['ratios'])}. The student's "
                  "fairseq-generate rows are one run each, outside the protocol."]
    lines += ["",
              "| model | parameters | size on disk |", "|---|---|---|",
              f"| teacher ({sz['teacher']['checkpoint']}) | {sz['teacher']['parameters']:,} | "
              f"{_mb(sz['teacher']['bytes'])} |",
              f"| student ({sz['student']['checkpoint']}) | {sz['student']['parameters']:,} | "
              f"{_mb(sz['student']['bytes'])} |",
              f"| served student, CTranslate2 {sz['served']['quantization']}"
              f"{' with the vocabulary shortlist' if sz['served'].get('shortlist') else ''} ({sz['served']['model']}) | "
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
        frozen = (rep.get("speed") or {}).get("tuning", {}).get("frozen")
        lines += ["", f"Settings searched (the tuning pass: tok/s on a probe, one sentence in {rep['probe_every']} of "
                      "the set; the fastest is measured above" + (", read from tuning.json: frozen" if frozen else "")
                  + "):"]
        for name, kinds in searched.items():
            for kind, tried in kinds.items():
                if tried:
                    lines.append(f"- {name}, {kind}: " + "; ".join(
                        f"{t['setting'].split(', ', 1)[1]}: {t['tokens_per_s']:.0f}" for t in tried))
    if rep.get("settings"):
        lines += ["", f"Command: `{rep['settings']}`"]
    return "\n".join(lines) + "\n"
