"""Export a trained checkpoint to CTranslate2 (``deepnmt-export-ct2``).

    deepnmt-export-ct2 CHECKPOINT OUT_DIR [--quantization int8|int8_float32|float32|float16]
                       [--data DATA_BIN] [--bpe-codes FILE | --spm-model FILE] [--force]

A model is exportable when its *inference* graph is a standard Transformer, which is what
CTranslate2 runs.  The spec is CTranslate2's own ``TransformerSpec`` (encoder and decoder
specs built separately, so the two sides may differ in norm placement and head count); its
weights are filled layer by layer with the helper functions of
``ctranslate2.converters.fairseq`` (q/k/v fusion, layer norms, fairseq's position table with
its padding offset, ``embed_scale``), on the model fairseq itself builds from the checkpoint.
The stock converter is not used as a whole: it accepts only fairseq's own model names and
refuses ``--no-token-positional-embeddings`` (see docs in README, "Deployment").

Exportable, and how:

* pre-norm and post-norm stacks (``--post-norm``), any depth (GPKD students, DESDAR 48-1);
* relative positions without absolute ones (``--no-token-positional-embeddings
  --rpr-max-relative-position k``): CTranslate2's Shaw et al. relative keys/values, clipped
  at k and shared by the heads, as ours; keys-only models get all-zero value vectors, which
  is the same function;
* skipping sub-layer (``--ssl-rate``; Li et al. 2021 Eq. 6): at inference the branch of
  sub-layer l is multiplied by (1 - p_l), x_{l+1} = (1 - p_l) F(LN(x_l)) + x_l.  F ends in a
  linear map (attention ``out_proj``, FFN ``fc2``), so the factor is folded into that map's
  weight and bias; the exported network computes the same function with no extra op;
* GP (group permutation) and LayerDrop are training-only (identity order at inference);
* CAD with ``--cad-drop-ratio`` < 1: every layer keeps its cross-attention at inference;
* DeepNorm and Admin (``--deepnorm``, ``--admin``): each post-norm sub-layer computes
  LN(w * x + f(x)) with a shortcut weight w (DeepNorm's alpha, Admin's omega vector) that
  CTranslate2's spec does not have.  Reparameterised exactly (:func:`fold_residual_weights`):
  x is the previous LayerNorm's output (or the embeddings, for a stack's first sub-layer), so
  w * x is that LayerNorm with gain and bias multiplied by w (the embedding table and position
  table multiplied by w), and f reads x = (w * x) / w, i.e. f's input projections with their
  columns divided by w.  The exported network is a standard post-norm Transformer computing the
  same function (Liu et al. 2020, Sec. 5: "Admin ... can be reparameterized" as one).

Refused, with the feature and the reason (:func:`refusals`): MSC, transparent attention and
DLCL memories (the decoder does not read just the top encoder layer, or layers read more than
their predecessor), CAD ratio-1 layers (no cross-attention in some decoder layers: a
CTranslate2 decoder has it in all or none), absolute *and* relative positions together
(CTranslate2 4.8.5 has no position table in a model whose self-attention is relative, so the
absolute positions would be silently dropped), encoders without residuals, any model that is
not this plugin's ``deepnmt_transformer`` or fairseq's ``transformer`` (RNMT+ is recurrent).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

from deepnmt_deploy import METADATA, QUANTIZATIONS, require_ctranslate2
from deepnmt_deploy.text import Tokenization

logger = logging.getLogger("deepnmt_fairseq.deploy")

#: fairseq activations that CTranslate2 has (names as fairseq's --activation-fn)
ACTIVATIONS = ("relu", "gelu", "gelu_accurate", "gelu_fast", "swish")


class NotExportable(ValueError):
    """The model's inference graph is not a standard Transformer; the message names why."""


# ---------------------------------------------------------------- loading

