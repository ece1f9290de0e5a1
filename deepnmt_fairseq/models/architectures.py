"""Named architectures: one function per row of the papers' tables.

Each sets defaults with ``getattr``, so command-line flags always win.  Every registered name is
written out literally once below (``grep -rn msc_iwslt_36l`` finds its row); ``deepnmt-repro arch
NAME`` prints its settings and the paper row it implements.  The parameter counts next to the
papers' are printed by ``deepnmt-param-counts`` and listed in docs/parameter-counts.md.
"""

from __future__ import annotations

from fairseq.models import register_model_architecture

from .deep_transformer import MODEL_NAME, deep_base_architecture
from .options import set_defaults as _set

# name -> (paper, table row, paper's parameter count in millions or None)
PAPER_ROWS = {}
# (family, *parameters) -> name of the architectures registered in families below, e.g.
# ("dd", "base", 15, 15, True) -> "dd_base_15_15_cad": the experiment registry
# (deepnmt_fairseq.repro.registry) looks names up here instead of rebuilding them.
ARCHS = {}


def _arch(name, paper=None, row=None, params=None, key=None):
    def deco(fn):
        PAPER_ROWS[name] = (paper, row, params)
        if key is not None:
            ARCHS[key] = name
        return register_model_architecture(MODEL_NAME, name)(fn)

    return deco


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
    _set(args, post_norm=not pre)


# --------------------------------------------------------------------------
# MSC, IWSLT small (Wei et al. 2020, Tables 1-3, 5)
MSC = "MSC (Wei et al. 2020)"


def _register_msc_iwslt(name, layers, per_block, row, params, dropout):
    @_arch(name, MSC, row, params, key=("msc_iwslt", layers))
    def fn(args):
        _set(args, dropout=dropout, attention_dropout=dropout)
        _msc(args, 6, per_block)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


_register_msc_iwslt("msc_iwslt_6l", 6, 1, "Table 2 row 2 (w/ MSC, 6 layers)", 15.6, 0.1)
_register_msc_iwslt("msc_iwslt_36l", 36, 6, "Table 2 row 3 (36 layers, 6x6)", 43.3, 0.3)
_register_msc_iwslt("msc_iwslt_54l", 54, 9, "Table 2 row 4 (54 layers, 6x9)", 60.0, 0.3)
_register_msc_iwslt("msc_iwslt_72l", 72, 12, "Table 2 rows 5-6 (72 layers, 6x12; row 6 adds L2 1e-5)", 76.6, 0.3)


def _register_plain_iwslt(name, layers, pre, row, params, dropout):
    kind = "prenorm" if pre else "postnorm"

    @_arch(name, MSC, row, params, key=(f"{kind}_iwslt", layers))
    def fn(args):
        _set(args, dropout=dropout, attention_dropout=dropout)
        _depth(args, layers, 6)
        _norm(args, pre)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


_register_plain_iwslt("prenorm_iwslt_6l", 6, True, "Table 2 row 1 (small, 6 layers)", 10.5, 0.1)
_FIG2_PRE = "Fig. 2 (plain pre-norm nets on MSC's backbone, {} layers)"
_register_plain_iwslt("prenorm_iwslt_36l", 36, True, _FIG2_PRE.format(36), None, 0.3)
_register_plain_iwslt("prenorm_iwslt_54l", 54, True, _FIG2_PRE.format(54), None, 0.3)
_register_plain_iwslt("prenorm_iwslt_72l", 72, True, _FIG2_PRE.format(72), None, 0.3)
_FIG2_POST = "Fig. 2 variant (plain post-norm, {} layers; not the paper's backbone)"
_register_plain_iwslt("postnorm_iwslt_6l", 6, False, _FIG2_POST.format(6), None, 0.1)
_register_plain_iwslt("postnorm_iwslt_36l", 36, False, _FIG2_POST.format(36), None, 0.3)
_register_plain_iwslt("postnorm_iwslt_72l", 72, False, _FIG2_POST.format(72), None, 0.3)


