"""Will it fit: the memory and time planner of a registry row (issue 81, ``deepnmt-repro plan``).

For a training stage at the paper's shape, on ``N`` GPUs of ``M`` GiB each, in bf16 or fp32, with or
without activation checkpointing:

* **exact** (from the built model): parameters, gradients and Adam/RAdam state in bytes
  (:func:`deepnmt_fairseq.analysis.training_cost.state_bytes`);
* **measured on the CPU**: the bytes autograd saves for the backward pass, counted at a few small
  batch shapes at the asked dtype with every stochastic layer kept, fitted exactly by a model linear
  in tokens plus length² terms (:mod:`deepnmt_fairseq.analysis.training_cost`; the fit error on
  held-out shapes is printed), and forward matmul FLOPs from the same walk;
* **estimated** (not measured): the transient memory of the backward pass: the gradient buffers of
  the output layer (two fp32 tensors of ``tokens x vocabulary``: the gradients of the log-probs and of
  the logits, the largest gradients of a step) and, with checkpointing, the largest layer's
  activations (measured per layer) recomputed at once; the allocator's fragmentation and CUDA's own
  memory (context, cuBLAS workspace), covered by the headroom :data:`HEADROOM` of the card plus
  :data:`RESERVED_GIB`; the time per update from a named GPU's published dense throughput at the
  utilization :data:`UTILIZATION` (backward = 2 x forward FLOPs; checkpointing adds one forward of
  the layers).

Units: **GiB** (2^30 bytes) everywhere.  A card's nominal "80 GB" is read as 80 GiB (an A100-80GB
reports 81920 MiB, an H100-80GB 81559 MiB); the headroom absorbs the difference.

What the first run on a GPU must check: CUDA's ``max_memory_allocated`` of a training step against
:func:`predicted_peak` (:func:`compare_with_cuda`; benchmarks/gpu_check.py), i.e. the estimated
transient terms and the headroom, and the time per update against :func:`Plan.seconds_per_update`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .spec import Experiment, TrainStage, batch_plan

GIB = 2 ** 30
#: fraction of the card kept free for the allocator's fragmentation (caching allocator blocks)
HEADROOM = 0.10
#: GiB kept for CUDA's context and library workspaces (cuBLAS/cuDNN), outside max_memory_allocated
RESERVED_GIB = 1.0
#: fraction of the published dense peak a fairseq training step reaches (an assumption: d=512 models
#: with short sequences reach 30-40% MFU in published fairseq/Megatron-style measurements)
UTILIZATION = 0.35

#: name -> (memory GiB, dense bf16 TFLOP/s, fp32 TFLOP/s (no TF32: PyTorch's default for matmuls),
#: source).  Dense = without 2:4 sparsity.
GPUS: Dict[str, Tuple[float, float, float, str]] = {
    "A100-80GB": (80, 312.0, 19.5, "NVIDIA A100 Tensor Core GPU datasheet (SXM): BF16 312, FP32 19.5 TFLOPS"),
    "A100-40GB": (40, 312.0, 19.5, "NVIDIA A100 Tensor Core GPU datasheet (SXM): BF16 312, FP32 19.5 TFLOPS"),
    "H100-SXM": (80, 989.0, 67.0, "NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1979 with sparsity "
                                  "= 989 dense, FP32 67 TFLOPS"),
    "RTX-4090": (24, 165.2, 82.6, "NVIDIA Ada Lovelace architecture whitepaper: BF16 tensor with FP32 "
                                  "accumulate 165.2 dense, FP32 82.6 TFLOPS"),
}
DEFAULT_GPU = "A100-80GB"

FITS_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "plan-fits.json"

#: the headline rows of docs/training.md's table (issue 81 §4)
HEADLINE = ("msc-iwslt14-ende-72L-l2", "msc-wmt14-ende-base-36L", "msc-wmt14-ende-dlcl-30L",
            "msc-iwslt14-ende-bapna-36L", "deepnet-wmt-ende-18L-18L", "deepnet-wmt-ende-100L-100L",
            "gpkd-wmt14-ende-desdar-48-3", "msc-cnndm-hiertrans-36L")
TABLE_MEMORY = (24, 40, 80)
TABLE_GPUS = 8


class PlanError(ValueError):
    """A plan that cannot work (names the flag and the reason)."""


def parse_memory(text) -> float:
    """``80G``, ``80GB``, ``80GiB``, ``80`` -> 80.0 GiB; ``40960M`` / ``MiB`` -> 40.0 GiB."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(g|gb|gib|m|mb|mib)?\s*", str(text), re.I)
    if not m:
        raise PlanError(f"--gpu-memory {text!r}: give the memory per GPU as e.g. 80G (GiB) or 40960M (MiB)")
    value = float(m.group(1))
    gib = value / 1024 if (m.group(2) or "g").lower().startswith("m") else value
    if gib <= 0:
        raise PlanError(f"--gpu-memory {text!r}: must be positive")
    return gib


