"""Named architectures: one function per row of the papers' tables.

Each sets defaults with ``getattr``, so command-line flags always win.  The
parameter counts next to the papers' are printed by
``python -m deepnmt_fairseq.cli.param_counts`` and listed in the README.
"""

from __future__ import annotations

from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import base_architecture

from .deep_transformer import MODEL_NAME

# name -> (paper, table row, paper's parameter count in millions or None)
PAPER_ROWS = {}


def _arch(name, paper=None, row=None, params=None):
    def deco(fn):
        PAPER_ROWS[name] = (paper, row, params)
        return register_model_architecture(MODEL_NAME, name)(fn)

    return deco


def _set(args, **defaults):
    for key, value in defaults.items():
        setattr(args, key, getattr(args, key, value))


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def deep_base_architecture(args):
    """Transformer base, pre-norm by default (Wang et al. 2019a, the papers' baseline)."""
    _set(args, encoder_normalize_before=True, decoder_normalize_before=True, deep_memory="top",
         msc_fusion="gate", msc_context_cell="gru", msc_no_encoder_context=False,
         transparent_dropout=0.1, cad_drop_depth=0, cad_drop_ratio=0.0, ssl_rate=0.0,
         ssl_mode="sublayer", ssl_decoder=False, ssl_start_update=0, gp_group_size=1,
         gp_decoder_group_size=1, rpr_max_relative_position=0, rpr_values=False,
         msc_block_layers=None)
    if args.deep_memory == "msc" and getattr(args, "encoder_layers", None) is None:
        spec = args.msc_block_layers
        if spec not in (None, ""):
            sizes = [int(s) for s in str(spec).split(",") if s.strip()]
            n_blocks = getattr(args, "decoder_layers", None) or 6
            args.encoder_layers = sum(sizes) if len(sizes) > 1 else sizes[0] * n_blocks
    base_architecture(args)


# --------------------------------------------------------------------------
# widths
def _iwslt_small(args):
    """``transformer_iwslt`` small: emb 256, FFN 512, 4 heads, shared vocabulary (MSC Sec. 4.1)."""
    _set(args, encoder_embed_dim=256, encoder_ffn_embed_dim=512, encoder_attention_heads=4,
         decoder_embed_dim=256, decoder_ffn_embed_dim=512, decoder_attention_heads=4,
         share_all_embeddings=True, dropout=0.1, attention_dropout=0.1, activation_dropout=0.0)


def _wmt_base(args):
    """Transformer base: 512/2048/8, shared vocabulary (Vaswani et al. 2017)."""
    _set(args, encoder_embed_dim=512, encoder_ffn_embed_dim=2048, encoder_attention_heads=8,
         decoder_embed_dim=512, decoder_ffn_embed_dim=2048, decoder_attention_heads=8,
         share_all_embeddings=True, dropout=0.1)


def _wmt_big(args):
    """Transformer big: 1024/4096/16, shared vocabulary (Vaswani et al. 2017)."""
    _set(args, encoder_embed_dim=1024, encoder_ffn_embed_dim=4096, encoder_attention_heads=16,
         decoder_embed_dim=1024, decoder_ffn_embed_dim=4096, decoder_attention_heads=16,
         share_all_embeddings=True, dropout=0.3)


def _depth(args, enc, dec):
    _set(args, encoder_layers=enc, decoder_layers=dec)


def _msc(args, blocks, per_block):
    _set(args, deep_memory="msc", decoder_layers=blocks, encoder_layers=blocks * per_block,
         msc_block_layers=str(per_block))


def _norm(args, pre):
    _set(args, encoder_normalize_before=pre, decoder_normalize_before=pre)


# --------------------------------------------------------------------------
# MSC, IWSLT small (Wei et al. 2020, Tables 1-3, 5)
MSC = "MSC (Wei et al. 2020)"


def _register_msc_iwslt(layers, per_block, row, params, dropout):
    @_arch(f"msc_iwslt_{layers}l", MSC, row, params)
    def fn(args):
        _set(args, dropout=dropout, attention_dropout=dropout)
        _msc(args, 6, per_block)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


_register_msc_iwslt(6, 1, "Table 2 row 2 (w/ MSC, 6 layers)", 15.6, 0.1)
_register_msc_iwslt(36, 6, "Table 2 row 3 (36 layers, 6x6)", 43.3, 0.3)
_register_msc_iwslt(54, 9, "Table 2 row 4 (54 layers, 6x9)", 60.0, 0.3)
_register_msc_iwslt(72, 12, "Table 2 rows 5-6 (72 layers, 6x12; row 6 adds L2 1e-5)", 76.6, 0.3)