def _register_transparent_iwslt(name, layers, pre):
    """MSC Table 3 implements Bapna et al. "on the same vanilla Transformer backbone" (Sec. 4.2):
    pre-norm.  The post-norm variant (Bapna et al.'s own setting) is its own name."""
    row = (f"Table 3 (Bapna et al. 2018 on the pre-norm backbone, {layers} layers)" if pre else
           f"Table 3 variant (Bapna et al. 2018, post-norm as in their paper, {layers} layers)")

    @_arch(name, MSC, row, None, key=("transparent_iwslt" if pre else "transparent_postnorm_iwslt", layers))
    def fn(args):
        _set(args, deep_memory="transparent", dropout=0.3, attention_dropout=0.3)
        _depth(args, layers, 6)
        _norm(args, pre)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


def _register_dlcl_iwslt(name, layers):
    """MSC Table 3's Wang et al. (2019a): pre-norm DLCL on the same small backbone."""

    @_arch(name, MSC, f"Table 3 (Wang et al. 2019a, DLCL, {layers} layers)", None,
           key=("dlcl_iwslt", layers))
    def fn(args):
        _set(args, deep_memory="dlcl", dropout=0.3, attention_dropout=0.3)
        _depth(args, layers, 6)
        _norm(args, True)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


_register_transparent_iwslt("transparent_iwslt_36l", 36, pre=True)
_register_transparent_iwslt("transparent_postnorm_iwslt_36l", 36, pre=False)
_register_dlcl_iwslt("dlcl_iwslt_36l", 36)
_register_transparent_iwslt("transparent_iwslt_72l", 72, pre=True)
_register_transparent_iwslt("transparent_postnorm_iwslt_72l", 72, pre=False)
_register_dlcl_iwslt("dlcl_iwslt_72l", 72)


def _register_msc_wide(name, layers, per_block):
    @_arch(name, MSC, f"Table 5 (MSC {layers} layers, emb 512, ffn 1024)", None,
           key=("msc_iwslt_wide", layers))
    def fn(args):
        _set(args, encoder_embed_dim=512, encoder_ffn_embed_dim=1024, decoder_embed_dim=512,
             decoder_ffn_embed_dim=1024, dropout=0.3, attention_dropout=0.3)
        _msc(args, 6, per_block)
        _iwslt_small(args)
        deep_base_architecture(args)

    return fn


_register_msc_wide("msc_iwslt_wide_18l", 18, 3)
_register_msc_wide("msc_iwslt_wide_36l", 36, 6)


# --------------------------------------------------------------------------
# MSC Appendix A: abstractive summarization, CNN/DailyMail (Table 6).  "a embedding size of 512
# and FFN layer dimension of 1024 ... maximum length to 768"; 8 heads (the appendix's HIERTRANS
# setting "emb=512, ffn=1024, head=8"); pre-norm backbone, shared vocabulary (joint BPE).
def _cnndm(args):
    _set(args, encoder_embed_dim=512, encoder_ffn_embed_dim=1024, encoder_attention_heads=8,
         decoder_embed_dim=512, decoder_ffn_embed_dim=1024, decoder_attention_heads=8,
         share_all_embeddings=True, dropout=0.1, max_source_positions=768, max_target_positions=768)


@_arch("transformer_cnndm_6l", MSC, "Table 6 (TRANSFORMER, 6-layer encoder)", None, key=("cnndm", "transformer"))
def transformer_cnndm_6l(args):
    _depth(args, 6, 6)
    _cnndm(args)
    deep_base_architecture(args)


@_arch("msc_cnndm_36l", MSC, "Table 6 (MSC, 36-layer encoder, 6x6)", None, key=("cnndm", "msc", 36))
def msc_cnndm_36l(args):
    _msc(args, 6, 6)
    _cnndm(args)
    deep_base_architecture(args)


# --------------------------------------------------------------------------
# MSC, WMT14 En-De (Wei et al. 2020, Table 4)
def _register_msc_wmt(name, size, layers, per_block, row, params):
    width = _wmt_base if size == "base" else _wmt_big

    @_arch(name, MSC, row, params, key=("msc_wmt", size, layers))
    def fn(args):
        _msc(args, 6, per_block)
        width(args)
        deep_base_architecture(args)

    return fn