# ------------------------------------------------------------------ the stage's shape
def planning_lengths(exp: Experiment) -> Tuple[int, int]:
    """(source, target) length of the longest sentence pair the stage trains on, which a
    ``--max-tokens`` batch must hold: the corpus recipe's cleaning bound (``clean_max``; counted in
    Moses tokens for IWSLT, whose BPE adds a few units to the longest lines) or, for summarization,
    the truncated article length and the longest summary of the evaluation's length grid."""
    from deepnmt_data.corpora import RECIPES

    r = RECIPES[exp.dataset]
    if getattr(r, "kind", "translation") == "summarization":
        return int(r.max_doc_tokens), int(max(exp.eval.max_len_b or (r.max_doc_tokens,)))
    return int(r.clean_max), int(r.clean_max)


def stage_key(stage: TrainStage, precision: str, checkpoint: bool) -> str:
    return json.dumps([stage.arch, list(stage.model_flags), precision, bool(checkpoint)])


def _load_cache() -> dict:
    try:
        return json.loads(FITS_FILE.read_text())
    except (OSError, ValueError):
        return {}


#: a fit whose held-out error at the small shapes is above this is redone with shapes at the stage's
#: own lengths added (HIERTRANS: its sentence-level structure is not exactly linear in the shape)
ANCHOR_ABOVE = 0.005


