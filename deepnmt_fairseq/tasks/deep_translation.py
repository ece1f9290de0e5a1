"""``--task deep_translation``: fairseq's translation task plus depth diagnostics.

Everything is off by default; with every flag off :meth:`train_step` is
fairseq's own.  The diagnostics reproduce the papers' analysis figures:

==========================  ==================================================  ============================
flag                        logged keys (``fairseq.logging.metrics``)           paper
==========================  ==================================================  ============================
``--log-grad-norms-every``  ``enc_gnorm_{i}``, ``dec_gnorm_{j}`` (layer i/j,    MSC (Wei et al. 2020) Fig. 5
                            1-based): L2 norm of the gradient of all
                            parameters of that layer
``--log-grad-ratio``        ``grad_ratio`` r_t = ||dL/dh_1|| / ||dL/dh_N||,     Bapna et al. 2018 Sec. 2.3,
                            and ``grad_norm_h1``, ``grad_norm_hN``              Fig. 1-3
``--log-mixing-weights``    ``mix_{i}_{j}`` = s_{i,j} (i = 0 embeddings ...     Bapna et al. 2018 Eq. 1,
                            N, j = 1 ... M decoder layers)                      Fig. 4
``--log-gate-stats``        ``gate_enc_{i}``, ``gate_dec_{j}``: mean gate g     MSC Eq. 12-13
                            of the gated fusion of layer i/j, and
                            ``gatestd_enc_{i}``, ``gatestd_dec_{j}``: its std
``--log-change-norms``      ``enc_dW_{i}``, ``dec_dW_{j}``: ||W - W_0|| /        DeepNet (Wang et al. 2022)
                            ||W_0|| of layer i/j's parameters since the          Sec. 3 "model update";
                            reference; ``enc_dF_{i}``: ||h_i - h_i^0|| /         Admin (Liu et al. 2020)
                            ||h_i^0||, the change of encoder layer i's output    Sec. 4 "output change"
                            on one fixed probe batch; ``delta_ref`` (the
                            update of the reference), ``delta_update``
==========================  ==================================================  ============================

Every diagnostic line also carries ``diag_update``, the update the values belong
to.  They are logged with ``metrics.log_scalar(..., weight=0)`` inside
``train_step``, i.e. in fairseq's ``train_inner`` aggregation, so they appear in
``--log-format json`` lines and in ``--tensorboard-logdir`` like fairseq's own
statistics.  Weight 0 means "the latest value": the line printed at update U
shows the values of the last diagnostic update <= U (use a ``--log-interval``
that divides the diagnostic interval to see every one of them; ``diag_update``
says which update they are from).  Keys that were not logged since the last
printed line are removed from the aggregators, so lines without diagnostics do
not carry stale or empty values.

Which updates: update 1 and every K-th update (``diag_update % K == 0``).

What exactly is measured (fairseq's ``Trainer.train_step`` calls the task once
per micro-batch, before the all-reduce, the division by the sample size,
gradient clipping and the optimizer step):

* **Gradient norms** are computed after every micro-batch of a diagnostic
  update from the accumulated ``.grad`` and logged with weight 0, so the value
  that stays is the one after the *last* micro-batch, i.e. the gradient of the
  whole update (``--update-freq`` > 1 accumulates).  It is divided by the sum of
  the micro-batches' sample sizes and by the fp16/AMP loss scale: with one
  worker it is exactly the gradient fairseq hands to the optimizer *before*
  ``--clip-norm``.  With several workers it is this worker's view: its own
  gradient (``--ddp-backend legacy_ddp``/``no_c10d``, reduced only later) or the
  workers' average (c10d DDP reduces during the last backward pass), divided by
  this worker's sample size; only the first worker's values are printed.
  Layer i is the i-th module of ``encoder.layers``/``decoder.layers`` (under group
  permutation, ``--gp-group-size``, its execution position within its group varies).
  FSDP (flattened parameters) is not supported.
* **r_t** (Bapna Sec. 2.3): h_1 and h_N are the outputs of the first and last
  encoder layer *in execution order* (the stack positions 1 and N, also under
  group permutation; a LayerDrop-ped layer is not executed), taken with forward
  hooks that are installed only on diagnostic updates.  Their gradients are
  accumulated over all micro-batches of the update and over every encoder pass
  of the criterion (``collapse_reducing`` runs the encoder three times with ALD):
  ||dL/dh|| is the norm of the concatenation of those gradients.  Sample-size
  normalisation and loss scale cancel in the ratio.  The paper does not say
  whether h_N is taken before or after the final LayerNorm of a pre-norm
  encoder; we take the layer output, before it (the "output of the N-th layer").
  For ``--arch rnmt_plus`` (Bapna et al. Fig. 2) h_i is the output of the i-th
  bidirectional LSTM layer (both directions concatenated, residual included), before
  the encoder's final projection.
* **Mixing weights** s_{i,j}: ``encoder.memory.layer_mix.mixing_weights()`` in eval
  mode (no dropout on W), as used by this update's forward pass (i.e. before the
  update's optimizer step).  ``rnmt_plus`` has one attention module (M = 1): ``mix_{i}_1``.
* **Change norms** (``--log-change-norms``; DeepNet's and Admin's diagnostic of why post-norm stalls:
  an early update that moves the upper layers' outputs too far).  On the first diagnostic update the
  task keeps a copy of every encoder/decoder layer's parameters (the reference W_0: the initial model,
  or the resumed one after a restart, ``delta_ref`` says which update) and the first micro-batch's
  source (the probe: fixed for the whole run) with every encoder layer's output on it, computed in eval
  mode (no dropout, LayerDrop or permutation, so no random number is drawn) under ``no_grad``.  On each
  diagnostic update, before its forward pass (so after ``delta_update`` = ``update_num`` optimizer
  steps), it logs for every layer the relative parameter change ||W - W_0||_F / ||W_0||_F and, for
  every encoder layer, the relative output change on the probe ||h_i - h_i^0||_F / ||h_i^0||_F over its
  non-pad positions.  The papers do not fix the reference: DeepNet's Fig. 2 plots the "model update"
  ||F(x, theta_t) - F(x, theta_0)|| from the start of training, Admin's Sec. 4 the "output change"
  |F(x, W) - F(x, W*)| under a parameter perturbation; our reading is the change since the start,
  per layer, relative to the start (comparable across depths and widths).  Costs one extra encoder
  forward pass of the probe per diagnostic update and a copy of the layers' parameters.
* **Gate statistics**: ``GatedFusion.last_gate_mean`` of every fused attention
  (encoder self-attention, Eq. 12; decoder cross-attention, Eq. 13) of the last
  forward pass of the update (the last micro-batch; with several decoder passes,
  as DDR, the last one).  A layer whose cross-attention was dropped (CAD) in that
  pass has no value.
"""