_register_msc_wmt("msc_wmt_base_6l", "base", 6, 1, "Table 4 (MSC, 6 layers, base)", 73)
_register_msc_wmt("msc_wmt_base_18l", "base", 18, 3, "Table 4 (18-layer encoder, 6x3)", None)
_register_msc_wmt("msc_wmt_base_36l", "base", 36, 6, "Table 4 (MSC, 36 layers, base)", 215)
_register_msc_wmt("msc_wmt_base_48l", "base", 48, 8, "Table 4 (MSC, 48 layers, base)", 272)
_register_msc_wmt("msc_wmt_big_6l", "big", 6, 1, "Table 4 (MSC, 6 layers, big)", 286)
_register_msc_wmt("msc_wmt_big_18l", "big", 18, 3, "Table 4 (MSC, 18 layers, big)", 512)


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


@_arch("dlcl_wmt_base_30l", MSC, "Table 4 (Wang et al. 2019a, DLCL 30-layer base; 137M)", 137,
       key=("dlcl_wmt_base", 30))
def dlcl_wmt_base_30l(args):
    """Wang et al. 2019a's deep model cited by MSC Table 4 and GPKD Table 1: pre-norm base,
    30-layer DLCL encoder, 6-layer decoder."""
    _set(args, deep_memory="dlcl")
    _depth(args, 30, 6)
    _wmt_base(args)
    deep_base_architecture(args)


# --------------------------------------------------------------------------
# Transparent attention (Bapna et al. 2018, Table 1): base with 6/12/16/20
# encoder layers and 6 decoder layers.  The failing baseline is post-norm.
BAPNA = "Transparent (Bapna et al. 2018)"
_BAPNA_PARAMS = {6: 94, 12: 120, 16: 137, 20: 154}


def _chen2018(args, big=False):
    """Bapna et al.'s Transformer: Chen et al. (2018)'s implementation (Sec. 2.2), a shared 32k
    vocabulary (Sec. 2.1) but separate source, target and softmax embeddings (3 x 32k x d); big has
    FFN 8192.  Neither choice is stated in the paper: they are the shapes whose counts are Chen et
    al.'s Transformer Base 93.3M / Big 375.4M, the 94M / 375M of Table 1 (docs/parameter-counts.md)."""
    _set(args, share_all_embeddings=False, share_decoder_input_output_embed=False)
    if big:
        _set(args, encoder_ffn_embed_dim=8192, decoder_ffn_embed_dim=8192)
    (_wmt_big if big else _wmt_base)(args)


def _register_bapna(transparent_name, plain_name, layers, pre=False):
    """Bapna et al. Table 1's transparent model and its plain baseline at one encoder depth.

    The paper does not state the norm placement: "We use the latest version of the Transformer base
    model, using the implementation from (Chen et al., 2018)" (Sec. 2.2).  Post-norm (``pre=False``,
    the registry's reading) is the published Transformer's, under which "the deeper Transformer
    encoders completely fail to train" can reproduce; pre-norm (``pre=True``: tensor2tensor's
    transformer_base_v2 and later normalise each sub-layer's input) trains deep encoders (Wang et
    al. 2019a), so on it the failing baseline may not reproduce: variant rows of the registry."""
    reading = ", pre-norm reading" if pre else ""
    kind = "Table 1 variant" if pre else "Table 1"
    params = None if pre else _BAPNA_PARAMS[layers]
    tr_family = "transparent_prenorm_wmt_base" if pre else "transparent_wmt_base"
    plain_family = "prenorm_chen_wmt_base" if pre else "postnorm_wmt_base"

    @_arch(transparent_name, BAPNA, f"{kind} (Transparent, {layers} encoder layers{reading})", params,
           key=(tr_family, layers))
    def fn(args):
        _set(args, deep_memory="transparent")
        _depth(args, layers, 6)
        _norm(args, pre)
        _chen2018(args)
        deep_base_architecture(args)

    @_arch(plain_name, BAPNA, f"{kind} (Baseline, {layers} encoder layers{reading})", params,
           key=(plain_family, layers))
    def plain(args):
        _depth(args, layers, 6)
        _norm(args, pre)
        _chen2018(args)
        deep_base_architecture(args)

    return fn, plain


_register_bapna("transparent_wmt_base_6l", "postnorm_wmt_base_6l", 6)
_register_bapna("transparent_prenorm_wmt_base_6l", "prenorm_chen_wmt_base_6l", 6, pre=True)
_register_bapna("transparent_wmt_base_12l", "postnorm_wmt_base_12l", 12)
_register_bapna("transparent_prenorm_wmt_base_12l", "prenorm_chen_wmt_base_12l", 12, pre=True)
_register_bapna("transparent_wmt_base_16l", "postnorm_wmt_base_16l", 16)
_register_bapna("transparent_prenorm_wmt_base_16l", "prenorm_chen_wmt_base_16l", 16, pre=True)
_register_bapna("transparent_wmt_base_20l", "postnorm_wmt_base_20l", 20)
_register_bapna("transparent_prenorm_wmt_base_20l", "prenorm_chen_wmt_base_20l", 20, pre=True)