def anchor_shapes(lengths: Tuple[int, int]) -> Tuple[Tuple[int, int, int], ...]:
    ls, lt = lengths
    return ((1, ls, lt), (1, ls // 2, lt // 2), (1, ls // 4, lt))


def mid_shape(lengths: Tuple[int, int]) -> Tuple[int, int, int]:
    return (1, 3 * lengths[0] // 4, 3 * lengths[1] // 4)


def stage_costs(stage: TrainStage, precision: str, checkpoint: bool, cache: Optional[dict] = None,
                refresh: bool = False, exp_lengths: Tuple[int, int] = (250, 250)) -> dict:
    """Parameter count and activation/FLOP fits of a stage (from ``cache``, by default
    benchmarks/results/plan-fits.json, else counted now on the CPU: seconds to minutes).
    ``exp_lengths``: the planning lengths, where a fit that is not exact at small shapes is anchored."""
    cache = _load_cache() if cache is None else cache
    key = stage_key(stage, precision, checkpoint)
    if key in cache and not refresh:
        return cache[key]
    import sys

    from ..analysis import training_cost as tc

    print(f"[plan] counting {stage.arch} ({precision}{', checkpointing' if checkpoint else ''}) on the CPU: not in "
          f"{FITS_FILE.name}; seconds to minutes", file=sys.stderr, flush=True)
    model = tc.build_stage_model(stage.arch, stage.model_flags, checkpoint_activations=checkpoint)
    model = model.to(tc.DTYPES[precision])
    f = tc.fit(model)
    if f.held_out_error > ANCHOR_ABOVE:  # not exactly linear at small shapes: anchor at the real lengths
        f = tc.fit(model, (*tc.FIT_SHAPES, *anchor_shapes(exp_lengths)), (*tc.HELD_OUT_SHAPES, mid_shape(exp_lengths)))
    entry = {"params": tc.parameter_count(model), "vocab": len(model.decoder.dictionary), "fit": f.as_dict()}
    if checkpoint:  # the layer recomputed in backward: the largest layer of the plain model
        plain = stage_costs(stage, precision, False, cache, refresh, exp_lengths)
        entry["fit"]["layer_max"] = plain["fit"]["layer_max"]
        entry["fit"]["flops"] = plain["fit"]["flops"]
    cache[key] = entry
    return entry


# ------------------------------------------------------------------ the plan
@dataclass
class Plan:
    experiment: str
    stage: str
    precision: str
    checkpoint: bool
    gpus: int
    memory_gib: float
    params: int
    vocab: int
    optimizer: str
    state: Dict[str, int]
    lengths: Tuple[int, int]
    per_token: float  # activation bytes per --max-tokens token at the planning lengths (with transient)
    per_batch: float  # constant bytes per step
    fit_error: float
    held_out_error: float
    flops_per_token: float  # training step (forward + backward [+ recompute]) per target token
    flops_per_batch_token: float  # the same per --max-tokens token (a sentence pair counts its longer side)
    tokens_per_update: int
    max_tokens: int  # largest that fits (0: not even the longest sentence)
    update_freq: int
    checkpoint_needed: bool

    @property
    def usable_bytes(self) -> float:
        return (self.memory_gib * (1 - HEADROOM) - RESERVED_GIB) * GIB

    @property
    def state_total(self) -> int:
        return sum(self.state.values())

    def activation_bytes(self, tokens: int) -> float:
        return self.per_batch + self.per_token * tokens

    @property
    def fits(self) -> bool:
        return self.max_tokens >= max(self.lengths)

    def seconds_per_update(self, gpu: str = DEFAULT_GPU, utilization: float = UTILIZATION) -> float:
        """An estimate: FLOPs of the paper's tokens per update over N GPUs at ``utilization`` of the
        GPU's published dense peak for the precision."""
        _mem, bf16, fp32, _src = GPUS[gpu]
        peak = (bf16 if self.precision == "bf16" else fp32) * 1e12
        return self.tokens_per_update * self.flops_per_batch_token / (self.gpus * peak * utilization)


def plan_stage(exp: Experiment, stage: TrainStage, gpus: int = 8, memory_gib: float = 80.0,
               precision: str = "bf16", checkpoint: bool = False, cache: Optional[dict] = None) -> Plan:
    """Plan one training stage (see the module docstring for what is measured and what estimated)."""
    from ..analysis.training_cost import predict, state_bytes

    if gpus < 1:
        raise PlanError(f"--gpus {gpus}: the planner plans for at least one GPU")
    ls, lt = planning_lengths(exp)
    costs = stage_costs(stage, precision, checkpoint, cache, exp_lengths=(ls, lt))
    f = costs["fit"]
    longest = max(ls, lt)
    # activations of a batch of B = tokens / longest sentences at the planning lengths, per token
    per_sentence = predict(f["saved"], 1, ls, lt) - predict(f["saved"], 0, ls, lt)
    const = predict(f["saved"], 0, ls, lt)
    if checkpoint:  # the largest layer recomputed at once in backward
        per_sentence += predict(f["layer_max"], 1, ls, lt) - predict(f["layer_max"], 0, ls, lt)
    per_sentence += lt * costs["vocab"] * 8  # estimate: two fp32 tokens x vocabulary gradient buffers
    per_token = per_sentence / longest
    step = (predict(f["flops"], 1, ls, lt) - predict(f["flops"], 0, ls, lt)) * (4 if checkpoint else 3)
    state = state_bytes(costs["params"], precision, stage.recipe.optimizer)
    p = Plan(exp.name, stage.name, precision, checkpoint, gpus, memory_gib, costs["params"], costs["vocab"],
             stage.recipe.optimizer, state, (ls, lt), per_token, const, f["fit_error"], f["held_out_error"],
             step / lt, step / longest, stage.recipe.tokens_per_update, 0, 0, False)
    room = p.usable_bytes - p.state_total - const
    p.max_tokens = max(0, int(room // per_token) // 64 * 64) if room > 0 else 0
    if p.max_tokens and p.max_tokens < longest:
        p.max_tokens = 0
    if p.fits:
        p.update_freq = batch_plan(p.tokens_per_update, p.max_tokens, gpus)[0]
    if not checkpoint:
        p.checkpoint_needed = not p.fits
    return p


def plan_experiment(exp: Experiment, gpus: int = 8, memory_gib: float = 80.0, precision: str = "bf16",
                    checkpoint: bool = False, cache: Optional[dict] = None) -> List[Plan]:
    return [plan_stage(exp, s, gpus, memory_gib, precision, checkpoint, cache) for s in exp.train_stages]


def refusal(p: Plan) -> str:
    """The message of a plan that cannot fit even one longest sentence."""
    need = p.state_total + p.activation_bytes(max(p.lengths))
    if p.state_total >= p.usable_bytes:
        hint = " (the model state alone exceeds it: activation checkpointing cannot help)"
    else:
        hint = "" if p.checkpoint else " or add --checkpoint-activations"
    return (f"--gpu-memory {p.memory_gib:g}G: {p.experiment}/{p.stage} does not fit in {p.precision} even at "
            f"--max-tokens {max(p.lengths)} (its longest sentence pair, {p.lengths[0]}/{p.lengths[1]} tokens): "
            f"parameters, gradients and {p.optimizer} state take {p.state_total / GIB:.2f} GiB and one such batch "
            f"{p.activation_bytes(max(p.lengths)) / GIB:.2f} GiB ({need / GIB:.2f} GiB) of the "
            f"{p.usable_bytes / GIB:.2f} GiB usable ({HEADROOM:.0%} headroom and {RESERVED_GIB:g} GiB reserved); "
            f"use GPUs with more memory{hint}")


def predicted_peak(p: Plan, tokens: int) -> float:
    """Predicted bytes above the model state of a step of ``tokens`` (--max-tokens) at the planning
    lengths; add ``p.state_total`` for the whole step."""
    return p.activation_bytes(tokens)


def compare_with_cuda(stage_or_exp, sentences: int, src_len: int, tgt_len: int, measured_bytes: float,
                      precision: str = "fp32", checkpoint: bool = False, vocab: Optional[int] = None,
                      gradients_in_peak: bool = True, device: str = "cpu") -> dict:
    """The planner's prediction for one measured CUDA training step, for benchmarks/gpu_check.py.

    ``stage_or_exp``: a registry :class:`Experiment` (its last training stage), a :class:`TrainStage`,
    or ``(arch, model_flags)`` as gpu_check builds its models; ``vocab``: the dictionary size the
    measured model was built with (default: the paper's); the step: ``sentences`` x (``src_len``,
    ``tgt_len``) tokens in the model's dtype ``precision`` (gpu_check's models are fp32);
    ``measured_bytes``: CUDA's ``max_memory_allocated`` during the step minus ``memory_allocated``
    before it (benchmarks/speed.py's ``activation_memory``: weights and Adam state already held,
    gradients set to None before the step, so they are part of the peak: ``gradients_in_peak``).

    Returns the predicted bytes: saved for backward (the CPU count's fit, evaluated at the shape),
    the estimated backward transient (two fp32 tokens x vocabulary buffers; with checkpointing, the
    largest layer), the parameter gradients, their sum, and ``relative_error`` = predicted / measured
    - 1: the planner's error on that GPU.  ``device``: where the counts run; the planner's own fits
    are CPU counts, so the default ``"cpu"`` measures the planner as it plans (``"cuda"`` is faster
    and follows the GPU's own choice of attention kernel: the difference of the two is the CPU/GPU
    part of the error).  Not modelled: the optimizer step's own temporaries (torch's foreach Adam),
    which can set the peak of a small batch."""
    from ..analysis import training_cost as tc

    if isinstance(stage_or_exp, Experiment):
        stage_or_exp = stage_or_exp.train_stages[-1]
    arch, flags = ((stage_or_exp.arch, stage_or_exp.model_flags) if isinstance(stage_or_exp, TrainStage)
                   else stage_or_exp)
    dtype = tc.DTYPES[precision]
    model = tc.build_stage_model(arch, flags, vocab=vocab, checkpoint_activations=checkpoint).to(device, dtype)
    f = tc.fit(model, held_out=())
    saved = tc.predict(f.saved, sentences, src_len, tgt_len)
    transient = sentences * tgt_len * len(model.decoder.dictionary) * 8
    if checkpoint:
        plain = tc.fit(tc.build_stage_model(arch, flags, vocab=vocab).to(device, dtype), held_out=())
        transient += tc.predict(plain.layer_max, sentences, src_len, tgt_len)
    grads = tc.parameter_count(model) * torch_itemsize(dtype) if gradients_in_peak else 0
    predicted = saved + transient + grads
    return {"predicted_saved_bytes": saved, "predicted_transient_bytes": transient,
            "predicted_gradient_bytes": grads, "predicted_bytes": predicted, "measured_bytes": float(measured_bytes),
            "relative_error": predicted / measured_bytes - 1 if measured_bytes else math.nan}


def torch_itemsize(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


# ------------------------------------------------------------------ printing
def describe(p: Plan, gpu: str = DEFAULT_GPU) -> str:
    g = GIB
    lines = [f"{p.experiment}/{p.stage}: {p.gpus} GPU(s) x {p.memory_gib:g} GiB, {p.precision}"
             f"{', activation checkpointing' if p.checkpoint else ''} (units: GiB = 2^30 bytes)",
             f"  parameters {p.params:,} (exact): weights {p.state['parameters'] / g:.3f}, gradients "
             f"{p.state['gradients'] / g:.3f}, {p.optimizer} state {p.state['optimizer'] / g:.3f} GiB",
             f"  activations (CPU saved-tensor count, fit; held-out error {p.held_out_error:.2%}, fit error "
             f"{p.fit_error:.2%}): {p.per_token / 2 ** 10:.1f} KiB per --max-tokens token at sentence pairs of "
             f"{p.lengths[0]}/{p.lengths[1]} tokens (with the estimated backward transient)",
             f"  usable: {p.usable_bytes / g:.2f} of {p.memory_gib:g} GiB ({HEADROOM:.0%} headroom, "
             f"{RESERVED_GIB:g} GiB reserved)"]
    if p.fits:
        lines.append(f"  --max-tokens {p.max_tokens} fits (largest, a multiple of 64); --update-freq "
                     f"{p.update_freq} on {p.gpus} GPU(s) for the paper's {p.tokens_per_update} tokens/update")
    else:
        lines.append("  does NOT fit: " + refusal(p))
    if not p.checkpoint:
        lines.append(f"  activation checkpointing needed: {'yes' if p.checkpoint_needed else 'no'}")
    lines.append(f"  FLOPs per target token (forward + backward{' + recompute' if p.checkpoint else ''}, "
                 f"measured matmuls): {p.flops_per_token / 1e9:.2f} GFLOP")
    secs = p.seconds_per_update(gpu)
    lines.append(f"  time per update (ESTIMATE, {gpu} at {UTILIZATION:.0%} of its published dense "
                 f"{p.precision} peak): {secs:.2f} s")
    return "\n".join(lines)


def table_markdown(cache: Optional[dict] = None) -> str:
    """docs/training.md's table: each headline row x memory x {bf16, bf16 + checkpointing}: the
    largest --max-tokens per GPU and --update-freq on 8 GPUs."""
    from .registry import EXPERIMENTS

    cache = _load_cache() if cache is None else cache
    head = "| experiment | params (M) | tokens/update | " + " | ".join(
        f"{m} GiB bf16 | {m} GiB bf16 + ckpt" for m in TABLE_MEMORY) + " |"
    out = [head, "|" + "---|" * (3 + 2 * len(TABLE_MEMORY))]
    for name in HEADLINE:
        exp = EXPERIMENTS[name]
        stage = exp.train_stages[-1]
        cells = []
        for m in TABLE_MEMORY:
            for ck in (False, True):
                p = plan_stage(exp, stage, TABLE_GPUS, m, "bf16", ck, cache)
                cells.append(f"{p.max_tokens} x {p.update_freq}" if p.fits else "does not fit")
        p0 = plan_stage(exp, stage, TABLE_GPUS, TABLE_MEMORY[-1], "bf16", False, cache)
        out.append(f"| `{name}` | {p0.params / 1e6:.1f} | {p0.tokens_per_update} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def build_cache(names=HEADLINE, precisions=("bf16",), path: Path = FITS_FILE, log=print, redo=()) -> dict:
    """Count the fits of ``names`` (every training stage) and write them to ``path``."""
    from .registry import EXPERIMENTS

    cache = _load_cache() if path == FITS_FILE else {}
    for k in [k for k in cache if any(json.loads(k)[0] == a for a in redo)]:
        del cache[k]
    for name in names:
        for stage in EXPERIMENTS[name].train_stages:
            for prec in precisions:
                for ck in (False, True):
                    e = stage_costs(stage, prec, ck, cache, exp_lengths=planning_lengths(EXPERIMENTS[name]))
                    log(f"{name}/{stage.name} {prec} ckpt={ck}: held-out error {e['fit']['held_out_error']:.4%}")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return cache


DOCS_START = "<!-- plan-table: generated by deepnmt_fairseq.repro.plan.table_markdown -->"
DOCS_END = "<!-- /plan-table -->"


def write_docs(path: Path) -> bool:
    """Replace the plan table of docs/training.md; True if it changed."""
    text = path.read_text()
    if DOCS_START not in text or DOCS_END not in text:
        raise PlanError(f"{path}: no {DOCS_START} ... {DOCS_END} markers")
    head, rest = text.split(DOCS_START, 1)
    new = head + DOCS_START + "\n" + table_markdown() + "\n" + DOCS_END + rest.split(DOCS_END, 1)[1]
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":  # python -m deepnmt_fairseq.repro.plan [--fits] [--docs]
    import sys

    if "--fits" in sys.argv:  # recount benchmarks/results/plan-fits.json (minutes on one core)
        build_cache(log=lambda s: print(s, flush=True))
    if "--docs" in sys.argv:
        print("docs/training.md", "updated" if write_docs(Path(__file__).resolve().parents[2] / "docs" / "training.md")
              else "up to date")