def _register_plain_iwslt(layers, pre, row, params, dropout):
    kind = "prenorm" if pre else "postnorm"

    @_arch(f"{kind}_iwslt_{layers}l", MSC, row, params)
    def fn(args):
        _set(args, dropout=dropout, attention_dropout=dropout)
        _depth(args, layers, 6)
        _norm(args, pre)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


_register_plain_iwslt(6, True, "Table 2 row 1 (small, 6 layers)", 10.5, 0.1)
for _n in (36, 54, 72):
    _register_plain_iwslt(_n, True, f"Table 3 / Fig. 2 (Wang et al. 2019a pre-norm, {_n} layers)", None, 0.3)
for _n in (6, 36, 72):
    _register_plain_iwslt(_n, False, f"Fig. 2 (plain post-norm, {_n} layers)", None, 0.1 if _n == 6 else 0.3)


def _register_transparent_iwslt(layers):
    @_arch(f"transparent_iwslt_{layers}l", MSC, f"Table 3 (Bapna et al. 2018, {layers} layers)", None)
    def fn(args):
        _set(args, deep_memory="transparent", dropout=0.3, attention_dropout=0.3)
        _depth(args, layers, 6)
        _norm(args, False)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


for _n in (36, 72):
    _register_transparent_iwslt(_n)


def _register_msc_wide(layers, per_block):
    @_arch(f"msc_iwslt_wide_{layers}l", MSC, f"Table 5 (MSC {layers} layers, emb 512, ffn 1024)", None)
    def fn(args):
        _set(args, encoder_embed_dim=512, encoder_ffn_embed_dim=1024, decoder_embed_dim=512,
             decoder_ffn_embed_dim=1024, dropout=0.3, attention_dropout=0.3)
        _msc(args, 6, per_block)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


_register_msc_wide(18, 3)
_register_msc_wide(36, 6)


# --------------------------------------------------------------------------
# MSC, WMT14 En-De (Wei et al. 2020, Table 4)
def _register_msc_wmt(size, layers, per_block, row, params):
    width = _wmt_base if size == "base" else _wmt_big

    @_arch(f"msc_wmt_{size}_{layers}l", MSC, row, params)
    def fn(args):
        _msc(args, 6, per_block)
        width(args)
        deep_base_architecture(args)

    return fn


_register_msc_wmt("base", 6, 1, "Table 4 (MSC, 6 layers, base)", 73)
_register_msc_wmt("base", 18, 3, "Table 4 (18-layer encoder, 6x3)", None)
_register_msc_wmt("base", 36, 6, "Table 4 (MSC, 36 layers, base)", 215)
_register_msc_wmt("base", 48, 8, "Table 4 (MSC, 48 layers, base)", 272)
_register_msc_wmt("big", 6, 1, "Table 4 (MSC, 6 layers, big)", 286)
_register_msc_wmt("big", 18, 3, "Table 4 (MSC, 18 layers, big)", 512)


@_arch("prenorm_wmt_base_6l", MSC, "Table 4 (TRANSFORMER base)", 63)
def prenorm_wmt_base_6l(args):
    _depth(args, 6, 6)
    _wmt_base(args)
    deep_base_architecture(args)


@_arch("prenorm_wmt_big_6l", MSC, "Table 4 (TRANSFORMER big)", 211)
def prenorm_wmt_big_6l(args):
    _depth(args, 6, 6)
    _wmt_big(args)
    deep_base_architecture(args)


# --------------------------------------------------------------------------
# Transparent attention (Bapna et al. 2018, Table 1): base with 6/12/16/20
# encoder layers and 6 decoder layers.  The failing baseline is post-norm.
BAPNA = "Transparent (Bapna et al. 2018)"
_BAPNA_PARAMS = {6: 94, 12: 120, 16: 137, 20: 154}


def _register_transparent_wmt(layers):
    @_arch(f"transparent_wmt_base_{layers}l", BAPNA, f"Table 1 (Transparent, {layers} encoder layers)",
           _BAPNA_PARAMS[layers])
    def fn(args):
        _set(args, deep_memory="transparent")
        _depth(args, layers, 6)
        _norm(args, False)
        _wmt_base(args)
        deep_base_architecture(args)

    @_arch(f"postnorm_wmt_base_{layers}l", BAPNA, f"Table 1 (Baseline, {layers} encoder layers)",
           _BAPNA_PARAMS[layers])
    def plain(args):
        _depth(args, layers, 6)
        _norm(args, False)
        _wmt_base(args)
        deep_base_architecture(args)

    return fn, plain


for _n in (6, 12, 16, 20):
    _register_transparent_wmt(_n)


@_arch("postnorm_wmt_big_6l", BAPNA, "Table 1 (Baseline big, 6 layers)", 375)
def postnorm_wmt_big_6l(args):
    _depth(args, 6, 6)
    _norm(args, False)
    _wmt_big(args)
    deep_base_architecture(args)

