"""The report of a distillation: quality, speed and size of the teacher and the served student,
measured in one run on the raw test set (``report.json`` and ``report.md``).

Quality: sacreBLEU (default 13a tokenization) of detokenized output against the raw references.
fairseq-generate's subword output goes back to text through the exported model's own text
pipeline (:class:`deepnmt_deploy.text.TextPipeline`, the one ``deepnmt-translate`` uses), so the
three systems are detokenized alike.

Speed: target tokens per second, ``</s>`` counted as fairseq counts it, each engine at its best
setting on a 2-vCPU machine (docs/deployment.md):

* fairseq-generate with 2 torch threads (``OMP_NUM_THREADS=2``): batches of ``batch_size``
  sentences over the whole test set, its own "Translated ... tokens" count and timer (model
  loading excluded).  When the machine is already loaded as the measurement starts (load
  average >= cores) fairseq gets 1 thread instead: there OpenMP's spinning makes 2 threads many
  times slower (benchmarks/deploy_speed.py probes the same choice); the report states it;
* ``deepnmt-translate``: batched with ``--inter-threads 2 --intra-threads 1``, one sentence at a
  time with ``--intra-threads 1``; its own count and timer (tokenization and detokenization
  included: what a user gets);
* one sentence at a time: ``--batch-size 1`` on an evenly spread subset of about
  ``single_sentences`` test sentences (fairseq-generate's batch sharding,
  ``--distributed-world-size K --distributed-rank 0``: every K-th sentence in length order), the
  same sentences for every engine.

On a GPU (no ``--cpu``) the thread settings do not apply and are not set.  Before each
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..jobs.fairseq_argv import fairseq_generate

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
    def __init__(self, r: ReportInputs, runner_log: Callable[[str], None]):
        from ..console import child_env, exe

        self.r, self.log, self.exe = r, runner_log, exe
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # fairseq's torch threads, chosen once for every fairseq measurement (module doc)
        self.threads = 1 if load_now()["loaded"] else 2
        # CTranslate2's OpenMP pool matches its own --intra-threads 1: with fairseq's OMP_NUM_THREADS=2
        # in its environment, one-sentence decoding measured 10x slower (271 against 2941 tok/s,
        # the quickstart's student, idle machine); its threads are set by its own flags
        self.ct2_env = child_env(dict(env, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1") if r.cpu else env)
        if r.cpu:  # each engine at its best thread setting on the CPU (module doc)
            env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        self.env = child_env(env)
        self.tmp = r.out
        self.tmp.mkdir(parents=True, exist_ok=True)

    def _run(self, argv: List[str], stdout: Path, stderr: Path, env: Optional[dict] = None) -> None:
        cmd = [self.exe(argv[0]), *[str(a) for a in argv[1:]]]
        self.log("$ " + " ".join([argv[0], *cmd[1:]]))
        with open(stdout, "w", encoding="utf-8") as o, open(stderr, "w", encoding="utf-8") as e:
            res = subprocess.run(cmd, stdout=o, stderr=e, env=self.env if env is None else env)
        if res.returncode:
            tail = stderr.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RuntimeError(f"{argv[0]} failed (exit {res.returncode}); end of {stderr}:\n{tail}")

    def fairseq(self, name: str, model: Path, shards: int = 1) -> dict:
        """fairseq-generate on the test split: hypotheses (subword strings by id) and speed."""
        from ..generate_output import parse_generate

        r = self.r
        single = shards > 1 or r.batch_size == 1
        argv = fairseq_generate(r.data, ["--path", model, "--gen-subset", "test", "--beam", r.beam, "--lenpen",
                                         r.lenpen, "--max-len-a", r.max_len_a, "--max-len-b", r.max_len_b,
                                         "--required-batch-size-multiple", "1", "--batch-size",
                                         1 if single else r.batch_size,
                                         *(["--distributed-world-size", shards, "--distributed-rank", 0]
                                           if shards > 1 else []), *(["--cpu"] if r.cpu else [])])
        load = load_now()
        kind = "single" if single else "batched"
        out = self.tmp / f"{name}-{kind}.generate.txt"
        self._run(argv, out, out.with_suffix(".log"))
        parsed = parse_generate(out.read_text(encoding="utf-8") + out.with_suffix(".log").read_text(encoding="utf-8"))
        if "gen_tokens" not in parsed:
            raise RuntimeError(f"{out.with_suffix('.log')}: no 'Translated ... tokens' line from fairseq-generate")
        return {"hyps": parsed["hyps"], "tokens": parsed["gen_tokens"], "seconds": parsed["decode_seconds"],
                "tokens_per_s": round(parsed["gen_tokens"] / max(parsed["decode_seconds"], 1e-9), 1),
                "sentences": len(parsed["hyps"]), "load": load,
                "setting": ("fairseq-generate, " + (f"{self.threads} torch thread{'s' if self.threads > 1 else ''}"
                                                    f"{' (machine loaded)' if self.threads == 1 else ''}, "
                                                    if r.cpu else "GPU, ")
                            + ("one sentence at a time" if single else f"batches of {r.batch_size}"))}

    def ct2(self, name: str, source: Path, single: bool) -> dict:
        r = self.r
        out = self.tmp / f"{name}-{'single' if single else 'batched'}.hyp"
        threads = (["--inter-threads", 1, "--intra-threads", 1] if single else ["--inter-threads", 2, "--intra-threads", 1])
        argv = ["deepnmt-translate", "--model", r.ct2, "--input", source, "--output", out, "--beam", r.beam,
                "--lenpen", r.lenpen, "--max-len-a", r.max_len_a, "--max-len", r.max_len_b,
                "--batch-size", 1 if single else r.ct2_batch_size, "--no-progress",
                "--device", "cpu" if r.cpu else "cuda", *(threads if r.cpu else [])]
        load = load_now()
        self._run(argv, self.tmp / f"{name}.stdout", out.with_suffix(".log"), env=self.ct2_env)
        m = None
        for m in _TRANSLATE.finditer(out.with_suffix(".log").read_text(encoding="utf-8")):
            pass
        if not m:
            raise RuntimeError(f"{out.with_suffix('.log')}: no summary line from deepnmt-translate")
        lines = out.read_text(encoding="utf-8").split("\n")[:-1]
        setting = ("deepnmt-translate (CTranslate2), " + (("intra_threads 1, one sentence at a time" if single else
                   f"inter_threads 2 x intra_threads 1, batches of {r.ct2_batch_size}") if r.cpu else
                   ("GPU, one sentence at a time" if single else f"GPU, batches of {r.ct2_batch_size}")))
        rate = float(m[4])
        return {"lines": lines, "tokens": int(m[2]), "seconds": round(int(m[2]) / max(rate, 1e-9), 3),
                "tokens_per_s": rate, "sentences": len(lines),
                "load": load, "setting": setting}


def sacrebleu_of(hyps: List[str], refs: List[str]) -> Dict[str, object]:
    import sacrebleu

    metric = sacrebleu.BLEU()
    return {"sacrebleu": round(metric.corpus_score(hyps, [refs]).score, 2), "signature": str(metric.get_signature())}


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
    log("measuring: batched (whole test set), then one sentence at a time")
    runs = {"teacher fairseq-generate": m.fairseq("teacher", r.teacher),
            "student fairseq-generate": m.fairseq("student", r.student),
            "student deepnmt-translate": m.ct2("student-ct2", Path(r.test_source), single=False)}
    systems = {}
    for name, run in runs.items():
        hyps = run.pop("lines") if "lines" in run else text_of(run, name, "--test-source")
        run.pop("hyps", None)
        if len(hyps) != n:
            raise ValueError(f"{name}: {len(hyps)} translations for {n} test sentences")
        (m.tmp / f"{name.replace(' ', '.')}.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        systems[name] = {**sacrebleu_of(hyps, refs), "batched": run}
    teacher_single = m.fairseq("teacher", r.teacher, shards)
    student_single = m.fairseq("student", r.student, shards)
    ids = sorted(teacher_single.pop("hyps"))
    student_single.pop("hyps")
    subset = m.tmp / "single.src"
    subset.write_text("".join(srcs[i] + "\n" for i in ids), encoding="utf-8")
    ct2_single = m.ct2("student-ct2", subset, single=True)
    ct2_single.pop("lines")
    systems["teacher fairseq-generate"]["single"] = teacher_single
    systems["student fairseq-generate"]["single"] = student_single
    systems["student deepnmt-translate"]["single"] = ct2_single
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
              "loaded_machine": loaded, "measured_seconds": round(time.time() - t0, 1),
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": r.settings_note}
    (r.out / "report.md").write_text(markdown(report), encoding="utf-8")
    tmp = r.out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, r.out / "report.json")
    return report


def _mb(b: int) -> str:
    return f"{b / 1e6:.1f} MB"


def markdown(rep: dict) -> str:
    s = rep["systems"]
    lines = ["# Distillation report", "",
             f"Raw test set: {rep['test']['source']} ({rep['test']['sentences']} sentences; one at a time: "
             f"{rep['test']['single_sentences']} of them, evenly spread in length order). Search: beam "
             f"{rep['search']['beam']}, lenpen {rep['search']['lenpen']}, max length {rep['search']['max_len_a']} x "
             f"source + {rep['search']['max_len_b']}. Device: {rep['device']}. Measured {rep['measured_at']} in one run "
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
    if rep.get("settings"):
        lines += ["", f"Command: `{rep['settings']}`"]
    return "\n".join(lines) + "\n"
