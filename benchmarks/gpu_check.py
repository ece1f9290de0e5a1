#!/usr/bin/env python
"""The prepared device check (issue 67 §1): one call on a GPU machine, at most 9 minutes.

    python benchmarks/gpu_check.py                   # CUDA, real shapes, stops cleanly by --budget (510 s)
    python benchmarks/gpu_check.py --tiny --out DIR  # CPU, tiny shapes, every section's code path (CI)

On your own GPU node, one call with a timeout that leaves room for a rerun:

    timeout 560 python benchmarks/gpu_check.py --budget 510

On the workplace's lent machine (64 MiB per call for checkout and carried paths, no network, no fairseq)
the check runs as four prepared calls, each with its own sections, packs and timeout:
``python benchmarks/gpu_check_lease.py calls`` prints them; benchmarks/results/gpu/README.md lists them.

Records go to ``benchmarks/results/gpu/<date>-<gpu-name>/`` (``--out-root`` replaces
``benchmarks/results/gpu``, ``--out`` the whole folder):
``records.json`` (every measurement, every skip and its reason, the machine), ``command.txt`` (the
exact command line) and ``table.md`` (the markdown table docs/benchmarks.md quotes).

A section the budget cut short (an item skipped for lack of time, a run killed at the budget) has the
status ``cut (budget)`` and its cut items ``ok: null`` with ``cut: true``: never ``ok``.  The exit
status is 1 when a check failed, else 3 when something was cut, else 0.

Sections (described in their historical numbering; they run in the order of ``SECTIONS``: the deep rows'
fp16/bf16 health first, then memory and speed, DDP, the invariants, DESDAR and CTranslate2 last; the
budget guard skips what no longer fits and records it as cut):

1. ``correctness``: for every variant of the invariant tests (tests/test_exactness.py's ``ALL``:
   the configuration matrix plus the extra mixes), in fp32 (TF32 off) on the device: incremental
   decoding = full forward; beam search gives a sentence the same hypothesis alone and inside a
   left-padded batch (float64, beam reorder); the beam's positional scores = the teacher-forced
   log-probabilities of its tokens.
2. ``throughput``: training tokens/s, peak memory and beam-4 batched decoding tokens/s of each deep
   architecture at its paper's shape against stock fairseq's ``transformer_wmt_en_de`` (and
   ``_big`` for the big-width rows) measured alternately in the same run; the time ratio is
   reported against the FLOP ratio (benchmarks/speed.py's analytic count): ``flop_efficiency`` =
   speed ratio / FLOP-implied speed ratio, goal >= 0.95 (met on CPU).
3. ``checkpointing``: MSC-72 with and without ``--checkpoint-activations``: peak memory and time.
4. ``desdar``: DESDAR 48-1 vs its 48-6 teacher shape, beam-4 decoding (batched and one sentence at
   a time); the paper reports 2.18x on a GPU, the CPU reaches its FLOP ceiling.
5. ``ct2``: the served student (benchmarks/deploy_speed.py's RPR-only 6-6) through CTranslate2
   on the same device (CUDA: float16 and int8_float16) against fairseq's SequenceGenerator.
6. ``ddp``: two ranks on the one device (gloo, CUDA tensors: NCCL refuses two ranks on one GPU)
   with ``c10d`` and ``legacy_ddp``: with every stochastic feature on the ranks stay bitwise
   identical (tests/test_distributed.py's launcher and features); without dropout/stochastic
   layers they give the same losses and parameters as one process with ``--update-freq 2``.
   (With stochastic features the two cannot agree: one process draws the second micro-batch's
   masks from the continued RNG stream, two ranks draw the same stream, both re-seeded per update.)
7. ``health``: ``fairseq-train --fp16`` (fairseq's dynamic loss scaling) and ``--bf16`` runs of the
   papers' deepest stacks, each a registry row's model, criterion and recipe (optimizer, lr schedule)
   at its paper's depth and width for its first updates, on the bundled LibreOffice-help corpus:
   finite losses, fp16 overflows (loss-scale reductions), loss falling.  Runs go several at a time; each stops at ``--health-updates`` or the budget.

``--tiny``: CPU, tiny shapes, a handful of updates, a subset of each list (every code path once),
for CI (tests/test_gpu_check.py).  Nothing measured in tiny mode is a claim.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "tests", REPO / "benchmarks"):  # the invariant tests' and benchmarks' machinery
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
CORPUS = REPO / "data" / "libreoffice-help" / "en-de"
SECTIONS = ("health", "throughput", "checkpointing", "ddp", "correctness", "desdar", "ct2")
DEFAULT_BUDGET = 510.0  # seconds: 9 minutes less a margin for start-up and writing


def _pytest_stand_in():
    """The invariant tests' modules are read for their variant tables and launcher (they import pytest
    for decorators only).  A lent GPU machine may have no pytest: then a stand-in whose marks and
    fixtures return the function unchanged lets them import; nothing here runs a test."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        import types

        def passthrough(*args, **_kw):
            return args[0] if len(args) == 1 and callable(args[0]) else (lambda f: f)

        class _Marks:
            def __getattr__(self, _name):
                return passthrough

        stand_in = types.ModuleType("pytest")
        stand_in.mark, stand_in.fixture = _Marks(), passthrough
        sys.modules["pytest"] = stand_in


def build_model(arch, vocab, flags, seed=0):
    try:  # the lead's move (issue 67 era): analysis.param_counts; the old name before it
        from deepnmt_fairseq.analysis.param_counts import build_model as _build
    except ImportError:  # pragma: no cover
        from deepnmt_fairseq.analysis.param_counts import build_model as _build
    torch.manual_seed(seed)
    return _build(arch, vocab, [str(x) for x in flags])


# ------------------------------------------------------------------------------ budget
class Budget:
    """Wall-clock guard: a step starts only when its estimate fits in what is left."""

    def __init__(self, seconds: float):
        self.start, self.seconds = time.monotonic(), seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def fits(self, need: float) -> bool:
        return self.left() >= need