@_arch("postnorm_wmt_big_6l", BAPNA, "Table 1 (Baseline big, 6 layers)", 375)
def postnorm_wmt_big_6l(args):
    _depth(args, 6, 6)
    _norm(args, False)
    _chen2018(args, big=True)
    deep_base_architecture(args)



# --------------------------------------------------------------------------
# Deep decoders: cross-attention drop + collapse-reducing training
# (deep-decoder paper, Tables 1-3, Fig. 2).  WMT14, joint BPE 40k (vocab ~37k).
# "DEEP" rows are plain pre-norm stacks; "_cad" rows add CAD with the defaults
# below and are meant for --criterion collapse_reducing (CRT = DDR + ALD).
DD = "Deep decoder (CAD/CRT)"


def cad_defaults(decoder_layers: int):
    """Drop depth and ratio for a decoder of this depth.

    Fig. 2: a 27-layer decoder peaks at drop depth 21; we keep that fraction
    (21/27) for other depths.  Sec. 4.3: at large drop depths a ratio below 1
    (keeping some cross-attention) is better, so the ratio is 0.5 (the figure's
    exact values are not given in the text).
    """
    return max(1, round(decoder_layers * 21 / 27)), 0.5


def _register_dd(name, size, enc, dec, row, params, cad=False):
    width = _wmt_base if size == "base" else _wmt_big

    @_arch(name, DD, row, params, key=("dd", size, enc, dec, cad))
    def fn(args):
        _depth(args, enc, dec)
        if cad:  # from the decoder depth in use (a --decoder-layers flag wins over the name's)
            depth, ratio = cad_defaults(args.decoder_layers)
            _set(args, cad_drop_depth=depth, cad_drop_ratio=ratio)
        width(args)
        deep_base_architecture(args)

    return fn


_register_dd("dd_base_24_6", "base", 24, 6, "Table 1/2 (DeepE 24-6, base)", 118)
_register_dd("dd_base_48_6", "base", 48, 6, "Table 1 (DeepE 48-6, base)", 194)
_register_dd("dd_base_15_15", "base", 15, 15, "Table 1 (DEEP 15-15, base; DEEP-30L of Table 3)", 123)
_register_dd("dd_base_15_15_cad", "base", 15, 15, "Table 1/2/3 (DEEP+CAD+CRT 15-15, base)", 123, cad=True)
_register_dd("dd_base_27_27", "base", 27, 27, "Table 1 (DEEP 27-27, base; DEEP-54L of Fig. 2)", 199)
_register_dd("dd_base_27_27_cad", "base", 27, 27, "Table 1 (DEEP+CAD+CRT 27-27, base)", 199, cad=True)
_register_dd("dd_base_6_24_cad", "base", 6, 24, "Table 2 (6-24, CAD+CRT)", None, cad=True)
_register_dd("dd_big_24_6", "big", 24, 6, "Table 1 (DeepE 24-6, big)", 437)
_register_dd("dd_big_15_15", "big", 15, 15, "Table 1 (DEEP 15-15, big)", 448)
_register_dd("dd_big_15_15_cad", "big", 15, 15, "Table 1 (DEEP+CAD+CRT 15-15, big)", 448, cad=True)


# --------------------------------------------------------------------------
# GPKD (Li et al. 2021, Tables 1, 2, 6): pre-norm Transformers with relative
# position representations (Shaw et al. 2018, k = 8) in encoder and decoder
# self-attention.  WMT En-De, joint vocabulary ~34k.  GP/SSL are training
# options (--gp-group-size, --ssl-rate), not architectures.
GPKD = "GPKD (Li et al. 2021)"


def _register_rpr(name, size, enc, dec, row, params):
    width = _wmt_base if size == "base" else _wmt_big

    @_arch(name, GPKD, row, params)
    def fn(args):
        _depth(args, enc, dec)
        _set(args, rpr_max_relative_position=8)
        width(args)
        deep_base_architecture(args)

    return fn