def discover(data_dir: Optional[str], source_lang: str, target_lang: str):
    """``(Tokenization, path of the BPE codes / spm model or None)`` recorded next to ``data_dir``.

    Looks for, in order: ``prepare_data.py``'s ``../CONFIG.json`` with ``../bpe/code`` or
    ``../bpe/spm.model``; the quickstart's ``../tok/bpe.codes``; ``code``, ``bpe.codes``,
    ``codes`` or ``spm.model`` inside ``data_dir``.  Nothing found: no subword model (the
    export warns; pass ``--bpe-codes`` or ``--spm-model``)."""
    tok = Tokenization(source_lang=source_lang, target_lang=target_lang)
    if not data_dir:
        return tok, None
    data = Path(data_dir)
    config = data.parent / "CONFIG.json"
    if config.is_file():
        try:
            cfg = json.loads(config.read_text())
        except ValueError:
            cfg = {}
        if cfg.get("name"):
            from deepnmt_data.corpora import RECIPES

            recipe = RECIPES.get(cfg["name"])
            if recipe is not None:
                tok.lowercase = bool(getattr(recipe, "lowercase", False))
                tok.aggressive_dash = bool(getattr(recipe, "aggressive_dash", False))
                tok.found_in.append(f"recipe {cfg['name']} (deepnmt_data/corpora.py)")
        seg = str(cfg.get("segmenter", ""))
        model = data.parent / "bpe" / ("spm.model" if seg.startswith("sentencepiece") else "code")
        if model.is_file():
            tok.segmenter = "sentencepiece" if seg.startswith("sentencepiece") else "subword-nmt"
            tok.found_in.append(str(config))
            return tok, model
    candidates = [(data.parent / "tok" / "bpe.codes", "subword-nmt")]
    candidates += [(data / n, "subword-nmt") for n in ("code", "bpe.codes", "codes")]
    candidates += [(data / "spm.model", "sentencepiece")]
    for path, seg in candidates:
        if path.is_file():
            tok.segmenter = seg
            tok.found_in.append(str(path))
            return tok, path
    return tok, None

def load_model(checkpoint: str, data: Optional[str] = None):
    """``(model, cfg, task)``: the model fairseq builds from ``checkpoint``, in eval mode.

    ``data`` overrides the binarized data directory recorded in the checkpoint (where the
    dictionaries are)."""
    import deepnmt_fairseq  # noqa: F401  (registers the plugin's models)
    from fairseq import checkpoint_utils

    overrides = {"data": str(data)} if data else {}
    if data and not Path(data).is_dir():
        raise FileNotFoundError(f"--data {data}: no such directory")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides=overrides)
    model = models[0]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, cfg, task


def _opts(model):
    from ..models.options import DeepTransformerOptions

    return getattr(model.encoder, "opts", None) or DeepTransformerOptions()


# ---------------------------------------------------------------- what can be exported
def refusals(model, cfg_model=None) -> List[str]:
    """Why ``model`` cannot be exported (empty list: it can); each entry names the feature."""
    from fairseq.models.transformer import TransformerModel

    why: List[str] = []
    if not isinstance(model, TransformerModel):
        name = type(model).__name__
        extra = " (RNMT+ and other recurrent models have no Transformer inference graph)" if "rnn" in name.lower() \
            or "lstm" in name.lower() or "rnmt" in name.lower() else ""
        return [f"model {name}: only Transformer encoder-decoders (fairseq 'transformer', this plugin's "
                f"'deepnmt_transformer') map onto CTranslate2's TransformerSpec{extra}"]
    if hasattr(model.encoder, "document_layers"):  # models/hiertrans.py (a TransformerModel subclass)
        return ["HIERTRANS (--arch hiertrans): a sentence-level encoder whose attention stays within each "
                "sentence, a document-level encoder over sentence vectors, and a decoder reading both (MSC "
                "Appendix A); CTranslate2's TransformerSpec has one plain encoder stack"]
    opts = _opts(model)
    enc, dec = model.encoder, model.decoder
    memory = getattr(opts, "deep_memory", "top")
    if memory == "msc":
        why.append("MSC (--deep-memory msc): encoder layers attend to the context state C^{n-1} and decoder "
                   "layer n attends to encoder block n and C^n through gated fusion attention (Wei et al. 2020, "
                   "Eq. 10-13); CTranslate2's layers attend to one encoder output with plain attention")
    elif memory == "transparent":
        why.append("transparent attention (--deep-memory transparent): each decoder layer attends to its own "
                   "learned softmax mix of all encoder layer outputs (Bapna et al. 2018, Eq. 1-2); CTranslate2's "
                   "decoder layers all attend to the top encoder layer")
    elif memory == "dlcl":
        why.append("DLCL (--deep-memory dlcl): each encoder layer reads a learned combination of all previous "
                   "layers' outputs (Wang et al. 2019a, Sec. 3.2); a CTranslate2 layer reads only its predecessor")
    elif memory != "top":
        why.append(f"--deep-memory {memory}: only 'top' (the decoder attends to the last encoder layer) is a "
                   f"standard Transformer")
    no_cross = [i + 1 for i, layer in enumerate(dec.layers) if getattr(layer, "encoder_attn", None) is None]
    if no_cross:
        why.append(f"CAD with --cad-drop-ratio 1 (decoder layers {no_cross} have no cross-attention): a "
                   f"CTranslate2 decoder has cross-attention in every layer or in none; ratios < 1 export")
    if getattr(opts, "no_encoder_residual", False):
        why.append("--no-encoder-residual: CTranslate2's layers always add the residual")
    rpr = getattr(opts, "rpr_max_relative_position", 0)
    if rpr > 0 and (enc.embed_positions is not None or dec.embed_positions is not None):
        why.append(f"absolute and relative positions together (--rpr-max-relative-position {rpr} without "
                   f"--no-token-positional-embeddings, as GPKD's own RPR models): CTranslate2 4.8.5 stores no "
                   f"position table in a model whose self-attention is relative, and its runtime ignores one "
                   f"if present, so the export would silently drop the absolute positions and change the model. "
                   f"Train the RPR-only variant (--no-token-positional-embeddings) to deploy")
    act = getattr(cfg_model, "activation_fn", "relu") if cfg_model is not None else "relu"
    if str(act) not in ACTIVATIONS:
        why.append(f"--activation-fn {act}: CTranslate2 has {', '.join(ACTIVATIONS)}")
    if getattr(enc, "project_in_dim", None) is not None:
        why.append("encoder input projection (--encoder-input-dim != --encoder-embed-dim): not in "
                   "CTranslate2's encoder spec")
    if getattr(dec, "cross_self_attention", False):
        why.append("--cross-self-attention: CTranslate2's decoder self-attention does not read the encoder")
    if getattr(dec, "adaptive_softmax", None) is not None:
        why.append("--adaptive-softmax-cutoff: CTranslate2 has one full output projection")
    return why


