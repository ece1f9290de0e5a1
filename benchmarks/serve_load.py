#!/usr/bin/env python
"""Load benchmark of ``deepnmt-serve`` (issue 79), loopback only: single sentences of a test set
from C concurrent clients, against ``deepnmt-translate``'s batched throughput on the same model.

    python benchmarks/serve_load.py --model OUT_DIR --input test.raw.en [--concurrency 1 8 32 128]
        [--duration 60] [--soak-minutes 10] [--inter-threads 1] [--name NAME] [--note "machine idle"]
    python benchmarks/serve_load.py --random-model DIR --vocab dict.txt [--layers 6 1 --width 128]

1. the reference: the sentences translated in-process by ``DeployedModel`` (what ``deepnmt-translate
   --batch-size B`` runs) with the server's threads, target subword tokens per second (``</s>``
   counted, as ``deepnmt-translate`` counts);
2. ``python -m deepnmt_deploy.serve`` started as a subprocess on a free loopback port with the same
   model and threads (``--server-arg`` passes more flags);
3. for each C: C async httpx clients, each sending one sentence at a time (cycling through the
   input from its own offset) for ``--duration`` seconds after a warm-up; throughput is the server's
   ``deepnmt_target_tokens_total`` over the period, latency percentiles from the clients, errors
   counted by kind (503 refusals apart), and the share of answers that differ from the reference's
   batched translation of the same line (CTranslate2 on CPU can differ with the batch's padding);
4. optionally a soak (``--soak-minutes``) at ``--soak-concurrency`` clients: errors and the server's
   resident memory after warm-up and at the end;
5. ``NAME.json`` and ``NAME.md`` in ``--out`` (default: the results folder ``serve-load``), with the machine's load average before and
   after each level (a shared machine makes every number smaller: say so).

``--random-model DIR`` writes an untrained model in the export's directory format (random weights,
torch-free; the tests use it too): for a dry run of this script where no exported model exists;
its outputs run to the length limit, so give it ``--max-len``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- a random model (dry runs, tests)
def write_random_model(out: Path, vocab: Sequence[str], layers=(2, 1), width=16, ffn=32, heads=2,
                       max_positions=24, seed=1, tokenization: Optional[dict] = None) -> Path:
    """An untrained pre-norm Transformer in the directory format ``deepnmt-export-ct2`` writes
    (CTranslate2 model + ``deepnmt_export.json``), shared vocabulary ``<s> <pad> </s> <unk> + vocab``,
    sinusoidal positions, seeded random weights.  Needs CTranslate2 and numpy only."""
    import numpy as np
    from ctranslate2.specs import transformer_spec

    rng = np.random.default_rng(seed)
    words = ["<s>", "<pad>", "</s>", "<unk>", *[w for w in vocab if w not in ("<s>", "<pad>", "</s>", "<unk>")]]
    v, d = len(words), width

    def w(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(np.float32)

    def norm(ln):
        ln.gamma = np.ones(d, np.float32)
        ln.beta = np.zeros(d, np.float32)

    def lin(spec, rows, cols):
        spec.weight = w(rows, cols)
        spec.bias = np.zeros(rows, np.float32)

    pos = np.arange(max_positions + 2)[:, None] * np.exp(-math.log(10000) * np.arange(d // 2) / (d // 2 - 1))
    table = np.concatenate([np.sin(pos), np.cos(pos)], 1).astype(np.float32)
    spec = transformer_spec.TransformerSpec.from_config(tuple(layers), heads, pre_norm=True)
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = w(v, d, scale=d ** -0.5)
    dec.embeddings.weight = enc.embeddings[0].weight
    for side in (enc, dec):
        side.position_encodings.encodings = table
        norm(side.layer_norm)
        for layer in side.layer:
            norm(layer.self_attention.layer_norm)
            lin(layer.self_attention.linear[0], 3 * d, d)
            lin(layer.self_attention.linear[1], d, d)
            norm(layer.ffn.layer_norm)
            lin(layer.ffn.linear_0, ffn, d)
            lin(layer.ffn.linear_1, d, ffn)
            if side is dec:
                norm(layer.attention.layer_norm)
                lin(layer.attention.linear[0], d, d)
                lin(layer.attention.linear[1], 2 * d, d)
                lin(layer.attention.linear[2], d, d)
    lin(dec.projection, v, d)
    spec.register_source_vocabulary(words)
    spec.register_target_vocabulary(words)
    spec.config.decoder_start_token = spec.config.eos_token
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = 1e-5
    spec.validate()
    spec.optimize(quantization=None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    tok = {"source_lang": "src", "target_lang": "tgt", "moses": True, "lowercase": False, "aggressive_dash": False,
           "segmenter": "none", "model_file": None, "found_in": ["random model (benchmarks/serve_load.py)"]}
    tok.update(tokenization or {})
    meta = {"format": 1, "checkpoint": None, "arch": "random", "quantization": "float32",
            "encoder_layers": layers[0], "decoder_layers": layers[1], "embed_dim": d,
            "max_source_positions": max_positions, "max_target_positions": max_positions,
            "relative_positions": 0, "skipping_sublayer_folded": False, "tokenization": tok}
    (out / "deepnmt_export.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


# ---------------------------------------------------------------- the server process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, args: Sequence[str] = (), env=None, log=None) -> subprocess.Popen:
    """``deepnmt-serve`` as a subprocess; its stderr to the open file ``log`` (a pipe if None: read it
    only after the process ended, or the pipe fills)."""
    cmd = [sys.executable, "-m", "deepnmt_deploy.serve", "--model", model, "--port", str(port),
           "--log-level", "warning", *args]
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), e.get("PYTHONPATH")]))
    return subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL if log else subprocess.PIPE,
                            stderr=log or subprocess.PIPE, text=True)


def wait_ready(url: str, proc: Optional[subprocess.Popen] = None, timeout: float = 120.0, headers=None):
    import httpx

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): "
                               f"{proc.stderr.read()[-3000:] if proc.stderr else 'see its log'}")
        try:
            if httpx.get(url + "/health", timeout=2, headers=headers).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready in {timeout} s")


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample in Prometheus' text format."""
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- load
SERVER_COUNTERS = ("deepnmt_target_tokens_total", "deepnmt_batches_total", "deepnmt_batch_sentences_sum",
                   "deepnmt_batch_sentences_count", "deepnmt_model_seconds_total")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(url: str, lines: List[str], clients: int, duration: float, warmup: float,
                server_pid: Optional[int] = None) -> dict:
    import httpx

    lat: List[float] = []
    errors: Dict[str, int] = {}
    answers: Dict[int, str] = {}
    refused = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        t_start = time.perf_counter()
        t_measure = t_start + warmup
        t_end = t_measure + duration
        marks = {}

        async def client(k: int):
            nonlocal refused
            i = (k * 7919) % len(lines)
            while True:
                now = time.perf_counter()
                if now >= t_end:
                    return
                t0 = now
                try:
                    r = await http.post("/v1/translate", json={"text": [lines[i]]})
                    status = r.status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                    r = None
                t1 = time.perf_counter()
                if t0 >= t_measure and t1 <= t_end:
                    if status == 200:
                        lat.append(t1 - t0)
                        answers[i] = r.json()["translations"][0]
                    elif status == 503:
                        refused += 1
                    else:
                        errors[str(status)] = errors.get(str(status), 0) + 1
                i = (i + 1) % len(lines)

        async def metrics_at(t, key):
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            async with httpx.AsyncClient(base_url=url, timeout=60) as own:  # not queued behind the clients
                r = await own.get("/metrics")
            marks[key] = (time.perf_counter(), {k: metric(r.text, k) for k in SERVER_COUNTERS},
                          cpu_seconds(server_pid) if server_pid else 0.0, time.process_time())

        await asyncio.gather(*(client(k) for k in range(clients)), metrics_at(t_measure, "start"),
                             metrics_at(t_end, "end"))
    (t0, m0, s0, c0), (t1, m1, s1, c1) = marks["start"], marks["end"]
    d = {k: m1[k] - m0[k] for k in SERVER_COUNTERS}
    tok0, tok1 = 0.0, d["deepnmt_target_tokens_total"]
    lat.sort()

    def pct(p):
        return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1000, 1) if lat else None

    return {"clients": clients, "seconds": round(t1 - t0, 2), "answered": len(lat), "refused_503": refused,
            "errors": errors, "target_tokens_per_s": round((tok1 - tok0) / (t1 - t0), 1),
            "requests_per_s": round(len(lat) / duration, 1), "latency_ms": {"p50": pct(50), "p95": pct(95),
                                                                            "p99": pct(99), "max": pct(100)},
            "server": {"model_calls": d["deepnmt_batches_total"],
                       "mean_batch_sentences": round(d["deepnmt_batch_sentences_sum"] / max(d["deepnmt_batch_sentences_count"], 1), 2),
                       "model_busy_share": round(d["deepnmt_model_seconds_total"] / (t1 - t0), 3),
                       "server_cpu_s": round(s1 - s0, 2), "load_generator_cpu_s": round(c1 - c0, 2)},
            "answers": answers}