class Section:
    def __init__(self, name):
        self.name, self.rows, self.skipped, self.status, self.error, self.seconds = name, [], [], "ok", None, 0.0

    def row(self, item, measure, ours, reference=None, ratio=None, target="", ok=None, **extra):
        self.rows.append({"item": item, "measure": measure, "ours": ours, "reference": reference, "ratio": ratio,
                          "target": target, "ok": ok, **extra})

    def skip(self, item, why):
        self.skipped.append({"item": item, "why": why})
        if why == "budget":
            self.cut()

    def cut(self):
        """The budget cut this section short: reported as cut, never as ok."""
        if self.status == "ok":
            self.status = "cut (budget)"

    def as_dict(self):
        return {"status": self.status, "seconds": round(self.seconds, 1), "rows": self.rows,
                "skipped": self.skipped, "error": self.error}


def timed(a, verdict):
    """A speed or memory target is judged at real shapes only: tiny shapes measure nothing."""
    return None if a.tiny else bool(verdict)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------ 1. correctness
def section_correctness(sec, a, device, budget):
    import test_exactness as tx
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq_helpers import TINY_DROPOUT, incremental_decode, random_batch

    names = sorted(tx.ALL)
    beam_names = names[:: max(1, len(names) // 4)] if a.tiny else names
    tol_inc = 1e-5 if device.type == "cpu" else 1e-4
    for name in names:
        if not budget.fits(a.reserve + 2):
            sec.skip(name, "budget")
            continue
        arch, flags = tx.ALL[name]
        model = build_model(arch, 40, TINY_DROPOUT + list(flags)).to(device).eval()
        tx._perturb_trained_state(model)
        src, lens, tgt = (t.to(device) for t in random_batch(model, bsz=3, src_len=7, tgt_len=9))
        with torch.no_grad():
            full, _ = model(src, lens, tgt)
            inc = incremental_decode(model, src, lens, tgt)
        worst = (full - inc).abs().max().item()
        sec.row(name, "incremental vs full forward, max |diff| (fp32)", worst, target=f"<= {tol_inc:g}",
                ok=worst <= tol_inc)
        if name not in beam_names:
            continue
        model = build_model(arch, 40, TINY_DROPOUT + list(flags), seed=3).to(device).eval().double()
        tx._perturb_trained_state(model)
        d = model.encoder.dictionary
        src, lens = (t.to(device) for t in tx.padded_sources(d))
        lengths = lens.tolist()
        gen = SequenceGenerator([model], d, beam_size=4, max_len_b=10)
        with torch.no_grad():
            batch = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lens}})
            mismatch, worst_tf = 0, 0.0
            for i, n in enumerate(lengths):
                alone = gen.generate([model], {"net_input": {"src_tokens": src[i: i + 1, 9 - n:],
                                                             "src_lengths": lens[i: i + 1]}})[0][0]
                best = batch[i][0]
                if alone["tokens"].tolist() != best["tokens"].tolist() or \
                        abs(float(alone["score"]) - float(best["score"])) > 8 * 1.2e-7 * max(1.0, abs(float(best["score"]))):
                    mismatch += 1
                # teacher forcing the hypothesis: its log-probabilities are the beam's positional scores
                toks = best["tokens"].unsqueeze(0)
                prev = torch.cat([toks.new_full((1, 1), d.eos()), toks[:, :-1]], 1)
                out = model(src[i: i + 1, 9 - n:], lens[i: i + 1], prev)
                lp = model.get_normalized_probs(out, log_probs=True)[0].gather(-1, toks[0].unsqueeze(-1)).squeeze(-1)
                worst_tf = max(worst_tf, (lp.float() - best["positional_scores"].float()).abs().max().item())
        sec.row(name, "beam 4: sentences whose hypothesis/score differ alone vs in a padded batch (fp64)",
                mismatch, target="0", ok=mismatch == 0)
        sec.row(name, "beam scores vs teacher-forced log-probs, max |diff|", worst_tf, target="<= 1e-4",
                ok=worst_tf <= 1e-4)
        del model


# ------------------------------------------------------------------------------ shapes
# name -> (arch, extra flags at the paper's shape, tiny overrides, reference stock arch)
TRANSFORMER_TINY = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads",
                    "2"]
ARCHS = {
    "MSC-72 (msc_iwslt_72l)": ("msc_iwslt_72l", [], [*TRANSFORMER_TINY, "--encoder-layers", "4",
                                                      "--decoder-layers", "2", "--msc-block-layers", "2"],
                               "transformer_wmt_en_de"),
    "DLCL-30 (dlcl_wmt_base_30l)": ("dlcl_wmt_base_30l", [], [*TRANSFORMER_TINY, "--encoder-layers", "3",
                                                               "--decoder-layers", "2"], "transformer_wmt_en_de"),
    "RPR-48 + GP + SSL (rpr_deep_48_6)": ("rpr_deep_48_6", ["--gp-group-size", "2", "--ssl-rate", "0.4"],
                                          [*TRANSFORMER_TINY, "--encoder-layers", "4", "--decoder-layers", "2"],
                                          "transformer_wmt_en_de"),
    "DeepNorm 100-100 (deepnorm_wmt_base_100l)": ("deepnorm_wmt_base_100l", [],
                                                   [*TRANSFORMER_TINY, "--encoder-layers", "3",
                                                    "--decoder-layers", "3"], "transformer_wmt_en_de"),
    "Admin 60-12 (admin_wmt_base_60_12)": ("admin_wmt_base_60_12", [], [*TRANSFORMER_TINY, "--encoder-layers", "3",
                                                                         "--decoder-layers", "2"],
                                           "transformer_wmt_en_de"),
    "deep decoder 27-27 CAD (dd_base_27_27_cad)": ("dd_base_27_27_cad", [],
                                                   [*TRANSFORMER_TINY, "--encoder-layers", "2", "--decoder-layers",
                                                    "3", "--cad-drop-depth", "2"], "transformer_wmt_en_de"),
    "MSC big 18L (msc_wmt_big_18l)": ("msc_wmt_big_18l", [], [*TRANSFORMER_TINY, "--encoder-layers", "4",
                                                               "--decoder-layers", "2", "--msc-block-layers", "2"],
                                      "transformer_wmt_en_de_big"),
    "RNMT+ transparent 20L (rnmt_plus_512_transparent_20l)": (
        "rnmt_plus_512_transparent_20l", [],
        ["--encoder-embed-dim", "16", "--encoder-hidden-size", "16", "--decoder-embed-dim", "16",
         "--decoder-hidden-size", "16", "--encoder-layers", "2", "--decoder-layers", "2"], "transformer_wmt_en_de"),
}
STOCK_TINY = [*TRANSFORMER_TINY, "--encoder-layers", "2", "--decoder-layers", "2"]