def check_exportable(model, cfg_model=None) -> None:
    why = refusals(model, cfg_model)
    if why:
        raise NotExportable("this model cannot be exported to CTranslate2:\n  - " + "\n  - ".join(why))


def branch_scales(stack) -> Optional[List[float]]:
    """The skipping-sub-layer inference multipliers of a stack (2 per layer: self-attention,
    FFN; Li et al. 2021 Eq. 6), or None when the model was not trained with skipping
    (or its two-stage schedule had not switched it on)."""
    draw = getattr(stack, "draw_branch_scales", None)
    if draw is None:
        return None
    was = stack.training
    stack.eval()
    try:
        return draw()
    finally:
        stack.train(was)


# ---------------------------------------------------------------- the spec
def _scale_linear(spec, s: float) -> None:
    """Fold a branch multiplier into the last linear map of the branch (new arrays: the
    helpers' arrays share memory with the torch parameters)."""
    if s is None or s == 1.0:
        return
    spec.weight = spec.weight * s
    if getattr(spec, "bias", None) is not None and not isinstance(spec.bias, str):
        spec.bias = spec.bias * s


def _residual_weights(stack) -> Optional[List[object]]:
    """The shortcut weight of every sub-layer of ``stack`` in execution order (a float or a
    per-dimension float32 array), or None when the stack adds its residuals unweighted."""
    from ..modules.residual_scaling import AdminResidual, DeepNormResidual

    out = []
    for layer in stack.layers:
        w = getattr(layer, "residual_weight", None)
        if w is None:
            return None
        slots = 2 if not hasattr(layer, "encoder_attn") else (3 if layer.encoder_attn is not None else 2)
        for slot in range(slots):
            if isinstance(w, DeepNormResidual):
                out.append(float(w.alpha))
            elif isinstance(w, AdminResidual):
                out.append(w.omega(slot).detach().float().cpu().numpy())
            else:
                raise NotExportable(f"unknown residual weight {type(w).__name__}")
    return out