import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

logger = logging.getLogger(__name__)

TASK_NAME = "deep_translation"
DIAG_PRIORITY = 3000  # after fairseq's own statistics in every log line
DIAG_PREFIXES = ("diag_update", "enc_gnorm_", "dec_gnorm_", "grad_ratio", "grad_norm_h", "mix_", "gate_enc_",
                 "gate_dec_", "gatestd_enc_", "gatestd_dec_", "delta_ref", "delta_update", "enc_dW_", "dec_dW_",
                 "enc_dF_")


def _layer_mix(model):
    """The transparent-attention weights W of a model's encoder memory, or None."""
    return getattr(getattr(getattr(model, "encoder", None), "memory", None), "layer_mix", None)


@dataclass
class DeepTranslationConfig(TranslationConfig):
    log_grad_norms_every: int = field(
        default=0,
        metadata={"help": "log the gradient norm of every encoder and decoder layer's parameters "
                          "(MSC, Wei et al. 2020, Fig. 5) on update 1 and every K updates (0: off); K is "
                          "also the interval of the other diagnostics unless --log-diagnostics-every"},
    )
    log_grad_ratio: bool = field(
        default=False,
        metadata={"help": "log r_t = ||grad h_1|| / ||grad h_N||, the gradients w.r.t. the first and last "
                          "encoder layer outputs (Bapna et al. 2018, Sec. 2.3, Fig. 1-3)"},
    )
    log_mixing_weights: bool = field(
        default=False,
        metadata={"help": "log the transparent-attention weights s_ij (Bapna et al. 2018, Eq. 1, Fig. 4); "
                          "needs --deep-memory transparent"},
    )
    log_gate_stats: bool = field(
        default=False,
        metadata={"help": "log the mean gate value of every MSC gated fusion (Wei et al. 2020, Eq. 12-13); "
                          "needs --deep-memory msc with --msc-fusion gate"},
    )
    log_change_norms: bool = field(
        default=False,
        metadata={"help": "log each layer's parameter change ||W - W_0||/||W_0|| and each encoder layer's output "
                          "change on a fixed probe batch since the first diagnostic update (DeepNet, Wang et al. "
                          "2022, Sec. 3; Admin, Liu et al. 2020, Sec. 4)"},
    )
    log_diagnostics_every: int = field(
        default=0,
        metadata={"help": "interval (updates) of --log-grad-ratio, --log-mixing-weights and --log-gate-stats "
                          "(0: the interval of --log-grad-norms-every)"},
    )