_register_rpr("rpr_base_6_6", "base", 6, 6, "Table 1 (Base-RPR-6L; GPKD 6-6 student)", 62)
_register_rpr("rpr_deep_24_6", "base", 24, 6, "Table 1 (Deep-RPR-24L)", 118)
_register_rpr("rpr_deep_48_6", "base", 48, 6, "Table 1/3 (Deep-RPR-48L)", 194)
_register_rpr("rpr_big_6_6", "big", 6, 6, "Table 1 (Big-RPR-6L)", 211)
_register_rpr("rpr_big_12_6", "big", 12, 6, "Table 1 (Big-RPR-12L)", 286)
_register_rpr("desdar_48_3", "base", 48, 3, "Table 2 (DESDAR 48-3)", None)
_register_rpr("desdar_48_1", "base", 48, 1, "Table 2 (DESDAR 48-1)", None)
_register_rpr("gpkd_student_24_3", "base", 24, 3, "Table 6 (GPKD 24-3)", 106)
_register_rpr("gpkd_student_24_1", "base", 24, 1, "Table 6 (GPKD 24-1)", 97)
_register_rpr("gpkd_student_6_3", "base", 6, 3, "Table 6 (GPKD 6-3)", 48)


# --------------------------------------------------------------------------
# The baselines for deep post-norm stacks: DeepNorm (Wang et al. 2022, DeepNet, Table 1:
# WMT-17 En-De, N-layer encoder and N-layer decoder) and Admin (Liu et al. 2020, Very Deep
# Transformers for NMT, arXiv 2008.07772: 60-layer encoder, 12-layer decoder on WMT14 En-De /
# En-Fr).  Both papers' deep rows are Transformer-base wide (512 / 2048 / 8 heads) with a
# shared vocabulary; the residual scaling is an option (--deepnorm / --admin), the names only
# fix the shapes.
DEEPNET = "DeepNet (Wang et al. 2022)"
ADMIN = "Admin (Liu et al. 2020)"


def _register_residual_scaling(option: str, paper: str, name: str, key: tuple, enc: int, dec: int, row: str):
    """A named shape of DeepNet's / Admin's tables with its option (``deepnorm`` or ``admin``) on."""

    @_arch(name, paper, row, None, key=key)
    def fn(args):
        _set(args, **{option: True})
        _depth(args, enc, dec)
        _wmt_base(args)
        deep_base_architecture(args)

    return fn


def _register_deepnorm(name, n):
    _register_residual_scaling("deepnorm", DEEPNET, name, ("deepnorm_wmt_base", n), n, n,
                               f"Table 1 (DeepNet {n}L-{n}L, WMT-17 En-De)")


def _register_admin(name, enc, dec):
    _register_residual_scaling("admin", ADMIN, name, ("admin_wmt_base", enc, dec), enc, dec,
                               f"Table 1 (Admin {enc}L-{dec}L, WMT14 En-De / En-Fr)")


_register_deepnorm("deepnorm_wmt_base_6l", 6)
_register_deepnorm("deepnorm_wmt_base_18l", 18)
_register_deepnorm("deepnorm_wmt_base_50l", 50)
_register_deepnorm("deepnorm_wmt_base_100l", 100)
_register_admin("admin_wmt_base_6_6", 6, 6)
_register_admin("admin_wmt_base_60_12", 60, 12)


# --------------------------------------------------------------------------
# RNMT+ with transparent attention (Bapna et al. 2018, Tables 3-4): registered on
# --arch rnmt_plus in rnmt.py; listed here with the other papers' rows.
from .rnmt import RNMT_ARCHS, RNMT_ROWS  # noqa: E402

PAPER_ROWS.update({name: (BAPNA, row, params) for name, (row, params) in RNMT_ROWS.items()})
ARCHS.update({("rnmt_plus", *key): name for key, name in RNMT_ARCHS.items()})

# HIERTRANS (MSC Appendix A, Table 6's hierarchical baseline): registered on --arch hiertrans in hiertrans.py
from .hiertrans import HIERTRANS_ROWS  # noqa: E402

PAPER_ROWS.update({name: (MSC, row, params) for name, (row, params) in HIERTRANS_ROWS.items()})
ARCHS[("cnndm", "hiertrans", 36)] = "hiertrans_cnndm_36l"
