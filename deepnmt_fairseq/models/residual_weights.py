"""fairseq glue of DeepNorm and Admin (the mechanisms: :mod:`deepnmt_fairseq.modules.residual_scaling`).

What the deep Transformer's layers and stacks ask of them: a layer's shortcut weight built from
the options (:func:`build_residual_weight`), DeepNorm's initialisation of a stack
(:func:`init_deepnorm`), the build-time refusals (:func:`check_residual_scaling`) and Admin's
profiling pass over a whole model (:func:`profile_admin`).  Imported by ``deep_transformer.py``;
imports nothing of it.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from ..modules.residual_scaling import (AdminProfile, AdminResidual, DeepNormConstants, DeepNormResidual,
                                        ResidualWeight, admin_residuals, deepnorm_constants, deepnorm_init_,
                                        parse_deepnorm_override)
from .options import DeepTransformerOptions

logger = logging.getLogger("deepnmt_fairseq.models.deep_transformer")

ENCODER_SLOTS = (0, 1)  # self-attention, FFN


def build_residual_weight(opts: DeepTransformerOptions, cfg, side: str, slots: int,
                          dim: int) -> Optional[ResidualWeight]:
    """The shortcut weight of one layer of ``side`` ("encoder" / "decoder"), or None."""
    if opts.deepnorm:
        return DeepNormResidual(getattr(deepnorm_constants_of(opts, cfg), f"{side}_alpha"))
    if opts.admin:
        return AdminResidual(slots, dim)
    return None


def deepnorm_constants_of(opts: DeepTransformerOptions, cfg) -> DeepNormConstants:
    """The model's DeepNorm constants: the override flag, or the paper's for its depths."""
    if opts.deepnorm_alpha_beta:
        return parse_deepnorm_override(opts.deepnorm_alpha_beta)
    return deepnorm_constants(cfg.encoder.layers, cfg.decoder.layers)


def init_deepnorm(stack: nn.Module, cfg, side: str) -> None:
    """DeepNorm's initialisation of one stack's layers (Wang et al. 2022, Fig. 2), if enabled."""
    if not stack.opts.deepnorm:
        return
    beta = getattr(deepnorm_constants_of(stack.opts, cfg), f"{side}_beta")
    for layer in stack.layers:
        if deepnorm_init_(layer, beta) == 0:
            raise RuntimeError(f"DeepNorm found no projection to initialise in a {side} layer ({type(layer)})")


def check_residual_scaling(cfg) -> None:
    """Refuse DeepNorm / Admin where they make no sense, naming both flags (build time)."""
    opts = DeepTransformerOptions.from_args(cfg)
    if not (opts.deepnorm or opts.admin):
        if opts.deepnorm_alpha_beta:
            raise ValueError("--deepnorm-alpha-beta is given without --deepnorm")
        return
    flag = "--deepnorm" if opts.deepnorm else "--admin"
    if opts.deepnorm and opts.admin:
        raise ValueError("--deepnorm and --admin both weight the same shortcut (x <- LN(w*x + f(x))): choose one")
    if opts.deepnorm_alpha_beta and not opts.deepnorm:
        raise ValueError("--deepnorm-alpha-beta is given without --deepnorm (it sets DeepNorm's constants)")
    if opts.deepnorm_alpha_beta:
        parse_deepnorm_override(opts.deepnorm_alpha_beta)
    if cfg.encoder.normalize_before or cfg.decoder.normalize_before:
        raise ValueError(
            f"{flag} is a post-norm method (x <- LN(w*x + f(x)), the LayerNorm after the residual sum), but this "
            f"model is pre-norm (--encoder-normalize-before / --decoder-normalize-before, or a pre-norm --arch): "
            f"use --post-norm or an architecture without pre-norm")
    if opts.deep_memory == "dlcl":
        raise ValueError(
            f"{flag} cannot be combined with --deep-memory dlcl: DLCL is implemented in its pre-norm form "
            f"(Wang et al. 2019a, Sec. 3.2) and {flag} is post-norm")
    if opts.no_encoder_residual:
        raise ValueError(f"{flag} weights the residual connections, which --no-encoder-residual removes")


def _mean_over_workers(values: List[float], device) -> List[float]:
    """Average floats over the data-parallel workers (Admin's profile is the same on all)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def profile_admin(model, src_tokens, src_lengths, prev_output_tokens) -> Dict[str, List[float]]:
    """Admin's profiling pass (Liu et al. 2020, Sec. 5): one forward over a batch, with no
    gradient, dropout or structural randomness, that sets every omega_init of encoder and
    decoder in execution order (:class:`~deepnmt_fairseq.modules.residual_scaling.AdminProfile`).
    Returns the omegas set, per stack."""
    stacks = {"encoder": model.encoder, "decoder": model.decoder}
    profiles = {name: AdminProfile(_mean_over_workers) for name in stacks}
    was_training = model.training
    skips = [(s.skip, s.skip.active) for s in stacks.values() if s.skip is not None]
    residuals = [(r, profiles[name]) for name, s in stacks.items() for r in admin_residuals(s)]
    try:
        model.eval()
        for skip, _ in skips:
            skip.active = False
        for r, profile in residuals:
            r.profile = profile
        with torch.no_grad():
            enc = model.encoder(src_tokens, src_lengths=src_lengths)
            model.decoder(prev_output_tokens, encoder_out=enc)
    finally:
        for r, _ in residuals:
            r.profile = None
        for skip, active in skips:
            skip.active = active
        model.train(was_training)
    model.admin_profiled.fill_(True)
    omegas = {name: p.omegas for name, p in profiles.items()}
    logger.info("Admin profile (first training batch): encoder omega %s; decoder omega %s",
                _short(omegas["encoder"]), _short(omegas["decoder"]))
    return omegas


def _short(values: List[float]) -> str:
    return f"{len(values)} sub-layers, {values[0]:.3f} ... {values[-1]:.3f}" if values else "none"