def fold_residual_weights(side_spec, stack) -> None:
    """Write DeepNorm's / Admin's shortcut weights w into a post-norm stack's spec exactly.

    LN(w * x + f(x)) with x the previous sub-layer's LayerNorm output g * n + b: the previous
    LayerNorm becomes (w g) * n + w b, and f's input projections W become W / w (column-wise,
    so f sees x again).  For the stack's first sub-layer x is the embedding,
    embed_scale * E[token] + P[position], so E and P are multiplied by w (or the embedding
    LayerNorm, if the model has one).  Keys and values of cross-attention read the encoder
    output, which no shortcut weight multiplies, so they stay as they are.
    """
    import numpy as np

    weights = _residual_weights(stack)
    if weights is None:
        return
    sublayers = []  # (input projection spec, the sub-layer's own LayerNorm spec), execution order
    for layer_spec in side_spec.layer:
        sublayers.append((layer_spec.self_attention.linear[0], layer_spec.self_attention.layer_norm))
        if getattr(layer_spec, "attention", None) is not None:
            sublayers.append((layer_spec.attention.linear[0], layer_spec.attention.layer_norm))
        sublayers.append((layer_spec.ffn.linear_0, layer_spec.ffn.layer_norm))
    if len(sublayers) != len(weights):
        raise NotExportable(f"{len(weights)} shortcut weights for {len(sublayers)} sub-layers")
    for k, ((proj, _norm), w) in enumerate(zip(sublayers, weights)):
        proj.weight = proj.weight / w  # (out, d) / (d,): the input dimension; new array
        if k == 0:
            if getattr(side_spec, "layernorm_embedding", None) is not None and stack.layernorm_embedding is not None:
                _scale_norm(side_spec.layernorm_embedding, w)
            else:
                emb = side_spec.embeddings[0] if isinstance(side_spec.embeddings, list) else side_spec.embeddings
                emb.weight = emb.weight * w
                table = getattr(side_spec, "position_encodings", None)
                if table is not None and isinstance(getattr(table, "encodings", None), np.ndarray):
                    table.encodings = table.encodings * w
        else:
            _scale_norm(sublayers[k - 1][1], w)


def _scale_norm(norm_spec, w) -> None:
    norm_spec.gamma = norm_spec.gamma * w
    norm_spec.beta = norm_spec.beta * w


def _set_relative(attn_spec, attention) -> None:
    import numpy as np

    rel = attention.relative
    attn_spec.relative_position_keys = rel.keys.detach().cpu().numpy()
    if rel.values is not None:
        attn_spec.relative_position_values = rel.values.detach().cpu().numpy()
    else:  # keys only: a zero value vector adds nothing (same function)
        attn_spec.relative_position_values = np.zeros_like(attn_spec.relative_position_keys)


def _max_positions(stack, default: int) -> int:
    fn = getattr(stack, "max_positions", None)
    return int(fn()) if fn is not None else default


def build_spec(model, cfg_model=None):
    """CTranslate2 ``TransformerSpec`` with the weights of ``model`` (checked exportable).

    The model's parameters keep their ``requires_grad`` flags."""
    grads = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)  # the converter's helpers read parameters with .numpy()
    try:
        return _build_spec(model, cfg_model)
    finally:
        for p, g in zip(model.parameters(), grads):
            p.requires_grad_(g)


