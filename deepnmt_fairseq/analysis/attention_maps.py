"""Attention heatmaps of one sentence (MSC, Wei et al. 2020, Fig. 4 and 6).

The sentence is tokenized with sacremoses (``--moses-lang``) and split with the model's
subword-nmt BPE codes (``--bpe-codes``) when given; otherwise it is taken as already
tokenized/BPE'd.  It is translated (beam search, ``--beam``; ``--greedy`` = beam 1), or
``--target`` is used as the translation (forced decoding), then a teacher-forced pass over the
translation records

* ``cross``: the cross-attention of the top decoder layer (``--layer`` picks another), averaged
  over heads.  In an MSC model this is ATTN_h over encoder block N's output B_e^N (Eq. 13); with
  transparent attention it is the attention over the layer mix z^j (Bapna Eq. 2);
* ``context`` (MSC with a context cell only): ATTN_c of the same layer, the attention over the
  context state C^N (Eq. 13), whose positions are the source positions.

``--attention auto`` (default) draws ``cross``, and ``context`` too for MSC models.  Asking for an
attention the model does not have fails with a message naming the model's ``--deep-memory``.

Writes ``attention.png`` (one heatmap per attention: rows = target tokens, columns = source
tokens) and ``attention.json`` (tokens, translation, matrices).

The library behind ``deepnmt-attention`` (its arguments and help: :mod:`deepnmt_cli.attention`).
"""

from __future__ import annotations

import os
import sys
from typing import Dict

import torch

from ..analysis import plotting as P


class AttentionError(ValueError):
    pass


def prepare_source(sentence: str, moses_lang=None, bpe_codes=None) -> str:
    line = sentence.strip()
    if moses_lang:
        from sacremoses import MosesTokenizer

        line = MosesTokenizer(lang=moses_lang).tokenize(line, escape=False, return_str=True)
    if bpe_codes:
        from subword_nmt.apply_bpe import BPE

        with open(bpe_codes, encoding="utf-8") as f:
            line = BPE(f).process_line(line)
    return line


def _context_fusion(layer):
    from ..models.context_attention import ContextFusionAttention

    attn = getattr(layer, "encoder_attn", None)
    return attn if isinstance(attn, ContextFusionAttention) else None


@torch.no_grad()
def attention_maps(model, task, src_line: str, target_line=None, beam: int = 4, lenpen: float = 0.6,
                   layer: int = -1, which=("cross",), max_len_a: float = 1.2, max_len_b: int = 10) -> Dict:
    """Translate (or force-decode) one sentence and return the decoder attentions of ``layer``."""
    from ..analysis.models import generation_config, memory_kind

    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    decoder = model.decoder
    n_layers = len(decoder.layers)
    idx = layer if layer >= 0 else n_layers + layer
    if not 0 <= idx < n_layers:
        raise AttentionError(f"--layer {layer}: the decoder has {n_layers} layers")
    dec_layer = decoder.layers[idx]
    if "cross" in which and getattr(dec_layer, "encoder_attn", None) is None:
        raise AttentionError(f"decoder layer {idx + 1} has no cross-attention (built without it, e.g. "
                             f"--cad-drop-ratio 1.0 below the drop depth, or --no-cross-attention)")
    fusion = _context_fusion(dec_layer)
    if "context" in which and fusion is None:
        raise AttentionError(f"the context attention (MSC Eq. 13, ATTN_c over C^n) exists only in MSC models with a "
                             f"context cell; this model has --deep-memory {memory_kind(model)}"
                             + (" with --msc-context-cell none" if memory_kind(model) == "msc" else ""))

    device = next(model.parameters()).device
    src = src_dict.encode_line(src_line, add_if_not_exist=False, append_eos=True).long()
    unknown = [w for w, t in zip(src_line.split(), src.tolist()) if t == src_dict.unk()]
    sample = {"id": torch.tensor([0]), "net_input": {"src_tokens": src[None].to(device),
                                                     "src_lengths": torch.tensor([src.numel()], device=device)}}
    if target_line is None:
        gen = task.build_generator([model], generation_config(beam, lenpen, max_len_a, max_len_b))
        hyp = task.inference_step(gen, [model], sample)[0][0]["tokens"].to(device)
    else:
        hyp = tgt_dict.encode_line(target_line, add_if_not_exist=False, append_eos=True).long().to(device)
    prev = torch.cat([hyp.new_tensor([tgt_dict.eos()]), hyp[:-1]])[None]

    if fusion is not None:
        fusion.record_context_attn, fusion.last_context_attn = True, None
    try:
        enc = model.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"])
        _x, extra = decoder(prev, encoder_out=enc, features_only=True, alignment_layer=idx)
        context = fusion.last_context_attn if fusion is not None else None
    finally:
        if fusion is not None:
            fusion.record_context_attn, fusion.last_context_attn = False, None
    out = {
        "source": src_line, "source_tokens": [src_dict[t] for t in src.tolist()],
        "target_tokens": [tgt_dict[t] for t in hyp.tolist()],
        "translation": tgt_dict.string(hyp), "layer": idx + 1, "decoder_layers": n_layers,
        "deep_memory": memory_kind(model), "forced": target_line is not None, "unknown_source_words": unknown,
    }
    if "cross" in which:
        attn = extra["attn"][0]
        if attn is None:
            raise AttentionError(f"decoder layer {idx + 1} returned no cross-attention weights")
        out["cross"] = attn[0].float().cpu().tolist()
    if "context" in which:
        if context is None:
            raise AttentionError("the context attention was not recorded")
        out["context"] = context[0].float().cpu().tolist()
    return out