def shape(a):
    if a.tiny:
        return dict(vocab=200, bsz=4, src=8, tgt=8, dec_bsz=4, dec_len=4)
    return dict(vocab=32000, bsz=64, src=32, tgt=32, dec_bsz=64, dec_len=32)


def arch_model(arch, flags, tiny_flags, a, device):
    return build_model(arch, shape(a)["vocab"], [*flags, *(tiny_flags if a.tiny else [])]).to(device)


def stock_model(arch, a, device):
    return build_model(arch, shape(a)["vocab"], STOCK_TINY if a.tiny else []).to(device)


def model_dims(model, p):
    """speed.py's FLOP count reads the width from its preset: give it the model's own."""
    enc = model.encoder
    d = enc.embed_tokens.embedding_dim
    f = enc.layers[0].fc1.out_features if hasattr(enc.layers[0], "fc1") else 4 * d
    return dict(p, d=d, f=f)


def peak_memory(model, p, device):
    """(CUDA peak bytes of one training step above what was held before it, or NaN on CPU;
    bytes saved for backward): benchmarks/speed.py's measurement."""
    import speed

    return speed.activation_memory(model, p, device)


def planner_row(sec, name, arch_flags, p, measured_bytes, checkpoint=False, device="cuda"):
    """One row: the memory planner's prediction (``deepnmt-repro plan``'s counts, issue 81) for this
    training step against CUDA's measured peak, so that the first GPU run measures the planner's error.
    The counts run on the GPU (its attention kernels, fast); the planner itself counts on the CPU,
    whose kernels may keep other attention tensors (docs/training.md says what to compare)."""
    try:
        from deepnmt_fairseq.repro.plan import compare_with_cuda

        cmp = compare_with_cuda(arch_flags, p["bsz"], p["src"], p["tgt"], measured_bytes, precision="fp32",
                                checkpoint=checkpoint, vocab=p["vocab"], device=device)
        sec.row(name, "planner: predicted / CUDA peak MB of a training step", cmp["predicted_bytes"] / 2**20,
                measured_bytes / 2**20, 1 + cmp["relative_error"], target="- (planner error, measured)")
    except Exception as e:  # the planner's failure is a finding, not the end of the section
        sec.skip(f"{name} (planner)", f"error: {type(e).__name__}: {e}"[:300])


