"""What one training step of a model costs, counted on the CPU: bytes of the model state and of the
tensors autograd saves for the backward pass, and matmul FLOPs (issue 81, the planner's measurements).

Everything here is **measured** on the device the model is on (the CPU in the planner), not estimated:

* :func:`state_bytes`: parameters, gradients and optimizer state (Adam / RAdam: two moments per
  parameter), from the built model's parameter count and the precision's bookkeeping (fp32: fp32
  weights and gradients; fairseq ``--bf16``: bf16 weights and gradients in the model plus fp32 master
  weights and gradients in the optimizer wrapper, ``FP16Optimizer``);
* :func:`count_step`: one forward pass of the training loss (fairseq's label-smoothed cross-entropy on
  the model's log-probabilities, computed in fp32 as fairseq does) with autograd recording, at the
  model's dtype, with a ``saved_tensors_hooks`` that records every distinct storage autograd keeps
  for the backward pass (parameters excluded; benchmarks/speed.py's count), the bytes saved inside
  each encoder / decoder layer (so the largest layer, recomputed at once under activation
  checkpointing, is known), and the matmul FLOPs of the forward pass
  (``torch.utils.flop_counter.FlopCounterMode``).  The backward pass is not run: it saves nothing,
  and its FLOPs are taken as twice the forward's (the usual 2x for matmuls: gradients of inputs and
  of weights).

The saved bytes of a batch of ``B`` sentences, source length ``S``, target length ``T`` (no padding)
are exactly a combination of the features :data:`FEATURES` (tokens, and length² for the attention
matrices); :func:`fit` solves for the coefficients by least squares over a few measured shapes and
:func:`predict` applies them.  The fit error on shapes not used in the fit is what the planner
prints (and tests/test_plan.py bounds).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

#: features of a batch of B sentences, source length S, target length T: tokens (B*S, B*T), the
#: attention matrices (B*S^2 encoder self, B*T^2 decoder self, B*S*T cross) and one per batch
FEATURES = ("B*S", "B*T", "B*S^2", "B*T^2", "B*S*T", "1")

#: the shapes (sentences, source length, target length) measured to fit a model, and the held-out
#: ones it is checked on (none of them in the fit); kept small so that a 200-layer model counts in
#: seconds on one core: the bytes are exactly linear in FEATURES, so small shapes determine them
FIT_SHAPES = ((1, 8, 8), (2, 8, 12), (1, 16, 8), (3, 12, 6), (1, 6, 16), (2, 14, 14), (1, 20, 10), (2, 10, 18))
HELD_OUT_SHAPES = ((3, 17, 13), (2, 24, 20), (4, 9, 11))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def features(b: int, s: int, t: int) -> List[float]:
    return [b * s, b * t, b * s * s, b * t * t, b * s * t, 1.0]


# ------------------------------------------------------------------ building a registry stage's model
def build_stage_model(arch: str, model_flags: Sequence[str] = (), vocab: Optional[int] = None,
                      checkpoint_activations: bool = False, overrides: Sequence[str] = ()):
    """The model of a training stage (``--arch arch`` and the stage's flags; flags the model does not
    know, e.g. ``--max-epoch``, are left out), built on the CPU with a dummy dictionary of ``vocab``
    symbols (default: the paper's joint vocabulary, :func:`~.param_counts.default_vocab`), with every
    stochastic layer kept (LayerDrop, cross-attention drop (CAD) off: the planner plans the step that
    computes everything).  ``overrides`` are model flags appended last (e.g. a reduced depth)."""
    import deepnmt_fairseq  # noqa: F401
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from .param_counts import default_vocab, make_dictionary

    cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(allow_abbrev=False, argument_default=argparse.SUPPRESS)
    cls.add_args(parser)
    flags = list(model_flags) + list(overrides)
    if checkpoint_activations:
        flags.append("--checkpoint-activations")
    args, _unknown = parser.parse_known_args([str(f) for f in flags])
    for k in ("checkpoint_activations", "offload_activations"):  # fairseq's distributed/ckpt options
        if not hasattr(args, k):
            setattr(args, k, False)
    if checkpoint_activations:
        args.checkpoint_activations = True
    ARCH_CONFIG_REGISTRY[arch](args)
    d = make_dictionary(vocab or default_vocab(arch))
    torch.manual_seed(0)
    from types import SimpleNamespace

    model = cls.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    keep_every_layer(model)
    return model


def keep_every_layer(model) -> None:
    """LayerDrop and CAD off (every layer and cross-attention computed); skipped sub-layers are
    computed and multiplied by zero anyway (their memory is the same)."""
    for part in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
        if part is None:
            continue
        for k in ("encoder_layerdrop", "decoder_layerdrop"):
            if getattr(part, k, 0):
                setattr(part, k, 0.0)
        if getattr(part, "cad_probs", None) is not None:
            part.cad_probs = [0.0] * len(part.cad_probs)


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def state_bytes(n_params: int, precision: str = "bf16", optimizer: str = "adam") -> Dict[str, int]:
    """Bytes of parameters, gradients and optimizer state of ``n_params`` parameters (exact for
    fairseq's bookkeeping): fp32 keeps fp32 weights (4) and gradients (4); ``--bf16`` keeps bf16
    weights (2) and gradients (2) in the model and fp32 master weights (4) and gradients (4) in the
    optimizer wrapper; Adam and RAdam keep two fp32 moments (8)."""
    if optimizer not in ("adam", "radam"):
        raise ValueError(f"optimizer {optimizer!r}: the planner knows adam and radam")
    if precision == "fp32":
        params, grads = 4 * n_params, 4 * n_params
    elif precision == "bf16":
        params, grads = (2 + 4) * n_params, (2 + 4) * n_params
    else:
        raise ValueError(f"precision {precision!r}: fp32 or bf16")
    return {"parameters": params, "gradients": grads, "optimizer": 8 * n_params}


# ------------------------------------------------------------------ counting one step
def _batch(model, b: int, s: int, t: int, seed: int = 0):
    vocab = len(model.decoder.dictionary)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    src[:, -1] = 2
    tgt = torch.randint(4, vocab, (b, t + 1), generator=g)
    tgt[:, 0] = 2
    dev = next(model.parameters()).device
    return src.to(dev), torch.full((b,), s).to(dev), tgt[:, :-1].contiguous().to(dev), tgt[:, 1:].contiguous().to(dev)


def _layers(model) -> List[Tuple[str, torch.nn.Module]]:
    out = []
    for part in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(getattr(model, part, None), "layers", None) or []):
            out.append((f"{part}.{i}", layer))
    return out


def _held_storages(model) -> set:
    """Storages the model holds between steps (parameters, buffers, tensors cached as module
    attributes, e.g. a sinusoidal position table grown to the longest length seen so far): not
    memory of the step, and counting them would make a count depend on the shapes counted before."""
    held = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    for m in model.modules():
        for v in vars(m).values():
            if torch.is_tensor(v):
                held.add(v.untyped_storage().data_ptr())
    return held


@dataclass
class StepCount:
    """One counted forward pass: ``saved`` bytes kept for backward (parameters excluded),
    ``by_layer`` the part of them saved inside each encoder/decoder layer, ``flops`` forward matmul
    FLOPs."""

    shape: Tuple[int, int, int]
    saved: int
    by_layer: Dict[str, int] = field(default_factory=dict)
    flops: int = 0


def count_step(model, b: int, s: int, t: int, label_smoothing: float = 0.1, flops: bool = True) -> StepCount:
    """Count one training forward pass at ``b`` sentences, source length ``s``, target length ``t``
    (see the module docstring: measured, at the model's dtype).  ``flops=False``: no FLOP count (the
    FLOP counter's module tracker cannot follow fairseq's reentrant activation checkpointing, whose
    forward runs without autograd; a checkpointed step's FLOPs are the plain step's plus one more
    forward of the layers)."""
    import contextlib

    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    src, lens, prev, target = _batch(model, b, s, t)
    params = _held_storages(model)
    seen: Dict[int, int] = {}
    where: Dict[int, str] = {}
    stack: List[str] = []
    handles = []
    for name, layer in _layers(model):
        handles.append(layer.register_forward_pre_hook(lambda m, a, n=name: stack.append(n) and None))
        handles.append(layer.register_forward_hook(lambda m, a, o: stack.pop() and None))

    def pack(x):
        st = x.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in params:
            if ptr not in seen or st.nbytes() > seen[ptr]:
                seen[ptr] = st.nbytes()
            where.setdefault(ptr, stack[-1] if stack else "")
        return x

    try:
        fc = FlopCounterMode(display=False) if flops else contextlib.nullcontext()
        with fc, torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            out = model(src, lens, prev)
            lprobs = model.get_normalized_probs(out, log_probs=True)
            loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), label_smoothing,
                                              ignore_index=model.decoder.dictionary.pad(), reduce=True)
    finally:
        for h in handles:
            h.remove()
    by_layer: Dict[str, int] = {}
    for ptr, n in seen.items():
        if where[ptr]:
            by_layer[where[ptr]] = by_layer.get(where[ptr], 0) + n
    total = sum(seen.values())
    del loss, out, lprobs
    return StepCount((b, s, t), total, by_layer, int(fc.get_total_flops()) if flops else 0)


# ------------------------------------------------------------------ the fit
@dataclass
class Fit:
    """Least-squares coefficients of :data:`FEATURES` for saved bytes, the largest layer's saved
    bytes and forward FLOPs, with the relative errors on the fit shapes and held-out shapes."""

    saved: List[float]
    layer_max: List[float]
    flops: List[float]
    fit_error: float = 0.0
    held_out_error: float = 0.0
    held_out: List[Tuple[Tuple[int, int, int], int, float]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"saved": self.saved, "layer_max": self.layer_max, "flops": self.flops,
                "fit_error": self.fit_error, "held_out_error": self.held_out_error,
                "held_out": [[list(s), m, p] for s, m, p in self.held_out]}

    @classmethod
    def from_dict(cls, d: dict) -> "Fit":
        return cls(d["saved"], d["layer_max"], d["flops"], d.get("fit_error", 0.0), d.get("held_out_error", 0.0),
                   [(tuple(s), m, p) for s, m, p in d.get("held_out", [])])


def predict(coef: Sequence[float], b: float, s: float, t: float) -> float:
    return float(sum(c * x for c, x in zip(coef, features(b, s, t))))


def _lstsq(rows: List[List[float]], ys: List[float]) -> List[float]:
    """Coefficients minimizing the squared *relative* errors (each shape weighs the same, small or
    large)."""
    a = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64)
    w = 1.0 / y.abs().clamp(min=1.0)
    a, y = a * w.unsqueeze(1), y * w
    scale = a.abs().amax(dim=0).clamp(min=1.0)  # columns of very different sizes (1 vs B*S^2)
    coef = torch.linalg.lstsq(a / scale, y.unsqueeze(1), driver="gelsd").solution.squeeze(1) / scale
    return [float(c) for c in coef]


def fit(model, shapes: Sequence[Tuple[int, int, int]] = FIT_SHAPES,
        held_out: Sequence[Tuple[int, int, int]] = HELD_OUT_SHAPES) -> Fit:
    """Count :func:`count_step` at ``shapes``, fit the coefficients, and measure the relative error of
    the prediction of saved bytes at ``held_out`` (shapes not in the fit)."""
    flops = not any(type(m).__name__ == "CheckpointWrapper" or hasattr(m, "precheckpoint_forward")
                    for m in model.modules())
    # warm-up at the longest lengths: tables a model caches and grows (sinusoidal positions) are made
    # here, and are then held (not counted) in every counted step whatever the order of the shapes
    every = [*shapes, *held_out]
    count_step(model, 1, max(s for _, s, _ in every), max(t for _, _, t in every), flops=False)
    counts = [count_step(model, *sh, flops=flops) for sh in shapes]
    rows = [features(*c.shape) for c in counts]
    f = Fit(_lstsq(rows, [c.saved for c in counts]),
            _lstsq(rows, [max(c.by_layer.values(), default=0) for c in counts]),
            _lstsq(rows, [c.flops for c in counts]))
    f.fit_error = max(abs(predict(f.saved, *c.shape) / c.saved - 1) for c in counts)
    for sh in held_out:
        c = count_step(model, *sh, flops=flops)
        f.held_out.append((tuple(sh), c.saved, predict(f.saved, *sh)))
    f.held_out_error = max((abs(p / m - 1) for _, m, p in f.held_out), default=0.0)
    return f