def reference(model_dir: str, lines: List[str], batch_size: int, intra: int, inter: int, search: dict):
    """deepnmt-translate's batched run on the same lines: (translations, target tokens/s)."""
    from deepnmt_deploy.translate import DeployedModel

    m = DeployedModel(model_dir, intra_threads=intra, inter_threads=inter)
    list(m.translate_lines(lines[:64], batch_size=batch_size, **search))  # warm-up
    m.target_tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    out = list(m.translate_lines(lines, batch_size=batch_size, **search))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return out, m.target_tokens / dt, dt, cpu / m.target_tokens * 1000


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="exported model directory")
    p.add_argument("--input", help="raw source sentences, one per line")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds per concurrency level")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--soak-minutes", type=float, default=0.0)
    p.add_argument("--soak-concurrency", type=int, default=32)
    p.add_argument("--intra-threads", type=int, default=1)
    p.add_argument("--inter-threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="deepnmt-translate's batch size for the reference")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--server-arg", action="append", default=[], help="one more flag for deepnmt-serve (repeatable)")
    p.add_argument("--name", default="serve-load")
    p.add_argument("--note", default="", help="the machine's state, written into the record")
    p.add_argument("--out", default=str(REPO / "benchmarks/results/serve-load"))
    p.add_argument("--random-model", help="write a random model here and exit (with --vocab, --layers, --width)")
    p.add_argument("--vocab", help="fairseq dict.txt (or one token a line) for --random-model")
    p.add_argument("--layers", type=int, nargs=2, default=[6, 1])
    p.add_argument("--width", type=int, default=128)
    a = p.parse_args(argv)

    if a.random_model:
        words = [line.split()[0] for line in Path(a.vocab).read_text(encoding="utf-8").splitlines() if line.strip()]
        write_random_model(Path(a.random_model), words, tuple(a.layers), a.width, 2 * a.width, 4, max_positions=1024)
        print(a.random_model)
        return 0
    if not (a.model and a.input):
        p.error("--model and --input are required (or --random-model)")
    lines = [line.rstrip("\n") for line in Path(a.input).read_text(encoding="utf-8").splitlines() if line.strip()]
    search = dict(beam=a.beam, max_len=a.max_len)
    load0 = os.getloadavg()
    ref_out, ref_tps, ref_s, ref_cpu_ms = reference(a.model, lines, a.batch_size, a.intra_threads, a.inter_threads, search)
    print(f"reference deepnmt-translate --batch-size {a.batch_size}: {ref_tps:.0f} tok/s ({ref_s:.1f} s)", flush=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_args = ["--intra-threads", str(a.intra_threads), "--inter-threads", str(a.inter_threads),
                   "--beam", str(a.beam), "--max-len", str(a.max_len), "--batch-size", str(a.batch_size),
                   *a.server_arg]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    server_log = open(out / f"{a.name}.server.log", "w")
    proc = start_server(a.model, port, server_args, log=server_log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: the finally below stops the server too
    levels = []
    soak = None
    try:
        wait_ready(url, proc)
        for c in a.concurrency:
            before = os.getloadavg()
            r = asyncio.run(_load(url, lines, c, a.duration, a.warmup, proc.pid))
            answers = r.pop("answers")
            differ = sum(1 for i, t in answers.items() if t != ref_out[i])
            srv = r["server"]
            tokens = r["target_tokens_per_s"] * r["seconds"]
            srv["server_cpu_ms_per_token"] = round(srv["server_cpu_s"] / max(tokens, 1) * 1000, 3)
            srv["load_generator_cpu_ms_per_token"] = round(srv["load_generator_cpu_s"] / max(tokens, 1) * 1000, 3)
            r.update(loadavg_before=[round(x, 2) for x in before], loadavg_after=[round(x, 2) for x in os.getloadavg()],
                     ratio_to_batched=round(r["target_tokens_per_s"] / ref_tps, 3),
                     distinct_lines=len(answers), differing_from_batched=differ)
            levels.append(r)
            print(json.dumps(r), flush=True)
        if a.soak_minutes > 0:
            warm = asyncio.run(_load(url, lines, a.soak_concurrency, 30, 2))
            rss0 = rss_kb(proc.pid)
            r = asyncio.run(_load(url, lines, a.soak_concurrency, a.soak_minutes * 60, 0))
            r.pop("answers")
            rss1 = rss_kb(proc.pid)
            soak = {**r, "rss_kb_after_warmup": rss0, "rss_kb_end": rss1,
                    "rss_growth": round(rss1 / rss0 - 1, 4), "warmup_errors": warm["errors"]}
            print(json.dumps(soak), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed"
        server_log.close()
    record = {"name": a.name, "command": " ".join([Path(sys.executable).name, *sys.argv]), "note": a.note,
              "model": a.model, "input": a.input, "sentences": len(lines), "cpus": os.cpu_count(),
              "machine": platform.processor() or platform.machine(), "loadavg_start": [round(x, 2) for x in load0],
              "search": search, "threads": {"intra": a.intra_threads, "inter": a.inter_threads},
              "server_args": server_args, "server_exit": rc,
              "reference": {"batch_size": a.batch_size, "target_tokens_per_s": round(ref_tps, 1),
                            "seconds": round(ref_s, 2), "cpu_ms_per_token": round(ref_cpu_ms, 3)},
              "levels": levels, "soak": soak,
              "server_log_tail": (out / f"{a.name}.server.log").read_text()[-2000:]}
    (out / f"{a.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    rows = ["| clients | tok/s | x batched | p50 ms | p95 ms | p99 ms | answered | 503 | errors | differ from batched | "
            "mean batch (sentences) | model busy | CPU ms/token server / load generator | load avg (1 min) before / after |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in levels:
        lm = r["latency_ms"]
        rows.append(f"| {r['clients']} | {r['target_tokens_per_s']:.0f} | {r['ratio_to_batched']:.2f} | {lm['p50']} | "
                    f"{lm['p95']} | {lm['p99']} | {r['answered']} | {r['refused_503']} | {sum(r['errors'].values())} | "
                    f"{r['differing_from_batched']} of {r['distinct_lines']} lines | {r['server']['mean_batch_sentences']} | "
                    f"{r['server']['model_busy_share']:.0%} | {r['server']['server_cpu_ms_per_token']} / "
                    f"{r['server']['load_generator_cpu_ms_per_token']} | "
                    f"{r['loadavg_before'][0]} / {r['loadavg_after'][0]} |")
    md = [f"# deepnmt-serve load: {a.name}", "", f"Command: `{record['command']}`", "",
          f"Note: {a.note or '(none)'}; {os.cpu_count()} CPUs; load average at start {record['loadavg_start']}.", "",
          f"Reference: deepnmt-translate's search in-process, batch {a.batch_size}, intra {a.intra_threads} x inter "
          f"{a.inter_threads} threads: **{ref_tps:.0f}** target tokens/s on {len(lines)} sentences "
          f"({ref_cpu_ms:.3f} CPU ms per token).", "", *rows, ""]
    if soak:
        md += [f"Soak: {a.soak_minutes} min at {a.soak_concurrency} clients: errors {soak['errors']}, RSS "
               f"{soak['rss_kb_after_warmup']} -> {soak['rss_kb_end']} kB ({soak['rss_growth'] * 100:+.1f}%).", ""]
    (out / f"{a.name}.md").write_text("\n".join(md))
    print(f"wrote {out / a.name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