class _UpdateState:
    """What one diagnostic update accumulates over its micro-batches."""

    def __init__(self, update_num: int):
        self.update_num = update_num
        self.sample_size = 0.0
        self.h1_sq: Optional[torch.Tensor] = None
        self.hn_sq: Optional[torch.Tensor] = None

    def add(self, name: str, g: torch.Tensor) -> None:
        sq = g.detach().float().pow(2).sum()
        cur = getattr(self, name)
        setattr(self, name, sq if cur is None else cur + sq)


def unwrap_model(model):
    """The fairseq model under DDP/legacy-DDP wrappers (they proxy attributes or keep ``.module``)."""
    m = model
    while not hasattr(m, "encoder") and hasattr(m, "module"):
        m = m.module
    return m


def _deep_memory(model) -> str:
    encoder = getattr(model, "encoder", None)
    opts = getattr(encoder, "opts", None)
    if opts is not None:
        return f"--deep-memory {opts.deep_memory}"
    if getattr(encoder, "deep_memory", None) is not None:  # rnmt_plus
        return f"--deep-memory {encoder.deep_memory}"
    return f"a {type(model).__name__} (not deepnmt_transformer)"


def gated_fusions(model) -> Dict[str, object]:
    """{log key: GatedFusion} of every MSC fused attention that has a gate."""
    from ..modules.gated_fusion import GatedFusion

    out = {}
    enc, dec = getattr(model, "encoder", None), getattr(model, "decoder", None)
    for side, layers, attr in (("enc", getattr(enc, "layers", None) or [], "self_attn"),
                               ("dec", getattr(dec, "layers", None) or [], "encoder_attn")):
        for i, layer in enumerate(layers):
            fusion = getattr(getattr(layer, attr, None), "fusion", None)
            if isinstance(fusion, GatedFusion) and fusion.mode == "gate":
                out[f"gate_{side}_{i + 1}"] = fusion
    return out


def layer_grad_norms(layers) -> torch.Tensor:
    """L2 norm of the gradient of all parameters of each layer (missing grads count as zero)."""
    norms = []
    for layer in layers:
        sq = None
        for p in layer.parameters():
            if p.grad is not None:
                s = p.grad.detach().float().pow(2).sum()
                sq = s if sq is None else sq + s
        norms.append(torch.zeros(()) if sq is None else sq.cpu())
    if not norms:
        return torch.zeros(0)
    return torch.stack(norms).sqrt()