def _build_spec(model, cfg_model=None):
    import numpy as np
    from ctranslate2.converters import fairseq as ct2_fairseq
    from ctranslate2.specs import transformer_spec

    check_exportable(model, cfg_model)
    enc, dec = model.encoder, model.decoder
    opts = _opts(model)
    relative = getattr(opts, "rpr_max_relative_position", 0) > 0
    act = ct2_fairseq._SUPPORTED_ACTIVATIONS[str(getattr(cfg_model, "activation_fn", "relu") or "relu")]
    dec_pre = bool(dec.layers[0].normalize_before)
    enc_pre = bool(enc.layers[0].normalize_before)

    enc_spec = transformer_spec.TransformerEncoderSpec(
        len(enc.layers), enc.layers[0].self_attn.num_heads, pre_norm=enc_pre,
        no_final_norm=enc_pre and enc.layer_norm is None, activation=act,
        layernorm_embedding=enc.layernorm_embedding is not None, relative_position=relative,
    )
    dec_spec = transformer_spec.TransformerDecoderSpec(
        len(dec.layers), dec.layers[0].self_attn.num_heads, pre_norm=dec_pre,
        no_final_norm=dec_pre and dec.layer_norm is None, activation=act,
        layernorm_embedding=dec.layernorm_embedding is not None, relative_position=relative,
        project_in_out=dec.project_in_dim is not None or dec.project_out_dim is not None,
    )
    spec = transformer_spec.TransformerSpec(enc_spec, dec_spec)

    for side_spec, stack, fill_layer in (
        (enc_spec, enc, ct2_fairseq.set_transformer_encoder_layer),
        (dec_spec, dec, ct2_fairseq.set_transformer_decoder_layer),
    ):
        # input layers: token embeddings, embed_scale, fairseq's position table (padding offset)
        ct2_fairseq.set_embeddings(side_spec.embeddings[0] if isinstance(side_spec.embeddings, list)
                                   else side_spec.embeddings, stack.embed_tokens)
        side_spec.scale_embeddings = float(stack.embed_scale)
        if stack.embed_positions is not None:
            ct2_fairseq.set_position_encodings(side_spec.position_encodings, stack.embed_positions)
            # a sinusoidal table grows on demand in fairseq; keep exactly max_positions rows
            n = _max_positions(stack, 1024)
            table = side_spec.position_encodings.encodings
            if table.shape[0] < n:
                from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding

                full = SinusoidalPositionalEmbedding.get_embedding(
                    n + stack.padding_idx + 1, table.shape[1], stack.padding_idx)
                table = full.numpy()[stack.padding_idx + 1:]
            side_spec.position_encodings.encodings = np.ascontiguousarray(table[:n])
        elif not relative:  # no positions at all: an all-zero table is the same function
            side_spec.position_encodings.encodings = np.zeros(
                (_max_positions(stack, 1024), stack.embed_tokens.embedding_dim), dtype=np.float32)
        scales = branch_scales(stack)
        for i, (layer_spec, layer) in enumerate(zip(side_spec.layer, stack.layers)):
            fill_layer(layer_spec, layer)
            if relative:
                _set_relative(layer_spec.self_attention, layer.self_attn)
            if scales is not None:  # Li et al. 2021 Eq. 6, folded into the branch's last linear map
                _scale_linear(layer_spec.self_attention.linear[-1], scales[2 * i])
                _scale_linear(layer_spec.ffn.linear_1, scales[2 * i + 1])
        if stack.layer_norm is not None:
            ct2_fairseq.set_layer_norm(side_spec.layer_norm, stack.layer_norm)
        if stack.layernorm_embedding is not None:
            ct2_fairseq.set_layer_norm(side_spec.layernorm_embedding, stack.layernorm_embedding)
        fold_residual_weights(side_spec, stack)
    ct2_fairseq.set_linear(dec_spec.projection, dec.output_projection)
    if dec.project_in_dim is not None:
        ct2_fairseq.set_linear(dec_spec.project_in, dec.project_in_dim)
    if dec.project_out_dim is not None:
        ct2_fairseq.set_linear(dec_spec.project_out, dec.project_out_dim)

    spec.register_source_vocabulary(ct2_fairseq._get_vocab(enc.dictionary))
    spec.register_target_vocabulary(ct2_fairseq._get_vocab(dec.dictionary))
    # fairseq: source ends with </s>; the decoder starts from </s> (prev_output_tokens)
    spec.config.decoder_start_token = spec.config.eos_token
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = float(enc.layers[0].self_attn_layer_norm.eps)
    return spec