def section_throughput(sec, a, device, budget):
    import speed

    p = shape(a)
    ntok = p["bsz"] * p["tgt"]
    stocks = {}
    items = list(ARCHS.items())[: 3] if a.tiny else list(ARCHS.items())
    for name, (arch, flags, tiny_flags, ref) in items:
        if not budget.fits(a.reserve + (5 if a.tiny else 45)):
            sec.skip(name, "budget")
            continue
        try:
            ours = arch_model(arch, flags, tiny_flags, a, device)
            if ref not in stocks:
                stocks[ref] = stock_model(ref, a, device)
            stock = stocks[ref]
            t_ours, t_ref = speed.time_training([ours, stock], p, device, a.warmup, a.repeat)
            is_transformer = hasattr(ours.encoder, "layers") and hasattr(ours.encoder.layers[0], "fc1")
            f_ours = speed.flops_per_token(ours, model_dims(ours, p)) if is_transformer else math.nan
            f_ref = speed.flops_per_token(stock, model_dims(stock, p))
            flop_ratio = f_ours / f_ref
            speed_ratio = t_ref / t_ours
            eff = speed_ratio * flop_ratio if is_transformer else math.nan
            params = sum(x.numel() for x in ours.parameters())
            sec.row(name, f"train tokens/s (vs {ref})", ntok / t_ours, ntok / t_ref, speed_ratio,
                    target="speed ratio / FLOP-implied >= 0.95", ok=timed(a, eff >= 0.95) if is_transformer else None,
                    flop_ratio=flop_ratio, flop_efficiency=eff, params=params)
            pk_ours, saved_ours = peak_memory(ours, p, device)
            pk_ref, saved_ref = peak_memory(stock, p, device)
            if device.type == "cuda":
                sec.row(name, "peak MB of a training step above weights + Adam state", pk_ours / 2**20,
                        pk_ref / 2**20, pk_ours / pk_ref, target="- (measured)")
                planner_row(sec, name, (arch, [*flags, *(tiny_flags if a.tiny else [])]), p, pk_ours)
            sec.row(name, "activation MB saved for backward", saved_ours / 2**20, saved_ref / 2**20,
                    saved_ours / saved_ref, target="- (measured)")
            rates, _enc = speed.time_decoding([ours, stock], p, device, 1, max(1, a.repeat // 2), beam=4)
            sec.row(name, "beam-4 batched decoding tokens/s", rates[0], rates[1], rates[0] / rates[1],
                    target="- (measured)")
            del ours
        except Exception as e:  # a model that does not fit, say: the others still run
            sec.skip(name, f"error: {type(e).__name__}: {e}"[:300])
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()


def section_checkpointing(sec, a, device, budget):
    import speed

    p = shape(a)
    arch, flags, tiny_flags, _ = ARCHS["MSC-72 (msc_iwslt_72l)"]
    if not budget.fits(a.reserve + (5 if a.tiny else 40)):
        sec.skip("MSC-72", "budget")
        return
    without = arch_model(arch, flags, tiny_flags, a, device)
    with_ = arch_model(arch, [*flags, "--checkpoint-activations"], tiny_flags, a, device)
    pk_w, saved_w = peak_memory(with_, p, device)
    pk_o, saved_o = peak_memory(without, p, device)
    t_w, t_o = speed.time_training([with_, without], p, device, a.warmup, a.repeat)
    ntok = p["bsz"] * p["tgt"]
    if device.type == "cuda":  # the planner's prediction against these measurements (issue 81)
        planner_row(sec, "MSC-72", (arch, [*flags, *(tiny_flags if a.tiny else [])]), p, pk_o)
        planner_row(sec, "MSC-72 (--checkpoint-activations)",
                    (arch, [*flags, "--checkpoint-activations", *(tiny_flags if a.tiny else [])]), p, pk_w,
                    checkpoint=True)
        sec.row("MSC-72", "peak MB of a training step, with vs without --checkpoint-activations", pk_w / 2**20,
                pk_o / 2**20, pk_w / pk_o, target="<= 0.6", ok=timed(a, pk_w / pk_o <= 0.6))
    sec.row("MSC-72", "activation MB saved for backward, with vs without", saved_w / 2**20, saved_o / 2**20,
            saved_w / saved_o, target="<= 0.6", ok=timed(a, saved_w / saved_o <= 0.6))
    sec.row("MSC-72", "train tokens/s, with vs without (recomputation's cost)", ntok / t_w, ntok / t_o, t_o / t_w,
            target="- (measured)")


def section_desdar(sec, a, device, budget):
    import speed

    p = shape(a)
    if not budget.fits(a.reserve + (5 if a.tiny else 40)):
        sec.skip("DESDAR 48-1 vs 48-6", "budget")
        return
    tiny = [*TRANSFORMER_TINY, "--encoder-layers", "4"]
    m1 = arch_model("desdar_48_1", [], [*tiny, "--decoder-layers", "1"], a, device)
    m6 = arch_model("rpr_deep_48_6", [], [*tiny, "--decoder-layers", "3"], a, device)
    batched, _ = speed.time_decoding([m1, m6], p, device, 1, a.repeat, beam=4)
    single, _ = speed.time_decoding([m1, m6], dict(p, dec_bsz=min(8, p["dec_bsz"])), device, 1,
                                    max(1, a.repeat // 2), one_by_one=True, beam=4)
    implied = speed.decode_flops(m6, model_dims(m6, p), beam=4) / speed.decode_flops(m1, model_dims(m1, p), beam=4)
    sec.row("DESDAR 48-1 vs 48-6", "beam-4 batched decoding tokens/s", batched[0], batched[1],
            batched[0] / batched[1], target="paper 2.18x", flop_implied=implied)
    sec.row("DESDAR 48-1 vs 48-6", "beam-4 one sentence at a time, tokens/s", single[0], single[1],
            single[0] / single[1], target="paper 2.18x", flop_implied=implied)
    sec.row("DESDAR 48-1 vs 48-6", "FLOP-implied speed ratio (analytic)", implied, target="- (ceiling)")


# ------------------------------------------------------------------------------ 5. CTranslate2
def section_ct2(sec, a, device, budget):
    import statistics

    try:
        import ctranslate2
    except ImportError as e:
        sec.skip("CTranslate2", f"not installed: {e}")
        return
    import deploy_speed as ds

    if device.type == "cuda" and ctranslate2.get_cuda_device_count() < 1:
        sec.skip("CTranslate2", "ctranslate2 was built without CUDA (get_cuda_device_count() == 0)")
        return
    if not budget.fits(a.reserve + (5 if a.tiny else 40)):
        sec.skip("CTranslate2", "budget")
        return
    shape_ = dict(ds.SHAPE, d=32, f=64, h=2, vocab=200) if a.tiny else dict(ds.SHAPE, d=512, f=2048, h=8,
                                                                              vocab=32000)
    # deploy_speed.build's model (GPKD-style RPR-only pre-norm, the variant that exports) at this shape
    model = build_model("deepnmt_transformer", shape_["vocab"], [
        "--encoder-layers", 6, "--decoder-layers", 6, "--encoder-embed-dim", shape_["d"], "--decoder-embed-dim",
        shape_["d"], "--encoder-ffn-embed-dim", shape_["f"], "--decoder-ffn-embed-dim", shape_["f"],
        "--encoder-attention-heads", shape_["h"], "--decoder-attention-heads", shape_["h"], "--share-all-embeddings",
        "--no-token-positional-embeddings", "--rpr-max-relative-position", shape_["rpr"], "--dropout", "0.1"]).eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_ct2_"))
    model_dir = ds.export(model, tmp)
    words = model.encoder.dictionary.symbols
    model = model.to(device)
    n_sent = 8 if a.tiny else 128
    length = 4 if a.tiny else 24
    rng = __import__("random").Random(1)
    srcs = sorted(([rng.randrange(4, shape_["vocab"]) for _ in range(rng.randint(3, 8 if a.tiny else 40))]
                   for _ in range(n_sent)), key=len)

    class FairseqOn(ds.Fairseq):
        def run(self, srcs_):
            n_tok = 0
            dct = self.model.encoder.dictionary
            with torch.no_grad():
                for i in range(0, len(srcs_), self.batch_size):
                    chunk = srcs_[i: i + self.batch_size]
                    T = max(len(s) for s in chunk) + 1
                    src = torch.full((len(chunk), T), dct.pad(), dtype=torch.long)
                    for k, s in enumerate(chunk):
                        src[k, T - len(s) - 1: T - 1] = torch.tensor(s)
                        src[k, T - 1] = dct.eos()
                    lens = torch.tensor([len(s) + 1 for s in chunk])
                    hyps = self.gen.generate([self.model], {"net_input": {"src_tokens": src.to(device),
                                                                          "src_lengths": lens.to(device)}})
                    n_tok += sum(len(h[0]["tokens"]) for h in hyps)
            sync(device)
            return n_tok

    class CT2On:
        def __init__(self, compute_type):
            self.tr = ctranslate2.Translator(model_dir, device=device.type, compute_type=compute_type)

        def run(self, srcs_):
            toks = [[words[i] for i in s] for s in srcs_]
            res = self.tr.translate_batch(toks, max_batch_size=64, beam_size=4, max_decoding_length=length + 1,
                                          min_decoding_length=length + 1, max_input_length=0)
            return sum(len(r.hypotheses[0]) for r in res)

    runners = {"fairseq (SequenceGenerator) fp32": FairseqOn(model, 4, length, 64)}
    types = ["float32", "int8"] if device.type == "cpu" else ["float32", "float16", "int8_float16"]
    for ct in types:
        try:
            runners[f"ctranslate2 {ct}"] = CT2On(ct)
        except Exception as e:  # noqa: BLE001 - a compute type this device does not support
            sec.skip(f"ctranslate2 {ct}", f"{type(e).__name__}: {e}"[:300])
    # deploy_speed.measure: every round's rate per engine, the engines alternating inside each round
    rates = {k: statistics.median(v) for k, v in ds.measure(runners, srcs, 1, a.repeat).items()}
    ref = rates["fairseq (SequenceGenerator) fp32"]
    for name, r in rates.items():
        sec.row(name, "beam-4 batched decoding tokens/s (student 6-6, output length pinned)", r, ref, r / ref,
                target="- (measured)")
    del statistics


# ------------------------------------------------------------------------------ data
def prepare_data(work: Path, a) -> Path:
    """The bundled corpus (whitespace tokens), joined dictionary (the rows share embeddings)."""
    out = work / ("data-bin-tiny" if a.tiny else "data-bin")
    if (out / ".done").exists():
        return out
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    limits = {"train": 300, "valid": 40} if a.tiny else {"train": None, "valid": None}
    for split, limit in limits.items():
        for lang in ("en", "de"):
            with gzip.open(CORPUS / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = f.read().splitlines()[:limit]
            (raw / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    from deepnmt_data.preprocess import fairseq_preprocess, preprocess_argv

    fairseq_preprocess(preprocess_argv("en", "de", out, trainpref=raw / "train", validpref=raw / "valid", joined=True,
                                       nwords=1000 if a.tiny else 8000, workers=2), log=None, quiet=True)
    (out / ".done").write_text("")
    return out


def child_env(threads="1"):
    from deepnmt_fairseq.console import child_env as ce

    return ce({**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})


def train_argv(data, arch, flags, crit, a, max_update, extra=()):
    """A fairseq-train command of the check (the one builder, jobs/fairseq_argv.py)."""
    from deepnmt_fairseq.jobs.fairseq_argv import fairseq_train

    return fairseq_train(data, [
            "--task", "translation", "--arch", arch, *flags, *crit, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "1e-7", "--max-update", str(max_update), "--seed", "1", "--no-progress-bar",
            "--log-format", "json", "--num-workers", "0", "--skip-invalid-size-inputs-valid-test",
            *(["--cpu"] if a.cpu else []), *extra], resolve=True)


def run_procs(cmds, logs, timeout, env):
    """Start every command at once; kill what is still running at the deadline.
    Returns [(returncode or None when killed, log text)]."""
    procs = []
    for cmd, log in zip(cmds, logs):
        procs.append(subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env))
    deadline = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    out = []
    for p, log in zip(procs, logs):
        killed = p.poll() is None
        if killed:
            p.kill()
            p.wait()
        out.append((None if killed else p.returncode, Path(log).read_text(errors="replace")))
    return out


# ------------------------------------------------------------------------------ 6. DDP
def section_ddp(sec, a, device, budget, work):
    import test_distributed as td

    data = prepare_data(work, a)
    stochastic = [*td.STOCHASTIC["msc"]]
    plain = ["--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0", "--attention-dropout", "0",
             "--rpr-max-relative-position", "2"]
    width = [*TRANSFORMER_TINY, "--share-all-embeddings"] if not a.tiny else [*td.TINY]
    ls = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
    updates = 3
    common = ["--lr", "0.002", "--warmup-updates", "4", "--batch-size", "16", "--max-tokens", "4000",
              "--required-batch-size-multiple", "1", "--save-interval-updates", "1", "--no-epoch-checkpoints",
              "--disable-validation", "--log-interval", "1"]
    device_flags = ["--device-id", "0"] if device.type == "cuda" else []
    runs = {  # name -> (model flags, criterion, ddp backend or None for one process with --update-freq 2)
        "stochastic c10d": (stochastic, td.CRT, "c10d"),
        "stochastic legacy_ddp": (stochastic, td.CRT, "legacy_ddp"),
        "plain c10d": (plain, ls, "c10d"),
        "plain legacy_ddp": (plain, ls, "legacy_ddp"),
        "plain one process --update-freq 2": (plain, ls, None),
    }
    if a.tiny:
        for k in ("stochastic legacy_ddp", "plain c10d"):
            runs.pop(k)
    if not budget.fits(a.reserve + (20 if a.tiny else 60)):
        for k in runs:
            sec.skip(k, "budget")
        return
    cmds, logs, dumps, names = [], [], {}, []
    launcher = work / "ddp_launcher.py"
    launcher.write_text(td.LAUNCHER)
    ports = {}
    for name, (flags, crit, ddp) in runs.items():
        d = work / "ddp" / name.replace(" ", "_")
        shutil.rmtree(d, ignore_errors=True)  # a reused --work-dir: never resume an earlier run
        d.mkdir(parents=True)
        dumps[name] = d / "dump"
        dumps[name].mkdir(exist_ok=True)
        base = train_argv(data, "deepnmt_transformer", [*width, *flags], crit, a, updates,
                          [*common, "--save-dir", str(d / "ckpt"), *device_flags])[1:]
        if ddp is None:
            cmds.append([sys.executable, str(launcher), *base, "--update-freq", "2"])
            logs.append(d / "single.log")
            names.append((name, 0))
            continue
        ports[name] = td._free_port()
        for rank in range(2):
            cmds.append([sys.executable, str(launcher), *base, "--distributed-world-size", "2", "--distributed-rank",
                         str(rank), "--distributed-init-method", f"tcp://127.0.0.1:{ports[name]}",
                         "--distributed-no-spawn", "--distributed-backend", "gloo", "--ddp-backend", ddp])
            logs.append(d / f"rank{rank}.log")
            names.append((name, rank))
    env = child_env()
    results = []
    # each run gets its own dump folder (the launcher reads DEEPNMT_TEST_DUMP)
    procs_env = []
    for (name, _rank) in names:
        procs_env.append({**env, "DEEPNMT_TEST_DUMP": str(dumps[name])})
    procs = [subprocess.Popen(c, stdout=open(lg, "w"), stderr=subprocess.STDOUT, env=e)
             for c, lg, e in zip(cmds, logs, procs_env)]
    deadline = time.monotonic() + max(10.0, min(240.0, budget.left() - a.reserve))
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p, lg in zip(procs, logs):
        if p.poll() is None:
            p.kill()
            p.wait()
            results.append((None, Path(lg).read_text(errors="replace")))  # killed at the budget: cut
            continue
        results.append((p.returncode, Path(lg).read_text(errors="replace")))
    by = {}
    for (name, rank), res in zip(names, results):
        by.setdefault(name, {})[rank] = res
    for name, ranks in by.items():
        if any(rc is None for rc, _log in ranks.values()):
            sec.cut()
            sec.row(name, "run", "killed at the budget", ok=None, cut=True)
            continue
        failed = [r for r, (rc, _log) in ranks.items() if rc != 0]
        if failed:
            rc, log = ranks[failed[0]]
            sec.row(name, "run", f"rank {failed[0]} exit {rc}", ok=False, log_tail=log[-2000:])
    single = "plain one process --update-freq 2"
    for name, ranks in by.items():
        if any(rc != 0 for rc, _ in ranks.values()) or runs[name][2] is None:  # failed, cut or the reference
            continue
        stats = td._per_update(ranks[0][1])
        finite = len(stats) == updates and all(math.isfinite(float(s["loss"])) for s in stats.values())
        differ = 0
        for u in range(1, updates + 1):
            w0, w1 = td._dumped(dumps[name], 0, u), td._dumped(dumps[name], 1, u)
            differ += sum(not torch.equal(w0[k], w1[k]) for k in w0)
        sec.row(name, "tensors that differ between the two ranks (all updates)", differ, target="0",
                ok=differ == 0 and finite, backend="gloo", device=str(device))
        if name.startswith("plain") and single in by and all(rc == 0 for rc, _ in by[single].values()):
            one = td._per_update(by[single][0][1])
            loss_diff = max(abs(float(stats[u]["loss"]) - float(one[u]["loss"])) for u in stats) \
                if sorted(stats) == sorted(one) \
                else math.inf
            worst = max(max((td._dumped(dumps[name], 0, u)[k].float() - td._dumped(dumps[single], 0, u)[k].float())
                            .abs().max().item() for k in td._dumped(dumps[name], 0, u)) for u in range(1, updates + 1))
            # CPU: bitwise (tests/test_distributed.py says why); CUDA: kernels may sum in another order.
            # Losses are logged with 3 decimals.
            tol, loss_tol = (0.0, 0.0) if device.type == "cpu" else (1e-5, 2e-3)
            sec.row(name, "vs one process --update-freq 2: max |logged loss diff|, max |weight diff|",
                    f"{loss_diff:.3g}, {worst:.3g}", target=f"<= {loss_tol:g}, <= {tol:g}",
                    ok=loss_diff <= loss_tol and worst <= tol)


# ------------------------------------------------------------------------------ 7. health
# name -> (registry row, tiny overrides): the row's model and criterion at its paper's depth and width
HEALTH = {
    "MSC-72 (+ CRT)": ("msc-iwslt14-ende-72L-l2", [*TRANSFORMER_TINY, "--encoder-layers", "4", "--decoder-layers", "2",
                                                   "--msc-block-layers", "2"]),
    "DLCL-30": ("msc-wmt14-ende-dlcl-30L", [*TRANSFORMER_TINY, "--encoder-layers", "3", "--decoder-layers", "2"]),
    "RPR-48 + GP + SSL": ("gpkd-wmt14-ende-48L-ssl-gp-e2-d2-teacher",
                          [*TRANSFORMER_TINY, "--encoder-layers", "4", "--decoder-layers", "2"]),
    "DeepNorm 100-100": ("deepnet-wmt-ende-100L-100L", [*TRANSFORMER_TINY, "--encoder-layers", "3",
                                                        "--decoder-layers", "3"]),
    "Admin 60-12": ("admin-wmt14-ende-60L-12L", [*TRANSFORMER_TINY, "--encoder-layers", "3", "--decoder-layers",
                                                 "2"]),
    "deep decoder 6-27 CAD + CRT": ("dd-fig1-base-6-27-cad-crt", [*TRANSFORMER_TINY, "--encoder-layers", "2",
                                                                  "--decoder-layers", "3", "--cad-drop-depth", "2"]),
    "RNMT+ transparent 20L": ("rnmt-wmt14-ende-transparent-20L",
                              ["--encoder-embed-dim", "16", "--encoder-hidden-size", "16", "--decoder-embed-dim",
                               "16", "--decoder-hidden-size", "16", "--encoder-layers", "2", "--decoder-layers", "2"]),
}
_NOT_MODEL = ("--max-epoch",)  # row flags that are schedule, not model


def health_command(name, precision, data, a, save):
    from deepnmt_fairseq.repro.registry import EXPERIMENTS

    row, tiny = HEALTH[name]
    stage = EXPERIMENTS[row].train_stages[-1]
    flags, skip = [], False
    for f in stage.model_flags:
        if skip:
            skip = False
            continue
        if f in _NOT_MODEL:
            skip = True
            continue
        flags.append(f)
    r = stage.recipe
    from deepnmt_fairseq.jobs.fairseq_argv import fairseq_train, recipe_flags

    # the first updates of the row's own recipe (optimizer, lr schedule, clipping; its save flags are moot
    # with --no-save); tiny mode shortens the warm-up so that a handful of updates moves the loss
    short = (["--warmup-updates", "2"] if r.lr_scheduler == "inverse_sqrt" else
             ["--warmup-steps", "2", "--hold-steps", "2", "--decay-steps", "4"]) if a.tiny else []
    argv = fairseq_train(data, [
            "--task", "translation", "--arch", stage.arch, *flags, *(tiny if a.tiny else []),
            "--criterion", stage.criterion, "--label-smoothing", f"{r.label_smoothing:g}", *stage.criterion_flags, *recipe_flags(r), *short,
            "--max-update", str(a.health_updates), "--max-tokens", "1000" if a.tiny else "4096",
            "--disable-validation", "--no-save", "--save-dir", str(save), "--no-progress-bar", "--log-format", "json",
            "--log-interval", "1" if a.tiny else "10", "--num-workers", "0", "--skip-invalid-size-inputs-valid-test",
            f"--{precision}", *(["--cpu"] if a.cpu else [])], resolve=True)
    return argv, row


def section_health(sec, a, device, budget, work):
    data = prepare_data(work, a)
    jobs = [(n, p) for n in HEALTH for p in ("fp16", "bf16")]
    if a.tiny:  # fairseq's --fp16 needs CUDA (its loss scaler asks for the current device): bf16 on the CPU
        jobs = [("MSC-72 (+ CRT)", "bf16"), ("RNMT+ transparent 20L", "bf16")]
    env = child_env("1" if a.tiny else "2")
    waves = [jobs[i: i + a.health_parallel] for i in range(0, len(jobs), a.health_parallel)]
    for w, wave in enumerate(waves):
        left_waves = len(waves) - w
        per_wave = (budget.left() - a.reserve) / left_waves
        if per_wave < (15 if a.tiny else 45):
            for n, p in wave:
                sec.skip(f"{n} {p}", "budget")
            continue
        cmds, logs, rows = [], [], []
        for n, p in wave:
            d = work / "health" / f"{re.sub(r'[^A-Za-z0-9]+', '-', n).strip('-')}-{p}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            cmd, row = health_command(n, p, data, a, d / "ckpt")
            cmds.append(cmd)
            logs.append(d / "train.log")
            rows.append(row)
        results = run_procs(cmds, logs, per_wave, env)
        for (n, p), row, cmd, (rc, log) in zip(wave, rows, cmds, results):
            # fairseq's json lines, whatever the logging format (a plugin imported first keeps Python's)
            losses = sorted({int(r["num_updates"]): float(r["loss"]) for r in
                             map(json.loads, re.findall(r"train_inner\W+(\{.*\})", log))}.items())
            overflows = len(re.findall(r"gradient overflow detected", log)) + len(
                re.findall(r"overflow detected, setting loss scale", log))
            finite = bool(losses) and all(math.isfinite(v) for _, v in losses)
            k = max(1, min(3, len(losses) // 3))
            first = sum(v for _, v in losses[:k]) / k if losses else math.nan
            last = sum(v for _, v in losses[-k:]) / k if losses else math.nan
            falling = len(losses) >= 2 and last < first
            reached = losses[-1][0] if losses else 0
            status = "killed at the budget" if rc is None else f"exit {rc}"
            # a run killed at the budget proves nothing about the rest of its updates: cut, not ok
            # (a NaN logged before the kill is still a failure)
            ok = (False if losses and not finite else None) if rc is None else (finite and falling and rc == 0)
            if rc is None:
                sec.cut()
            sec.row(f"{n} {p}", f"loss first -> last logged (updates reached; {status})",
                    f"{first:.3f} -> {last:.3f}" if losses else "no loss logged", target="finite, falling",
                    ok=ok, row=row, updates=reached, overflows=overflows, finite=finite, falling=falling,
                    returncode=rc, cut=rc is None, command=shlex.join(cmd[1:]),
                    log_tail=None if ok else log[-2000:])
            sec.row(f"{n} {p}", "fp16 overflows (loss-scale reductions)" if p == "fp16" else "overflows (bf16: none "
                    "expected, no loss scaling)", overflows, target="- (counted)", row=row)


# ------------------------------------------------------------------------------ report
def machine(device):
    from deepnmt_fairseq.machine import describe

    return describe(device)


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def table(report) -> str:
    m = report["machine"]
    head = (f"Device check (`benchmarks/gpu_check.py{' --tiny' if report['tiny'] else ''}`) on "
            f"{m.get('gpu', m['device'])}, {report['date']}, torch {m['torch']}, fairseq {m.get('fairseq', '?')}; "
            f"{report['elapsed_s']:.0f} s of a {report['budget_s']:.0f} s budget.")
    out = [head, "", f"Command: `{report['command']}`", "",
           "| section | item | measure | ours | reference | ratio | target | ok |", "|---|---|---|---|---|---|---|---|"]
    for name, s in report["sections"].items():
        if s["status"] != "ok":
            bad = "**NO**" if s["status"] == "error" else ("cut" if s["status"].startswith("cut") else "-")
            out.append(f"| {name} | - | {s['status']} | {s.get('error') or ''} | - | - | - | {bad} |".replace("\n", " "))
        for r in s["rows"]:
            ratio = _fmt(r["ratio"])
            if r.get("flop_efficiency") is not None and not (isinstance(r["flop_efficiency"], float)
                                                             and math.isnan(r["flop_efficiency"])):
                ratio += f" (FLOP ratio {r['flop_ratio']:.2f}, efficiency {r['flop_efficiency']:.2f})"
            if r.get("flop_implied") is not None:
                ratio += f" (FLOP-implied {r['flop_implied']:.2f})"
            ok = ("cut" if r.get("cut") else "-") if r["ok"] is None else ("yes" if r["ok"] else "**NO**")
            out.append(f"| {name} | {r['item']} | {r['measure']} | {_fmt(r['ours'])} | {_fmt(r['reference'])} | "
                       f"{ratio} | {r['target']} | {ok} |")
        for sk in s["skipped"]:
            out.append(f"| {name} | {sk['item']} | skipped | - | - | - | {sk['why']} | - |".replace("\n", " "))
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shapes, a subset of every list (CI)")
    ap.add_argument("--device", help="default: cuda (cpu with --tiny)")
    ap.add_argument("--budget", type=float, help=f"seconds for all sections (default {DEFAULT_BUDGET:g}; "
                                                 "tiny: 600)")
    ap.add_argument("--reserve", type=float, default=None, help="seconds kept for writing the report (default 15)")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--out", help="records folder (default OUT_ROOT/<date>-<gpu-name>)")
    ap.add_argument("--out-root", default=str(REPO / "benchmarks" / "results" / "gpu"),
                    help="where the <date>-<gpu-name> folder goes (default %(default)s; a lent machine: $OUT)")
    ap.add_argument("--work-dir", help="scratch (data, checkpoints; default a temporary folder)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--health-updates", type=int, default=None, help="per run (default 300; tiny 6)")
    ap.add_argument("--health-parallel", type=int, default=None, help="runs at once (default 7; tiny 2)")
    a = ap.parse_args(argv)
    a.budget = a.budget if a.budget is not None else (600.0 if a.tiny else DEFAULT_BUDGET)
    a.reserve = a.reserve if a.reserve is not None else (2.0 if a.tiny else 15.0)
    a.repeat = a.repeat or (1 if a.tiny else 5)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.tiny else 2)
    a.health_updates = a.health_updates or (6 if a.tiny else 300)
    a.health_parallel = a.health_parallel or (2 if a.tiny else 7)
    budget = Budget(a.budget)
    device = torch.device(a.device or ("cpu" if a.tiny else "cuda"))
    a.cpu = device.type == "cpu"  # fairseq commands get --cpu
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); --tiny runs on the CPU",
              file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 contracts in fp32
    torch.backends.cudnn.allow_tf32 = False
    import deepnmt_fairseq  # noqa: F401

    _pytest_stand_in()
    date = time.strftime("%Y-%m-%d", time.gmtime())
    info = machine(device)
    gpu_name = re.sub(r"[^A-Za-z0-9]+", "-", info.get("gpu", "cpu-tiny" if a.tiny else device.type)).strip("-")
    out = Path(a.out) if a.out else Path(a.out_root) / f"{date}-{gpu_name}"
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join([Path(sys.executable).name, "benchmarks/gpu_check.py", *(argv if argv is not None
                                                                                    else sys.argv[1:])])
    work_ctx = contextlib.nullcontext(a.work_dir) if a.work_dir else tempfile.TemporaryDirectory(prefix="gpu_check_")
    sections = {}
    with work_ctx as work_s:
        work = Path(work_s)
        work.mkdir(parents=True, exist_ok=True)
        funcs = {"correctness": section_correctness, "throughput": section_throughput,
                 "checkpointing": section_checkpointing, "desdar": section_desdar, "ct2": section_ct2,
                 "ddp": lambda s, a_, d, b: section_ddp(s, a_, d, b, work),
                 "health": lambda s, a_, d, b: section_health(s, a_, d, b, work)}
        for name in SECTIONS:
            sec = Section(name)
            t = time.monotonic()
            if name not in a.sections:
                sec.status = "not asked (--sections)"
            elif not budget.fits(a.reserve + 1):
                sec.status = "cut (budget)"
            else:
                print(f"[gpu_check {budget.elapsed():5.0f}s] {name} ...", file=sys.stderr, flush=True)
                try:
                    funcs[name](sec, a, device, budget)
                except Exception as e:  # noqa: BLE001 - one section's failure is recorded, the rest still run
                    sec.status = "error"
                    sec.error = f"{type(e).__name__}: {e}"[:500]
                    traceback.print_exc()
            sec.seconds = time.monotonic() - t
            sections[name] = sec.as_dict()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report = {"tiny": a.tiny, "device": str(device), "machine": info, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime()),
              "command": command, "budget_s": a.budget, "elapsed_s": round(budget.elapsed(), 1),
              "sections": sections}
    (out / "records.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "command.txt").write_text(command + "\n")
    md = table(report)
    (out / "table.md").write_text(md)
    print(md)
    failed = [n for n, s in sections.items() if s["status"] == "error" or any(r["ok"] is False for r in s["rows"])]
    cut = [n for n, s in sections.items() if s["status"].startswith("cut")]
    print(f"[gpu_check] {budget.elapsed():.0f} s; records in {out}; "
          f"{'failed: ' + ', '.join(failed) if failed else 'no failed check'}"
          f"{'; cut by the budget: ' + ', '.join(cut) if cut else ''}", file=sys.stderr)
    return 1 if failed else (3 if cut else 0)


if __name__ == "__main__":
    sys.exit(main())