def _layer_vectors(layers) -> List[torch.Tensor]:
    """Every layer's parameters as one detached float vector (a copy)."""
    return [torch.cat([p.detach().float().reshape(-1) for p in layer.parameters()]).clone()
            if any(True for _ in layer.parameters()) else torch.zeros(0) for layer in layers]


def _relative(now: torch.Tensor, ref: torch.Tensor) -> float:
    den = float(ref.norm())
    return float((now - ref).norm()) / den if den > 0 else float("nan")


class ChangeReference:
    """The reference of ``--log-change-norms``: the layers' parameters and the encoder layers' outputs on
    one probe batch, at the update it was taken (see the module docstring)."""

    def __init__(self, model, sample, update_num: int):
        self.update_num = update_num
        net_input = sample["net_input"]
        self.src_tokens = net_input["src_tokens"].detach().clone()
        self.src_lengths = net_input["src_lengths"].detach().clone()
        self.params = {side: _layer_vectors(getattr(getattr(model, side), "layers", None) or [])
                       for side in ("encoder", "decoder")}
        self.outputs = self.encoder_outputs(model)
        self.last: Dict[str, float] = {}

    def encoder_outputs(self, model) -> List[torch.Tensor]:
        """Each encoder layer's output on the probe, ``(T, B, C)`` with pad positions zeroed, in eval mode."""
        encoder = model.encoder
        outs: List[torch.Tensor] = []

        def grab(_module, _inputs, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            outs.append(t.detach().float())

        modes = [(m, m.training) for m in model.modules()]
        handles = [layer.register_forward_hook(grab) for layer in encoder.layers]
        try:
            model.eval()
            with torch.no_grad():
                encoder(self.src_tokens, src_lengths=self.src_lengths)
        finally:
            for h in handles:
                h.remove()
            for m, was in modes:
                m.training = was
        pad = getattr(encoder, "padding_idx", None)
        pad = encoder.dictionary.pad() if pad is None else pad
        keep = self.src_tokens.ne(pad).t().unsqueeze(-1)  # (T, B, 1)
        return [o * keep.to(o.dtype) if o.dim() == 3 and o.shape[:2] == keep.shape[:2] else o for o in outs]

    def changes(self, model, update_num: int) -> Dict[str, float]:
        values = {"delta_ref": float(self.update_num), "delta_update": float(update_num)}
        for side, key in (("encoder", "enc"), ("decoder", "dec")):
            now = _layer_vectors(getattr(getattr(model, side), "layers", None) or [])
            for i, (w, w0) in enumerate(zip(now, self.params[side])):
                values[f"{key}_dW_{i + 1}"] = _relative(w, w0)
        for i, (h, h0) in enumerate(zip(self.encoder_outputs(model), self.outputs)):
            values[f"enc_dF_{i + 1}"] = _relative(h, h0)
        self.last = values
        return values


def loss_scale(optimizer) -> float:
    """The factor fairseq's fp16/AMP optimizers multiplied the loss by before backward (1 otherwise)."""
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None:
        return 1.0
    if hasattr(scaler, "loss_scale"):  # fairseq DynamicLossScaler (--fp16, --memory-efficient-fp16)
        return float(scaler.loss_scale)
    if hasattr(scaler, "get_scale"):  # torch GradScaler (--amp)
        return float(scaler.get_scale())
    return 1.0


@register_task(TASK_NAME, dataclass=DeepTranslationConfig)
class DeepTranslationTask(TranslationTask):
    """fairseq's ``translation`` task with the depth diagnostics listed in the module docstring."""

    cfg: DeepTranslationConfig

    def __init__(self, cfg: DeepTranslationConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        for name in ("log_grad_norms_every", "log_diagnostics_every"):
            if getattr(cfg, name, 0) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(cfg, name)})")
        self.grad_norm_every = int(getattr(cfg, "log_grad_norms_every", 0) or 0)
        self.diag_every = int(getattr(cfg, "log_diagnostics_every", 0) or 0) or self.grad_norm_every
        self.want_ratio = bool(getattr(cfg, "log_grad_ratio", False))
        self.want_mix = bool(getattr(cfg, "log_mixing_weights", False))
        self.want_gates = bool(getattr(cfg, "log_gate_stats", False))
        self.want_change = bool(getattr(cfg, "log_change_norms", False))
        wanted = [f for f, on in (("--log-grad-ratio", self.want_ratio), ("--log-mixing-weights", self.want_mix),
                                  ("--log-gate-stats", self.want_gates), ("--log-change-norms", self.want_change))
                  if on]
        if wanted and self.diag_every == 0:
            raise ValueError(f"{', '.join(wanted)} needs an interval: give --log-grad-norms-every K or "
                             f"--log-diagnostics-every K")
        self.diagnostics_on = self.grad_norm_every > 0 or bool(wanted)
        self._state: Optional[_UpdateState] = None
        self._logged_keys: set = set()
        self._reference: Optional[ChangeReference] = None

    # ------------------------------------------------------------------ checks
    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        self.check_diagnostics(model)
        return model

    def check_diagnostics(self, model) -> None:
        """Fail clearly when a diagnostic asked for does not exist in ``model``."""
        model = unwrap_model(model)
        enc_layers = getattr(getattr(model, "encoder", None), "layers", None)
        if (self.grad_norm_every or self.want_ratio or self.want_change) and enc_layers is None:
            raise ValueError(f"--log-grad-norms-every/--log-grad-ratio/--log-change-norms need an encoder with layers; "
                             f"{type(model).__name__} has none")
        if self.want_ratio and len(enc_layers) == 0:
            raise ValueError("--log-grad-ratio needs at least one encoder layer (--encoder-layers 0)")
        if self.want_mix and _layer_mix(model) is None:
            raise ValueError(f"--log-mixing-weights needs transparent attention (--deep-memory transparent, "
                             f"Bapna et al. 2018); this model has {_deep_memory(model)}")
        if self.want_gates and not gated_fusions(model):
            opts = getattr(getattr(model, "encoder", None), "opts", None)
            detail = _deep_memory(model)
            if opts is not None and opts.deep_memory == "msc":
                detail += f" --msc-fusion {opts.msc_fusion} --msc-context-cell {opts.msc_context_cell}"
            raise ValueError(f"--log-gate-stats needs MSC gated fusion (--deep-memory msc --msc-fusion gate "
                             f"with a context cell, Wei et al. 2020 Eq. 12-13); this model has {detail}")

    # -------------------------------------------------------------- schedule
    @staticmethod
    def _due(update_num: int, every: int) -> bool:
        """update_num counts finished updates; the values belong to update ``update_num + 1``."""
        return every > 0 and (update_num == 0 or (update_num + 1) % every == 0)

    # ------------------------------------------------------------ train step
    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if not self.diagnostics_on:
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        do_norms = self._due(update_num, self.grad_norm_every)
        do_diag = self._due(update_num, self.diag_every)
        if not (do_norms or do_diag):
            self._prune_stale_meters()
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

        core = unwrap_model(model)
        values: Dict[str, float] = {"diag_update": float(update_num + 1)}
        if self._state is None or self._state.update_num != update_num or self._grads_cleared(core):
            self._state = _UpdateState(update_num)
            if do_diag and self.want_change:  # once per update, before its first forward pass
                if self._reference is None:
                    self._reference = ChangeReference(core, sample, update_num)
                values.update(self._reference.changes(core, update_num))
        elif do_diag and self.want_change and self._reference is not None:
            values.update(self._reference.last)  # later micro-batches of the update: the same values
        state = self._state
        handles: List = []
        fusions = gated_fusions(core) if (do_diag and self.want_gates) else {}
        try:
            if do_diag and self.want_ratio:
                handles = self._install_ratio_hooks(core, state)
            for fusion in fusions.values():
                fusion.record_gate, fusion.last_gate_mean, fusion.last_gate_std = True, None, None
            loss, sample_size, logging_output = super().train_step(
                sample, model, criterion, optimizer, update_num, ignore_grad
            )
        finally:
            for h in handles:
                h.remove()
            for fusion in fusions.values():
                fusion.record_gate = False
        if not ignore_grad:
            state.sample_size += float(sample_size)

        if do_norms:
            denom = max(state.sample_size, 1e-12) * loss_scale(optimizer)
            for side, stack in (("enc", core.encoder), ("dec", core.decoder)):
                layers = getattr(stack, "layers", None)
                if layers is None:
                    continue
                for i, n in enumerate((layer_grad_norms(layers) / denom).tolist()):
                    values[f"{side}_gnorm_{i + 1}"] = n
        if do_diag and self.want_ratio and state.h1_sq is not None and state.hn_sq is not None:
            h1, hn = float(state.h1_sq.sqrt()), float(state.hn_sq.sqrt())
            values["grad_norm_h1"], values["grad_norm_hN"] = h1, hn
            values["grad_ratio"] = h1 / hn if hn > 0 else float("inf")
        if do_diag and self.want_mix:
            s = self.mixing_weights(core)
            for i in range(s.size(0)):
                for j in range(s.size(1)):
                    values[f"mix_{i}_{j + 1}"] = float(s[i, j])
        for key, fusion in fusions.items():
            if fusion.last_gate_mean is not None:
                values[key] = float(fusion.last_gate_mean)
                # encoder gates are normalised (their mean stays near 0.5): the spread tells more
                values[key.replace("gate_", "gatestd_", 1)] = float(fusion.last_gate_std)
        for key, v in values.items():
            metrics.log_scalar(key, v, weight=0, priority=DIAG_PRIORITY)
            self._logged_keys.add(key)
        return loss, sample_size, logging_output

    @staticmethod
    def mixing_weights(model) -> torch.Tensor:
        """s ``(N+1, M)`` of transparent attention in eval mode (no dropout on W, Bapna Eq. 1)."""
        mix = _layer_mix(unwrap_model(model))
        was = mix.training
        try:
            mix.eval()
            with torch.no_grad():
                return mix.mixing_weights().detach().float().cpu()
        finally:
            mix.train(was)

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def _grads_cleared(model) -> bool:
        """True before the first backward of an update (fairseq's zero_grad sets every .grad to None);
        catches a retried update (fp16 overflow) that keeps its update number."""
        return all(p.grad is None for p in model.parameters())

    @staticmethod
    def _install_ratio_hooks(model, state: _UpdateState) -> List:
        """Forward hooks that put gradient hooks on the first and last encoder layer output of each pass."""
        encoder = model.encoder
        outputs: List[torch.Tensor] = []

        def start_pass(_module, _inputs):
            outputs.clear()

        def layer_out(_module, _inputs, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if torch.is_tensor(t) and t.requires_grad:
                outputs.append(t)

        def end_pass(_module, _inputs, _out):
            if outputs:
                outputs[0].register_hook(lambda g: state.add("h1_sq", g))
                outputs[-1].register_hook(lambda g: state.add("hn_sq", g))
            outputs.clear()

        handles = [encoder.register_forward_pre_hook(start_pass), encoder.register_forward_hook(end_pass)]
        handles += [layer.register_forward_hook(layer_out) for layer in encoder.layers]
        return handles

    def _prune_stale_meters(self) -> None:
        """Drop our meters that were reset since they were last printed (no empty values in later lines)."""
        if not self._logged_keys:
            return
        for agg in metrics.get_active_aggregators():
            stale = [k for k in self._logged_keys if k in agg and getattr(agg[k], "val", 0) is None]
            if not stale:
                continue
            for k in stale:
                del agg[k]
            if hasattr(agg, "priorities"):
                agg.priorities = [t for t in agg.priorities if t[2] not in stale]
