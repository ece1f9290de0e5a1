"""GPKD student extraction: one layer per group (Li et al. 2021, "Student Training").

The teacher's N layers form contiguous groups of h; the student keeps one layer per group:
``random`` (the paper), ``first``, ``last``, or an explicit 0-based index list (one index inside
each group).  Progressive compression applies h = 2 repeatedly (train the student with GP,
extract again).

Embeddings, output projection, norms, dictionaries and every non-layer weight carry over
unchanged.  With MSC blocks each block keeps M_n / h layers; with transparent attention the
student mixes the embeddings and the *group outputs* (teacher rows 0, h, 2h, ... of W: the state
the kept layer was trained to imitate); CAD's drop depth becomes the number of kept layers below
it.  DeepNorm students get alpha/beta of their own depth (computed when the model is built from
the student's config); Admin's omegas travel with the kept layers.

Group size ties training to extraction (Li et al. 2021, "Student Training"): GP training with
group size h teaches one layer to stand in for its h-layer group, so the extraction h must be the
h the teacher was GP-trained with (:func:`check_extraction_group_size`).  The command line is
``deepnmt-extract-student`` (:mod:`deepnmt_fairseq.distill.extract`); this module works on
checkpoint dicts and state dicts, next to group permutation (:mod:`.group_permutation`).
"""

from __future__ import annotations

import copy
import logging
import random
import re
from typing import List, Optional

from ..memories.base import upgrade_memory_keys
from ..memories.msc import block_sizes
from ..memories.transparent import WEIGHT_KEY as TRANSPARENT_WEIGHT

logger = logging.getLogger("deepnmt_fairseq.extract_student")


def select_layers(num_layers: int, group_size: int, how: str = "random", seed: int = 1,
                  explicit: Optional[List[int]] = None, side: str = "encoder") -> List[int]:
    """0-based teacher layer indices, one per contiguous group of ``group_size``."""
    flag = f"--{side}-group-size"
    if group_size < 1 or num_layers % group_size != 0:
        raise ValueError(f"{flag} {group_size} does not divide the {num_layers} {side} layers")
    groups = num_layers // group_size
    if explicit is not None:
        if len(explicit) != groups:
            raise ValueError(f"--{side}-layers-select needs {groups} indices (one per group), got {len(explicit)}")
        for g, idx in enumerate(explicit):
            if not g * group_size <= idx < (g + 1) * group_size:
                raise ValueError(
                    f"--{side}-layers-select: index {idx} is not in group {g} "
                    f"(layers {g * group_size}..{(g + 1) * group_size - 1})"
                )
        return list(explicit)
    rng = random.Random(seed)
    pick = {"first": lambda g: 0, "last": lambda g: group_size - 1, "random": lambda g: rng.randrange(group_size)}
    if how not in pick:
        raise ValueError(f"unknown --select {how!r}")
    return [g * group_size + pick[how](g) for g in range(groups)]


_LAYER_KEY = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.*)$")


def remap_state(model_state: dict, enc_keep: Optional[List[int]], dec_keep: Optional[List[int]],
                enc_group: int = 1) -> dict:
    """New state dict with only the kept layers, renumbered 0..M-1."""
    maps = {"encoder": {old: new for new, old in enumerate(enc_keep)} if enc_keep is not None else None,
            "decoder": {old: new for new, old in enumerate(dec_keep)} if dec_keep is not None else None}
    out = {}
    model_state = upgrade_memory_keys(dict(model_state))
    for key, value in model_state.items():
        m = _LAYER_KEY.match(key)
        if m and maps[m.group(1)] is not None:
            side, idx, rest = m.group(1), int(m.group(2)), m.group(3)
            if idx in maps[side]:
                out[f"{side}.layers.{maps[side][idx]}.{rest}"] = value
            continue
        if key == TRANSPARENT_WEIGHT:  # transparent W: (N+1 encoder outputs, M decoder layers)
            if enc_keep is not None:  # the embedding row and each group's output row
                value = value[[0] + [(g + 1) * enc_group for g in range(len(enc_keep))]]
            if dec_keep is not None:  # the kept decoder layers' columns
                value = value[:, dec_keep]
            value = value.clone()
        out[key] = value
    return out


def model_args(state: dict):
    """The model config of a checkpoint dict (``cfg.model``, or the legacy ``args``)."""
    cfg = state.get("cfg")
    if isinstance(cfg, dict) and cfg.get("model") is not None:
        return cfg["model"]
    if state.get("args") is not None:
        return state["args"]
    raise ValueError("checkpoint has neither cfg.model nor args")


def teacher_group_sizes(args) -> dict:
    """The GP group sizes a teacher was trained with (its checkpoint's model config; 1 = no GP)."""
    return {"encoder": int(getattr(args, "gp_group_size", 1) or 1),
            "decoder": int(getattr(args, "gp_decoder_group_size", 1) or 1)}