def draw(maps: Dict, path: str, title: str) -> str:
    plt = P.pyplot()
    kinds = [k for k in ("cross", "context") if k in maps]
    src, tgt = maps["source_tokens"], maps["target_tokens"]
    w = max(4.0, 0.38 * len(src) + 2.2)
    h = max(3.0, 0.32 * len(tgt) + 1.8)
    fig, axes = plt.subplots(1, len(kinds), figsize=(w * len(kinds), h), squeeze=False)
    names = {"cross": f"cross-attention, decoder layer {maps['layer']}",
             "context": f"context attention (ATTN_c over C^{maps['layer']}), decoder layer {maps['layer']}"}
    for ax, kind in zip(axes[0], kinds):
        im = P.heatmap(ax, maps[kind], tgt, src, cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_xlabel("source")
        ax.set_ylabel("target")
        ax.set_title(names[kind], fontsize="medium")
        fig.colorbar(im, ax=ax, fraction=0.046)
    import textwrap

    width = max(30, int(w * len(kinds) * 11))
    fig.suptitle("\n".join(textwrap.fill(t, width) for t in title.split("\n")), fontsize="medium")
    return P.save(fig, path)


def run(a) -> int:
    """``deepnmt-attention`` (arguments: :mod:`deepnmt_cli.attention`)."""
    from .models import load_model, memory_kind, pick_device

    names = [f"{a.prefix}.png", f"{a.prefix}.json"]
    existing = [n for n in names if os.path.exists(os.path.join(a.out, n))]
    if existing and not a.overwrite:
        raise FileExistsError(f"{a.out} already holds {', '.join(existing)}; use another --out/--prefix "
                              f"or --overwrite")
    model, task, _cfg = load_model(a.path, a.data, pick_device(a.cpu))
    layer = a.layer - 1 if a.layer > 0 else a.layer
    if a.attention == "auto":
        fusion = _context_fusion(model.decoder.layers[layer]) if -len(model.decoder.layers) <= layer < len(
            model.decoder.layers) else None
        which = ("cross", "context") if fusion is not None else ("cross",)
    else:
        which = ("cross", "context") if a.attention == "both" else (a.attention,)
    src_line = prepare_source(a.sentence, a.moses_lang, a.bpe_codes)
    maps = attention_maps(model, task, src_line, a.target, 1 if a.greedy else a.beam, a.lenpen, layer, which)
    P.ensure_dir(a.out)
    P.write_json(os.path.join(a.out, f"{a.prefix}.json"), maps)
    title = f"{os.path.basename(a.path)} (--deep-memory {memory_kind(model)})\n{maps['translation']}"
    png = draw(maps, os.path.join(a.out, f"{a.prefix}.png"), title)
    if maps["unknown_source_words"]:
        print(f"warning: not in the source dictionary (shown as <unk>): {' '.join(maps['unknown_source_words'])}"
              f" - pass --bpe-codes/--moses-lang if the model was trained on BPE'd text", file=sys.stderr)
    print(f"translation: {maps['translation']}")
    print(png)
    return 0