# ---------------------------------------------------------------- export
def export(checkpoint: str, out_dir: str, quantization: Optional[str] = None, data: Optional[str] = None,
           bpe_codes: Optional[str] = None, spm_model: Optional[str] = None, moses: Optional[bool] = None,
           lowercase: Optional[bool] = None, aggressive_dash: Optional[bool] = None,
           force: bool = False, vmap: Optional[str] = None, vmap_options: Optional[dict] = None) -> Tuple[str, dict]:
    """Write the CTranslate2 model, its vocabularies, the subword model and
    :data:`~deepnmt_deploy.METADATA` to ``out_dir``; returns (out_dir, metadata).

    ``vmap``: ``"train"`` builds the vocabulary shortlist from the training data
    (:func:`deepnmt_fairseq.deploy.vmap.build`, ``vmap_options``: per_token, frequent, max_pairs),
    a path uses that ``vmap.txt``; registered with the spec (``register_vocabulary_mapping``)."""
    require_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization {quantization}: choose one of {', '.join(QUANTIZATIONS)}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not empty (use --force to overwrite)")
    model, cfg, task = load_model(checkpoint, data)
    cfg_model = cfg.model
    spec = build_spec(model, cfg_model)

    src = getattr(task.cfg, "source_lang", None) or "src"
    tgt = getattr(task.cfg, "target_lang", None) or "tgt"
    tok, found = discover(data or getattr(task.cfg, "data", None), src, tgt)
    if bpe_codes and spm_model:
        raise ValueError("give --bpe-codes or --spm-model, not both")
    if bpe_codes or spm_model:
        found = Path(bpe_codes or spm_model)
        if not found.is_file():
            raise FileNotFoundError(f"{'--bpe-codes' if bpe_codes else '--spm-model'} {found}: no such file")
        tok.segmenter = "subword-nmt" if bpe_codes else "sentencepiece"
        tok.found_in = [f"--{'bpe-codes' if bpe_codes else 'spm-model'} {found}"]
    if moses is not None:
        tok.moses = moses
    if lowercase is not None:
        tok.lowercase = lowercase
    if aggressive_dash is not None:
        tok.aggressive_dash = aggressive_dash
    if found is None:
        tok.segmenter = "none"
        logger.warning("no BPE codes or sentencepiece model found next to the data directory: the exported model "
                       "will read Moses-tokenized words as they are (pass --bpe-codes or --spm-model)")
    else:
        tok.model_file = "subword.codes" if tok.segmenter == "subword-nmt" else "subword.spm.model"

    spec.validate()
    spec.optimize(quantization=quantization)
    vmap_meta = None
    with tempfile.TemporaryDirectory() as tmp:
        if vmap is not None:
            from deepnmt_deploy.vmap import VocabularyMap

            from .vmap import build

            if vmap == "train":
                path = Path(tmp) / "vmap.txt"
                vmap_meta = build(task, path, **(vmap_options or {}))
            else:
                path = Path(vmap)
                if not path.is_file():
                    raise FileNotFoundError(f"--vmap {vmap}: no such file")
                vmap_meta = {"built_from": str(path.resolve())}
            vmap_meta["entries"] = len(VocabularyMap.read(path).rules)  # checks the format
            spec.register_vocabulary_mapping(str(path))
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        spec.save(str(out))
    if found is not None:
        shutil.copyfile(found, out / tok.model_file)
    max_src, max_tgt = model.max_positions()
    meta = {
        "format": 1,
        "checkpoint": str(Path(checkpoint).resolve()),
        "arch": str(getattr(cfg_model, "arch", getattr(cfg_model, "_name", ""))),
        "quantization": quantization or "float32",
        "encoder_layers": len(model.encoder.layers),
        "decoder_layers": len(model.decoder.layers),
        "embed_dim": int(model.encoder.embed_tokens.embedding_dim),
        # the longest source fairseq accepts, in subword tokens, </s> included
        "max_source_positions": int(max_src),
        "max_target_positions": int(max_tgt),
        "relative_positions": int(getattr(_opts(model), "rpr_max_relative_position", 0)),
        "skipping_sublayer_folded": branch_scales(model.encoder) is not None
        or branch_scales(model.decoder) is not None,
        "tokenization": tok.to_dict(),
        # the vocabulary shortlist (vmap.txt; deepnmt-translate uses it unless --no-vmap), or None
        "vmap": vmap_meta,
    }
    (out / METADATA).write_text(json.dumps(meta, indent=1) + "\n")
    return str(out), meta


def run(a) -> int:
    """``deepnmt-export-ct2`` (arguments: :mod:`deepnmt_cli.export_ct2`)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out, meta = export(a.checkpoint, a.out_dir, a.quantization, a.data, a.bpe_codes, a.spm_model,
                       a.moses, a.lowercase, a.aggressive_dash, a.force, vmap=a.vmap,
                       vmap_options=dict(per_token=a.vmap_per_token, frequent=a.vmap_frequent,
                                         max_pairs=a.vmap_max_pairs))
    t = meta["tokenization"]
    print(f"exported {meta['arch']} ({meta['encoder_layers']}-{meta['decoder_layers']}, {meta['quantization']}) "
          f"to {out}; tokenization: {'Moses + ' if t['moses'] else ''}{t['segmenter']}"
          f"{' (lowercased)' if t['lowercase'] else ''}"
          + (f"; vocabulary shortlist of {meta['vmap']['entries']} source tokens" if meta.get("vmap") else ""))
    return 0