def check_extraction_group_size(side: str, extracted: int, trained: int, allow_mismatch: bool) -> Optional[dict]:
    """Refuse an extraction h that differs from the teacher's GP h (Li et al. 2021: h = N/M and GP
    with group size h makes each layer of a group stand in for the group).  With ``allow_mismatch``
    the difference is returned, to be written into the student checkpoint."""
    if extracted == trained:
        return None
    gp_flag = "--gp-group-size" if side == "encoder" else "--gp-decoder-group-size"
    if not allow_mismatch:
        trained_text = f"GP-trained with {gp_flag} {trained}" if trained > 1 else f"trained without GP ({gp_flag} 1)"
        raise ValueError(
            f"--{side}-group-size {extracted} differs from the teacher's {side} group size: it was {trained_text}. "
            f"GPKD extracts one layer per group of the h layers that group-permutation training made "
            f"interchangeable (Li et al. 2021, 'Student Training': h = N/M; 'compress a 48-layer teacher into a "
            f"6-layer network by setting h = 8, or progressively ... with h = 2'); extract with "
            f"--{side}-group-size {trained}, GP-train the teacher with {gp_flag} {extracted}, or pass "
            f"--allow-group-size-mismatch (recorded in the student checkpoint)")
    logger.warning("%s: extracting with h=%d from a teacher GP-trained with h=%d (--allow-group-size-mismatch)",
                   side, extracted, trained)
    return {"teacher_gp": trained, "extracted": extracted}


def extract(state: dict, enc_group: int = 1, dec_group: int = 1, how: str = "random", seed: int = 1,
            enc_select: Optional[List[int]] = None, dec_select: Optional[List[int]] = None,
            allow_group_size_mismatch: bool = False) -> dict:
    """Student checkpoint dict from a teacher checkpoint dict (raw, as torch.load gives it).

    The extraction group size of each compressed side must equal the teacher's GP group size
    (:func:`check_extraction_group_size`) unless ``allow_group_size_mismatch``."""
    args = model_args(state)
    trained_h = teacher_group_sizes(args)
    override = {}
    new_args = copy.deepcopy(args)
    n_enc, n_dec = int(args.encoder_layers), int(args.decoder_layers)
    enc_keep = dec_keep = None
    if (enc_group > 1 or enc_select is not None) and getattr(args, "deep_memory", "top") == "dlcl":
        raise ValueError("a DLCL encoder (--deep-memory dlcl) cannot be compressed: every layer reads a learned "
                         "combination of all layers below it, which has no one-layer-per-group counterpart "
                         "(GPKD students are plain RPR Transformers, Li et al. 2021)")
    if enc_group > 1 or enc_select is not None:
        enc_keep = select_layers(n_enc, enc_group if enc_group > 1 else n_enc // len(enc_select), how, seed,
                                 enc_select, "encoder")
        enc_group = n_enc // len(enc_keep)
        new_args.encoder_layers = len(enc_keep)
        if getattr(args, "deep_memory", "top") == "msc":
            blocks = block_sizes(getattr(args, "msc_block_layers", None), n_enc, n_dec)
            if any(m % enc_group for m in blocks):
                raise ValueError(f"--encoder-group-size {enc_group} must divide every MSC block {blocks}")
            new_args.msc_block_layers = ",".join(str(m // enc_group) for m in blocks)
        mismatch = check_extraction_group_size("encoder", enc_group, trained_h["encoder"], allow_group_size_mismatch)
        if mismatch:
            override["encoder"] = mismatch
        if getattr(args, "gp_group_size", 1) > 1:
            new_args.gp_group_size = 1
    if dec_group > 1 or dec_select is not None:
        if getattr(args, "deep_memory", "top") == "msc":
            raise ValueError("an MSC decoder cannot be compressed (--decoder-group-size/--decoder-layers-select): "
                             "decoder layer n is tied to encoder block n; compress the encoder blocks with "
                             "--encoder-group-size instead")
        dec_keep = select_layers(n_dec, dec_group if dec_group > 1 else n_dec // len(dec_select), how, seed + 1,
                                 dec_select, "decoder")
        mismatch = check_extraction_group_size("decoder", n_dec // len(dec_keep), trained_h["decoder"], allow_group_size_mismatch)
        if mismatch:
            override["decoder"] = mismatch
        new_args.decoder_layers = len(dec_keep)
        depth = int(getattr(args, "cad_drop_depth", 0) or 0)
        if depth:
            new_args.cad_drop_depth = sum(1 for i in dec_keep if i < depth)
        if getattr(args, "gp_decoder_group_size", 1) > 1:
            new_args.gp_decoder_group_size = 1
    if enc_keep is None and dec_keep is None:
        raise ValueError("nothing to extract: give --encoder-group-size and/or --decoder-group-size (> 1)")
    for side, keep in (("encoder", enc_keep), ("decoder", dec_keep)):
        if keep is not None and getattr(args, f"{side}_layers_to_keep", None):
            setattr(new_args, f"{side}_layers_to_keep", None)

    student = {k: v for k, v in state.items() if k not in ("model", "last_optimizer_state")}
    student["model"] = remap_state(state["model"], enc_keep, dec_keep, enc_group)
    if isinstance(student.get("cfg"), dict) and student["cfg"].get("model") is not None:
        student["cfg"] = dict(student["cfg"])
        student["cfg"]["model"] = new_args
    else:
        student["args"] = new_args
    extra = dict(student.get("extra_state") or {})
    extra.pop("train_iterator", None)
    extra["gpkd_student"] = {"encoder_layers": enc_keep, "decoder_layers": dec_keep, "select": how, "seed": seed,
                             "teacher_gp_group_size": trained_h,
                             "group_size": {"encoder": enc_group if enc_keep is not None else 1,
                                            "decoder": n_dec // len(dec_keep) if dec_keep is not None else 1}}
    if override:
        extra["gpkd_student"]["group_size_override"] = override
    student["extra_state"] = extra
    return student
