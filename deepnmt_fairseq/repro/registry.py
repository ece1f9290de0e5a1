"""The experiment registry: one entry per row of the papers' tables.

``EXPERIMENTS`` (name -> :class:`~deepnmt_fairseq.repro.spec.Experiment`) and ``TABLES``
(the papers' tables, rows pointing at experiments).  ``deepnmt-repro`` (and the wrappers
scripts/train.sh, scripts/evaluate.sh) turn an entry into commands:

    deepnmt-repro list [--table KEY]            # names, tables, rows
    deepnmt-repro show NAME                     # settings, notes, commands
    deepnmt-repro train NAME [--dry-run] ...    # every stage (scripts/train.sh NAME)
    deepnmt-repro evaluate NAME ...             # average, decode, score (scripts/evaluate.sh NAME)

Hyper-parameters come from the papers' settings sections; where a paper is silent the
value follows its cited setup (Vaswani et al. 2017, Ott et al. 2018, Wang et al. 2019a)
and a note says so (``show NAME`` prints them; docs/reproduction.md lists them all).

Architecture names, CAD defaults and the papers' parameter counts are the model code's
(:mod:`deepnmt_fairseq.models.architectures`): names are looked up there
(:func:`_arch`), never rebuilt here, and a row's ``params_m`` is the architecture's
paper count (:func:`paper_params`) except where a table reports another number for the
same architecture (:data:`OWN_PARAM_COUNTS` says why).
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

from ..models.architectures import ARCHS, PAPER_ROWS, cad_defaults
from ..models.deep_transformer import MODEL_NAME
from . import figures as FIG
from .spec import (
    EvalSpec,
    Experiment,
    ExtractStage,
    Recipe,
    Ref,
    Row,
    SkdStage,
    Table,
    TrainStage,
    vaswani_lr,
)

MSC = "Wei et al. 2020, Multiscale Collaborative Deep Models for NMT (MSC)"
BAPNA = "Bapna et al. 2018, Training Deeper NMT Models with Transparent Attention"
DD = "What Works and Doesn't Work, A Deep Decoder for NMT (CAD/CRT)"
GPKD = "Li et al. 2021, Learning Light-Weight Translation Models from Deep Transformer (GPKD)"

EXPERIMENTS: Dict[str, Experiment] = {}
TABLES: List[Table] = []

# Rows whose params_m is the table's own number, not the architecture's paper count
# (PAPER_ROWS), and why.  Key: (table key, row label), or (table key, None) for a whole table.
OWN_PARAM_COUNTS: Dict[Tuple[str, object], str] = {
    ("dd-t1-enfr", None): "the En→Fr models' counts (their own 40k En-Fr vocabulary); the architectures carry "
                          "the En→De counts",
    ("dd-t1-ende", "BIG (Pre-Norm) (BIG) 6-6"): "the deep-decoder paper's 210M for the big pre-norm 6-6 model; "
                                                "prenorm_wmt_big_6l carries MSC Table 4's 211M",
}


def _arch(*key) -> str:
    """The registered architecture of a family (architectures.ARCHS), e.g. _arch("dd", "base", 15, 15, True)."""
    try:
        return ARCHS[key]
    except KeyError:
        raise KeyError(f"no named architecture {key} in deepnmt_fairseq.models.architectures.ARCHS") from None


def paper_params(arch: str) -> float:
    """The paper's parameter count (millions) of a named architecture (architectures.PAPER_ROWS)."""
    params = PAPER_ROWS[arch][2]
    if params is None:
        raise ValueError(f"{arch} has no paper parameter count in PAPER_ROWS")
    return params


def exp_params(name: str) -> float:
    """paper_params of the architecture an experiment evaluates."""
    return paper_params(EXPERIMENTS[name].eval_stage.arch)


def _add(exp: Experiment) -> str:
    if exp.name in EXPERIMENTS:
        raise ValueError(f"duplicate experiment name {exp.name}")
    EXPERIMENTS[exp.name] = exp
    return exp.name


def _single(name, paper, dataset, arch, recipe, ev, title, model_flags=(), criterion="label_smoothed_cross_entropy",
            criterion_flags=(), notes=(), init=None, data=None) -> str:
    stage = TrainStage(arch=arch, recipe=recipe, model_flags=tuple(model_flags), criterion=criterion,
                       criterion_flags=tuple(criterion_flags), init=init, data=data)
    return _add(Experiment(name=name, paper=paper, dataset=dataset, stages=(stage,), eval=ev, title=title,
                           notes=tuple(notes)))


# Criterion flag sets -------------------------------------------------------------------
CR = "collapse_reducing"
# MSC Table 2 row 6: L2 on the encoder weights, no DDR/ALD (the criterion's L2 term alone).
L2 = ("--ddr-alpha", "0", "--ald-alpha", "0", "--encoder-l2", "1e-5")
# Deep-decoder Sec. 3.4 CRT = DDR + ALD; the alphas, p_ALD and tau are not in the paper
# (criterion docstring: alpha_DDR 1, alpha_ALD 0.5, p_ALD 0.3 (Fig. 3), tau 0.1 (Fig. 3)).
CRT = ("--ddr-alpha", "1.0", "--ald-alpha", "0.5", "--ald-p", "0.3", "--ald-tau", "0.1")
DDR_ONLY = ("--ddr-alpha", "1.0", "--ald-alpha", "0")
ALD_ONLY = ("--ddr-alpha", "0", "--ald-alpha", "0.5", "--ald-p", "0.3", "--ald-tau", "0.1")

# ======================================================================================
# MSC (Wei et al. 2020)
# ======================================================================================
_VASWANI_NOTES = (
    ("adam_eps", "1e-9 as Vaswani et al. 2017 (not in the paper)"),
    ("clip_norm", "0 = no clipping (Vaswani et al. 2017; not in the paper)"),
    ("weight_decay", "0 (not in the paper)"),
    ("warmup_init_lr", "1e-7, fairseq's usual start of the linear warm-up (not in the paper)"),
    ("max_tokens", "4096 per GPU and forward pass (not in the paper); --update-freq keeps tokens_per_update"),
)


def msc_iwslt_recipe(deep: bool, d_model: int = 256) -> Recipe:
    w = 8000 if deep else 4000
    return Recipe(
        lr=vaswani_lr(d_model, w), warmup_updates=w, max_update=15000,
        tokens_per_update=32768 if deep else 16384, adam_betas="(0.9, 0.98)", save="epoch", keep=10,
        notes=(("lr", f"peak of Vaswani's schedule d^-0.5*w^-0.5 (d={d_model}, w={w}); MSC Sec. 4.1: "
                      "'adaptive learning rate schedule ... as in (Vaswani et al., 2017)', warm-up 4K shallow / 8K deep"),
               ("tokens_per_update", "Sec. 4.1: 16K~32K tokens per batch; our split: 16K for 6-layer, 32K for "
                                     "the deep models (the paper uses larger batches for deeper models)"),
               ("max_update", "15K steps for small models (Sec. 4.1)"),
               ("save", "not in the paper for IWSLT: one checkpoint per epoch, last 5 averaged (its WMT base setting)"),
               ) + _VASWANI_NOTES,
    )


IWSLT_EVAL = EvalSpec(
    beam=5, lenpen=1.0, average=5, primary="tok_bleu_lc", batch_size=32, lowercase=True,
    notes=("Sec. 4.1: beam 5, length penalty 1.0; tokenized case-insensitive BLEU (multi-bleu.perl -lc)",
           "batch 32 with beam 5 is Table 2's decoding-speed setting (tokens/s)",
           "averaging the last 5 epoch checkpoints is our choice (the paper states averaging only for WMT)"),
)

MSC_WMT_BASE = Recipe(
    lr=vaswani_lr(512, 8000), warmup_updates=8000, max_update=100000, tokens_per_update=65536,
    adam_betas="(0.9, 0.98)", save="epoch", keep=10,
    notes=(("lr", "peak of Vaswani's schedule d^-0.5*w^-0.5 (d=512, w=8K warm-up, Sec. 4.1)"),
           ("tokens_per_update", "65K tokens per update (Sec. 4.1, following Ott et al. 2018: 8 GPUs x 8 accumulated steps)"),
           ("max_update", "100K steps for base (Sec. 4.1)"),
           ("dropout", "0.1 (Vaswani base); Sec. 4.1 uses 'relatively larger ... dropout for deeper models' without values"),
           ) + _VASWANI_NOTES,
)
MSC_WMT_BIG = MSC_WMT_BASE.with_(
    lr=vaswani_lr(1024, 16000), warmup_updates=16000, max_update=300000, adam_betas="(0.9, 0.998)", keep=25,
    notes=(("lr (big)", "d=1024, w=16K warm-up, Adam beta2 0.998 (Sec. 4.1)"),
           ("max_update (big)", "300K steps for big (Sec. 4.1)"),
           ("dropout (big)", "0.3 (Vaswani big En-De)")),
)


def wmt_ende_eval(average: int, batch_size: int = 128, extra_notes=(), compound_split: bool = False) -> EvalSpec:
    """WMT14 En-De decoding and scoring.  The headline is the metric the paper states: tokenized
    case-sensitive BLEU (multi-bleu.perl), with compound splitting only for a paper that says so
    (GPKD); the other one and detokenized sacreBLEU are printed beside it."""
    metric = ("tokenized case-sensitive BLEU with compound splitting (##AT##-##AT##), as the paper states"
              if compound_split else
              "tokenized case-sensitive BLEU (multi-bleu.perl) as the paper states; it does not mention compound "
              "splitting, so compound-split BLEU is printed beside it, not instead of it")
    return EvalSpec(
        beam=4, lenpen=0.6, average=average, primary="tok_bleu_compound_split" if compound_split else "tok_bleu",
        batch_size=batch_size,
        notes=("beam 4, length penalty 0.6", metric, "detokenized sacreBLEU is reported next to it")
        + tuple(extra_notes),
    )


# MSC Sec. 4.1: "report tokenized case-sensitive BLEU ... for WMT14 En->De"; "We use multi-bleu.perl"
MSC_WMT_EVAL_BASE = wmt_ende_eval(5, extra_notes=("last 5 epoch checkpoints averaged (Sec. 4.1)",))
MSC_WMT_EVAL_BIG = wmt_ende_eval(20, extra_notes=("last 20 epoch checkpoints averaged (Sec. 4.1)",))

_MSC_DIRS = {"ende": "iwslt14-en-de", "deen": "iwslt14-de-en", "enfr": "iwslt17-en-fr"}
_MSC_T2 = {  # row -> (label, arch, deep, L2, {direction: BLEU}, train h / tokens/s); params: the arch's
    1: ("small, 6 layers, dp 0.1", _arch("prenorm_iwslt", 6), False, False, {"ende": 27.23, "deen": 32.73, "enfr": 41.19}, (17, 1800)),
    2: ("w/ MSC (6 layers)", _arch("msc_iwslt", 6), False, False, {"ende": 27.49, "deen": 33.10, "enfr": 41.53}, (17, 1736)),
    3: ("MSC, 36 layers, dp 0.3", _arch("msc_iwslt", 36), True, False, {"ende": 29.04, "deen": 34.86, "enfr": 42.90}, (23, 1498)),
    4: ("w/ 54 layers", _arch("msc_iwslt", 54), True, False, {"ende": 29.32, "deen": 35.16, "enfr": 43.62}, (27, 1412)),
    5: ("w/ 72 layers", _arch("msc_iwslt", 72), True, False, {"ende": "- (overfits)", "deen": "- (overfits)", "enfr": "- (overfits)"}, None),
    6: ("w/ 72 layers, L2 1e-5", _arch("msc_iwslt", 72), True, True, {"ende": 29.67, "deen": 35.81, "enfr": 44.15}, (30, 1340)),
}
_MSC_T2_NAMES = {1: "plain-6L", 2: "6L", 3: "36L", 4: "54L", 5: "72L", 6: "72L-l2"}


def _msc_name(direction: str, variant: str) -> str:
    corpus = "iwslt17" if direction == "enfr" else "iwslt14"
    return f"msc-{corpus}-{direction}-{variant}"


_msc_t2_rows = []
for _row, (_label, _a, _deep, _l2, _bleu, _speed) in _MSC_T2.items():
    for _dir, _ds in _MSC_DIRS.items():
        _name = _msc_name(_dir, _MSC_T2_NAMES[_row])
        _notes = ["Table 2 row 5 is not reported (overfits); the command exists to show it"] if _row == 5 else []
        if _l2:
            _notes.append("L2 1e-5 on the encoder weight matrices as a loss term (criterion collapse_reducing with "
                          "DDR/ALD off); the paper does not say which weights, we exclude biases, norms, embeddings")
        _single(_name, MSC, _ds, _a, msc_iwslt_recipe(_deep), IWSLT_EVAL,
                f"MSC Table 2 row {_row}: {_label} ({_ds})",
                criterion=CR if _l2 else "label_smoothed_cross_entropy", criterion_flags=L2 if _l2 else (),
                notes=_notes)
        paper = {"bleu": _bleu[_dir], "params_m": paper_params(_a)}
        if _speed and _dir == "ende":
            paper.update(train_hours=_speed[0], tokens_per_s=_speed[1])
        _msc_t2_rows.append(Row(f"{_row}. {_label} — {_ds}", _name, paper,
                                "ΔTrain/ΔDec of the paper are attached to the En→De rows (the paper does not say which "
                                "direction they were measured on)" if _speed and _dir == "ende" else ""))
TABLES.append(Table("msc-t2", MSC, "Table 2: IWSLT14 En↔De, IWSLT17 En→Fr (tokenized, case-insensitive BLEU)",
                    tuple(_msc_t2_rows)))

# Table 3: existing methods on the same backbone (IWSLT14 En->De)
_SAME_BACKBONE = ("'we implement existing methods (Bapna et al., 2018; Wang et al., 2019a) on the same vanilla "
                  "Transformer backbone' (MSC Sec. 4.2): the pre-norm small model of Table 2",)
_L2_SAME = ("'same model settings' as MSC-72 (Sec. 4.2): we keep its L2 1e-5 (our reading)",)
for _n, _l2 in ((36, False), (72, True)):
    _sfx = f"{_n}L" + ("-l2" if _l2 else "")
    _kw = dict(criterion=CR, criterion_flags=L2) if _l2 else {}
    _single(f"msc-iwslt14-ende-bapna-{_sfx}", MSC, "iwslt14-en-de", _arch("transparent_iwslt", _n),
            msc_iwslt_recipe(True), IWSLT_EVAL, f"MSC Table 3: Bapna et al. (2018) transparent attention, {_n} layers",
            notes=_SAME_BACKBONE + (_L2_SAME if _l2 else ()), **_kw)
    _single(f"msc-iwslt14-ende-bapna-postnorm-{_sfx}", MSC, "iwslt14-en-de", _arch("transparent_postnorm_iwslt", _n),
            msc_iwslt_recipe(True), IWSLT_EVAL,
            f"MSC Table 3 variant: Bapna et al. (2018) on post-norm layers (their own setting), {_n} layers",
            notes=("not the paper's row: MSC ran Bapna et al. on the pre-norm backbone",) + (_L2_SAME if _l2 else ()),
            **_kw)
    _single(f"msc-iwslt14-ende-wang-{_sfx}", MSC, "iwslt14-en-de", _arch("dlcl_iwslt", _n), msc_iwslt_recipe(True),
            IWSLT_EVAL, f"MSC Table 3: Wang et al. (2019a), pre-norm DLCL, {_n} layers",
            notes=_SAME_BACKBONE + (_L2_SAME if _l2 else ()), **_kw)
TABLES.append(Table("msc-t3", MSC, "Table 3: existing deep methods on the same backbone, IWSLT14 En→De", (
    Row("small, 36 layers — Bapna et al. (2018)", "msc-iwslt14-ende-bapna-36L", {"bleu": 28.09}),
    Row("small, 36 layers — Wang et al. (2019a)", "msc-iwslt14-ende-wang-36L", {"bleu": 28.63}, "pre-norm DLCL"),
    Row("small, 36 layers — MSC", "msc-iwslt14-ende-36L", {"bleu": 29.04}),
    Row("small, 72 layers — Bapna et al. (2018)", "msc-iwslt14-ende-bapna-72L-l2", {"bleu": "failed"}),
    Row("small, 72 layers — Wang et al. (2019a)", "msc-iwslt14-ende-wang-72L-l2", {"bleu": 28.34}, "pre-norm DLCL"),
    Row("small, 72 layers — MSC", "msc-iwslt14-ende-72L-l2", {"bleu": 29.67}),
    Row("variant (not in the paper): 36 layers — Bapna et al. on post-norm layers", "msc-iwslt14-ende-bapna-postnorm-36L",
        {"bleu": "-"}, "Bapna et al.'s own backbone; MSC ran them on pre-norm"),
    Row("variant (not in the paper): 72 layers — Bapna et al. on post-norm layers",
        "msc-iwslt14-ende-bapna-postnorm-72L-l2", {"bleu": "-"}, "Bapna et al.'s own backbone; MSC ran them on pre-norm"),
)))

# Table 4: WMT14 En->De
_MSC_T4 = [  # label, experiment, arch, big, BLEU; params: the arch's
    ("TRANSFORMER (base)", "msc-wmt14-ende-transformer-base", "prenorm_wmt_base_6l", False, 27.44),
    ("MSC, 6 layers (base)", "msc-wmt14-ende-base-6L", _arch("msc_wmt", "base", 6), False, 27.68),
    ("MSC, 36 layers (base)", "msc-wmt14-ende-base-36L", _arch("msc_wmt", "base", 36), False, 29.71),
    ("MSC, 48 layers (base)", "msc-wmt14-ende-base-48L", _arch("msc_wmt", "base", 48), False, 30.19),
    ("TRANSFORMER (big)", "msc-wmt14-ende-transformer-big", "prenorm_wmt_big_6l", True, 28.86),
    ("MSC, 6 layers (big)", "msc-wmt14-ende-big-6L", _arch("msc_wmt", "big", 6), True, 29.17),
    ("MSC, 18 layers (big)", "msc-wmt14-ende-big-18L", _arch("msc_wmt", "big", 18), True, 30.56),
]
_t4_rows = [
    Row("Vaswani et al. (2017)", None, {"bleu": 28.4, "params_m": 213}, "cited; see dd-wmt14-ende-big-6-6 for a big baseline"),
    Row("Bapna et al. (2018)", "transparent-wmt14-ende-16L", {"bleu": 28.0, "params_m": paper_params(_arch("transparent_wmt_base", 16))},
        "cited; the transparent-attention reproduction (Bapna Table 1, 16 layers) is the closest run"),
    Row("Dou et al. (2018)", None, {"bleu": 29.2, "params_m": 356}, "cited; not implemented in this plugin"),
    Row("He et al. (2018)", None, {"bleu": 29.0, "params_m": "210 (est.)"}, "cited; not implemented"),
    Row("Wang et al. (2019a)", "msc-wmt14-ende-dlcl-30L", {"bleu": 29.3, "params_m": paper_params(_arch("dlcl_wmt_base", 30))},
        "cited result; the run is our pre-norm DLCL 30-6 base on MSC's recipe"),
    Row("Zhang et al. (2019a)", None, {"bleu": 29.62, "params_m": 560}, "cited; not implemented"),
    Row("Wu et al. (2019)", None, {"bleu": 29.9, "params_m": "268 (est.)"}, "cited; not implemented"),
]
for _label, _name, _a, _big, _bleu in _MSC_T4:
    _single(_name, MSC, "wmt14-en-de", _a, MSC_WMT_BIG if _big else MSC_WMT_BASE,
            MSC_WMT_EVAL_BIG if _big else MSC_WMT_EVAL_BASE, f"MSC Table 4: {_label}",
            notes=("encoders: 18 = 6x3, 36 = 6x6, 48 = 6x8 layers (Sec. 4.2)",))
    _t4_rows.append(Row(_label, _name, {"bleu": _bleu, "params_m": paper_params(_a)}))
_single("msc-wmt14-ende-dlcl-30L", MSC, "wmt14-en-de", _arch("dlcl_wmt_base", 30), MSC_WMT_BASE, MSC_WMT_EVAL_BASE,
        "MSC Table 4: Wang et al. (2019a), pre-norm DLCL, 30-layer encoder (base)",
        notes=("MSC cites Wang et al.'s published 29.3 (their own schedule); we train it on MSC's base recipe",))
TABLES.append(Table("msc-t4", MSC, "Table 4: WMT14 En→De (tokenized case-sensitive BLEU)", tuple(_t4_rows)))

# Table 5: ablations (IWSLT14 En->De, 72 layers with L2)
_MSC_T5 = [
    ("- feature fusion with addition", "msc-iwslt14-ende-72L-l2-add", _arch("msc_iwslt", 72), ("--msc-fusion", "add"), True, 29.45),
    ("- implement Q (Eq. 9) as FFN", "msc-iwslt14-ende-72L-l2-ffncell", _arch("msc_iwslt", 72), ("--msc-context-cell", "ffn"), True, 29.17),
    ("- remove CXT-ENC attention", "msc-iwslt14-ende-72L-l2-nocxtenc", _arch("msc_iwslt", 72), ("--msc-no-encoder-context",), True, 28.99),
    ("- remove contextual collaboration", "msc-iwslt14-ende-72L-l2-nocontext", _arch("msc_iwslt", 72), ("--msc-context-cell", "none"), True, 28.94),
    ("MSC, 18 layers (emb 512, ffn 1024)", "msc-iwslt14-ende-wide-18L", _arch("msc_iwslt_wide", 18), (), False, 29.08),
    ("MSC, 36 layers (emb 512, ffn 1024)", "msc-iwslt14-ende-wide-36L", _arch("msc_iwslt_wide", 36), (), False, 29.41),
]
_t5_rows = [Row("MSC, 72 layers", "msc-iwslt14-ende-72L-l2", {"bleu": 29.67})]
for _label, _name, _a, _flags, _l2, _bleu in _MSC_T5:
    _wide = "wide" in _name
    _single(_name, MSC, "iwslt14-en-de", _a, msc_iwslt_recipe(True, 512 if _wide else 256), IWSLT_EVAL,
            f"MSC Table 5: {_label}", model_flags=_flags, criterion=CR if _l2 else "label_smoothed_cross_entropy",
            criterion_flags=L2 if _l2 else (),
            notes=(("each ablation changes one component of the 72-layer L2 model (row 6); the paper's "
                    "'additionally' is read as relative to the full model (29.67 - 0.5 = 29.17)",) if _l2 else
                   ("no L2: the paper applies it only to 72-layer encoders", "lr uses d=512 in Vaswani's formula")))
    _t5_rows.append(Row(_label, _name, {"bleu": _bleu}))
TABLES.append(Table("msc-t5", MSC, "Table 5: ablation study, IWSLT14 En→De", tuple(_t5_rows)))

# Fig. 2: degradation of plain stacks "on the same Transformer backbone as well as model settings" (pre-norm);
# the post-norm stacks stay available as their own experiments
_FIG2_NOTE = ("Fig. 2 plots training/validation BLEU on 3K training pairs; evaluate.sh scores the test set",)
for _n in (36, 72):
    _single(f"msc-iwslt14-ende-plain-{_n}L", MSC, "iwslt14-en-de", _arch("prenorm_iwslt", _n),
            msc_iwslt_recipe(True), IWSLT_EVAL, f"MSC Fig. 2: plain pre-norm {_n}-layer stack (degradation)",
            notes=_FIG2_NOTE)
    _single(f"msc-iwslt14-ende-plain-postnorm-{_n}L", MSC, "iwslt14-en-de", _arch("postnorm_iwslt", _n),
            msc_iwslt_recipe(True), IWSLT_EVAL, f"MSC Fig. 2 variant: plain post-norm {_n}-layer stack",
            notes=_FIG2_NOTE + ("not the paper's backbone (pre-norm); kept as its own row",))
TABLES.append(Table("msc-fig2", MSC, "Figure 2: plain vs MSC nets (degradation), IWSLT14 En→De", (
    Row("plain, 36 layers", "msc-iwslt14-ende-plain-36L", {"bleu": "fig."}),
    Row("plain, 72 layers", "msc-iwslt14-ende-plain-72L", {"bleu": "fig."}),
    Row("variant (not in the paper): plain post-norm, 36 layers", "msc-iwslt14-ende-plain-postnorm-36L", {"bleu": "-"}),
    Row("variant (not in the paper): plain post-norm, 72 layers", "msc-iwslt14-ende-plain-postnorm-72L", {"bleu": "-"}),
    Row("MSC, 36 layers", "msc-iwslt14-ende-36L", {"bleu": "fig."}),
    Row("MSC, 72 layers", "msc-iwslt14-ende-72L-l2", {"bleu": "fig."}),
), note="The figure's numbers are not given in the text."))

# MSC Appendix A (Table 6): abstractive summarization on CNN/DailyMail ---------------------------
MSC_CNNDM = Recipe(
    lr=vaswani_lr(512, 8000), warmup_updates=8000, max_update=0, tokens_per_update=32 * 768,
    adam_betas="(0.9, 0.98)", label_smoothing=0.1, save="epoch", keep=5,
    notes=(("epochs", "Appendix A: 30 epochs (--max-epoch 30; --max-update 0 = no update limit)"),
           ("label_smoothing", "Appendix A: 0.1"),
           ("tokens_per_update", "Appendix A: 'batch size to 32, and maximum length to 768': 32 x 768 tokens per "
                                 "update (fairseq batches by tokens; the GPU-count logic keeps that number)"),
           ("lr", "not in the appendix: the Vaswani schedule of MSC Sec. 4.1 with d = 512 and its deep-model "
                  "warm-up (8K)"),
           ("max_positions", "Appendix A: maximum length 768 (--max-source/target-positions 768); documents are "
                             "truncated to 640 BPE tokens by scripts/prepare_data.py cnndm"),
           ("keep", "not in the appendix: the last 5 epoch checkpoints are kept, the last one is evaluated"),
           ) + _VASWANI_NOTES,
)
CNNDM_EVAL = EvalSpec(
    beam=5, lenpen=1.0, average=1, primary="rougeL", batch_size=32, no_repeat_ngram_size=3,
    max_len_b=(60, 80, 100, 120, 140),
    notes=("Appendix A: beam 5; 'We remove duplicated trigrams in beam search' = --no-repeat-ngram-size 3",
           "Appendix A: 'tweak the maximum summary length on the development set': --max-len-a 0 --max-len-b L for "
           "L in 60..140 BPE tokens on valid, best mean ROUGE-1/2/L F1 decodes test (the grid is ours)",
           "ROUGE-1/2/L F1 from rouge-score (stemming; ROUGE-L summary-level over <q>-split sentences); settings "
           "are written beside each score (deepnmt_fairseq/repro/summarization.py)",
           "not in the appendix: length penalty 1.0, no checkpoint averaging (checkpoint_last.pt)"),
)
_CNNDM_FLAGS = ("--max-epoch", "30", "--max-source-positions", "768", "--max-target-positions", "768")
_single("msc-cnndm-transformer", MSC, "cnndm", _arch("cnndm", "transformer"), MSC_CNNDM, CNNDM_EVAL,
        "MSC Table 6: TRANSFORMER (6-layer encoder), CNN/DailyMail", model_flags=_CNNDM_FLAGS)
_single("msc-cnndm-36L", MSC, "cnndm", _arch("cnndm", "msc", 36), MSC_CNNDM, CNNDM_EVAL,
        "MSC Table 6: MSC (36-layer encoder, 6x6), CNN/DailyMail", model_flags=_CNNDM_FLAGS)
_CITED6 = "cited (another system; not reproduced here)"
TABLES.append(Table("msc-t6", MSC, "Table 6: CNN/DailyMail summarization (ROUGE-1/2/L F1)", (
    Row("Lead3 (extractive)", None, {"rouge1": 40.38, "rouge2": 17.61, "rougeL": 36.59}, _CITED6),
    Row("HIBERT_M (extractive)", None, {"rouge1": 42.37, "rouge2": 19.95, "rougeL": 38.83}, _CITED6),
    Row("Liu (2019) (extractive)", None, {"rouge1": 43.25, "rouge2": 20.24, "rougeL": 39.63}, _CITED6),
    Row("PGNet", None, {"rouge1": 39.53, "rouge2": 17.28, "rougeL": 36.38}, _CITED6),
    Row("Bottom-Up", None, {"rouge1": 41.22, "rouge2": 18.68, "rougeL": 38.34}, _CITED6),
    Row("S2S-ELMo", None, {"rouge1": 41.56, "rouge2": 18.94, "rougeL": 38.47}, _CITED6),
    Row("TRANSFORMER", "msc-cnndm-transformer", {"rouge1": 40.28, "rouge2": 17.87, "rougeL": 37.25}),
    Row("HIERTRANS (36 L)", None, {"rouge1": 41.22, "rouge2": 18.97, "rougeL": 38.45},
        "the paper's own hierarchical baseline (sentence- and document-level encoders); not implemented here"),
    Row("MSC (36 L)", "msc-cnndm-36L", {"rouge1": 41.96, "rouge2": 19.50, "rougeL": 39.07}),
), note="Data: scripts/prepare_data.py cnndm (See et al.'s splits, archives via --from-dir). ROUGE-L is the "
        "summary-level rougeLsum; the scorer's settings are in each results.json (rouge_settings)."))

# ======================================================================================
# Transparent attention (Bapna et al. 2018)
# ======================================================================================
BAPNA_BASE = Recipe(
    lr=vaswani_lr(512, 40000, 3.0), warmup_updates=40000, max_update=100000, tokens_per_update=32768,
    adam_betas="(0.9, 0.98)", save="updates:1000", keep=21,
    notes=(("lr", "Sec. 2.2: 'learning rate of 3.0 and 40,000 warmup steps' = 3.0 * d^-0.5 * w^-0.5 at the "
                  "peak of the Vaswani/Chen et al. (2018) schedule (d=512)"),
           ("tokens_per_update", "not in the paper (8 P100 GPUs, synchronous): 8 x 4096 tokens, close to "
                                 "Vaswani's ~25k source + 25k target tokens"),
           ("max_update", "not in the paper: 100K, Vaswani's base schedule"),
           ("save", "checkpoint every 1000 updates; the score is the mean over a window of 21 checkpoints "
                    "(Sec. 2.1, following Chen et al. 2018): the last 21"),
           ("adam_betas", "(0.9, 0.98) as Vaswani (the paper says Adam only)"),
           ) + _VASWANI_NOTES,
)
BAPNA_BIG = BAPNA_BASE.with_(lr=vaswani_lr(1024, 40000, 3.0), max_update=300000,
                             notes=(("big", "Transformer Big baseline: d=1024 in the schedule, 300K updates "
                                            "(Vaswani big; not in the paper)"),))
BAPNA_EVAL = EvalSpec(
    beam=4, lenpen=0.6, average=21, mode="mean", primary="tok_bleu",
    notes=("Sec. 2.1: BLEU on tokenized, true-case output (no compound splitting), mean over a window of 21 "
           "post-convergence checkpoints (we take the last 21, each decoded on its own)",
           "beam 4, length penalty 0.6 (Vaswani; not in the paper)"),
)
for _pair, _ds, _tab, _vals in (
    ("wmt14-ende", "wmt14-en-de", "bapna-t1",
     {"base": [27.26, "failed", "failed", "failed"], "big": 27.94, "tr": [27.52, 27.79, 28.04, 27.96],
      "nores": ["failed", 6.00, "failed", "failed"]}),
    ("wmt15-csen", "wmt15-cs-en", "bapna-t2",
     {"base": [27.20, "failed", "failed", "failed"], "big": 27.76, "tr": [27.41, 27.69, 27.93, 27.80],
      "nores": [25.83, "failed", "failed", "failed"]}),
):
    _rows = []
    _data_note = ("dataset wmt14-en-de (32k BPE); the paper validates on newstest2012+2013, ours on newstest2013 "
                  "(validation only picks checkpoint_best, which is not used)" if _ds == "wmt14-en-de" else
                  "WMT15 Cs->En, shared 32k subwords, valid newstest2013, test newstest2015 (Sec. 2.1)")
    for _i, _n in enumerate((6, 12, 16, 20)):
        _a = _arch("postnorm_wmt_base", _n)
        _b = _single(f"transparent-{_pair}-baseline-{_n}L", BAPNA, _ds, _a, BAPNA_BASE,
                     BAPNA_EVAL, f"Bapna Table {_tab[-1]}: Transformer base baseline, {_n} encoder layers",
                     notes=(_data_note, "baseline = post-norm Transformer (the deep ones 'fail to train')"))
        _rows.append(Row(f"Baseline, {_n} encoder layers", _b, {"bleu": _vals["base"][_i], "params_m": paper_params(_a)}))
    for _i, _n in enumerate((6, 12, 16, 20)):
        _nr = _single(f"transparent-{_pair}-baseline-nores-{_n}L", BAPNA, _ds, _arch("postnorm_wmt_base", _n), BAPNA_BASE,
                      BAPNA_EVAL, f"Bapna Table {_tab[-1]}: baseline without encoder residuals, {_n} encoder layers",
                      model_flags=("--no-encoder-residual",),
                      notes=(_data_note, "--no-encoder-residual removes the encoder layers' residual connections"))
        _rows.append(Row(f"Baseline - residuals, {_n} encoder layers", _nr, {"bleu": _vals["nores"][_i]}))
    for _i, _n in enumerate((6, 12, 16, 20)):
        _a = _arch("transparent_wmt_base", _n)
        _t = _single(f"transparent-{_pair}-{_n}L", BAPNA, _ds, _a, BAPNA_BASE, BAPNA_EVAL,
                     f"Bapna Table {_tab[-1]}: transparent attention, {_n} encoder layers",
                     notes=(_data_note, "transparent_dropout 0.1 on W (the paper gives no value)"))
        _rows.append(Row(f"Transparent, {_n} encoder layers", _t, {"bleu": _vals["tr"][_i], "params_m": paper_params(_a)}))
    _big = _single(f"transparent-{_pair}-baseline-big-6L", BAPNA, _ds, "postnorm_wmt_big_6l", BAPNA_BIG, BAPNA_EVAL,
                   f"Bapna Table {_tab[-1]}: Transformer Big baseline, 6 layers", notes=(_data_note,))
    _rows.append(Row("Baseline (Big), 6 encoder layers", _big, {"bleu": _vals["big"], "params_m": exp_params(_big)}))
    TABLES.append(Table(_tab, BAPNA, f"Table {_tab[-1]}: {'WMT14 En→De newstest2014' if _ds == 'wmt14-en-de' else 'WMT15 Cs→En newstest2015'} "
                        "(tokenized true-case BLEU; '*' = failed to train)", tuple(_rows),
                        note="Chen et al. (2018)'s Transformer as Bapna et al. count it: one shared 32k vocabulary, "
                             "separate source/target/softmax embeddings (6 layers 93.3M vs 94M, big with FFN 8192 "
                             "375.4M vs 375M); the 12-20-layer rows imply ~4.3M per added encoder layer, which no "
                             "Transformer-base layer has (ours 3.15M: -6.5/-8.9/-10.8%, docs/parameter-counts.md)."))

# --------------------------------------------------------------------------------------
# RNMT+ with transparent attention (Bapna et al. 2018, Tables 3-4)
# --------------------------------------------------------------------------------------
def chen_schedule(replicas: int = 8, base_lr: float = 1e-4, warmup: int = 500, decay_start: int = 400000,
                  decay_end: int = 1200000, lr_min: float = 0.5) -> dict:
    """Chen et al. (2018) Sec. 4.1: lr = base * min(1 + t(n-1)/(np), n, n(2n)^((s-nt)/(e-s))), floored at
    ``lr_min * base`` (the authors' ``LinearRampupExponentialDecayScaledByNumSplitSchedule``): linear warm-up
    from base to n*base over n*p updates, constant until s/n, exponential decay to lr_min*base at e/n.
    fairseq's ``tri_stage`` scheduler is exactly that (warm-up from init_lr_scale*lr, hold, exponential decay
    to final_lr_scale*lr, then constant)."""
    peak = replicas * base_lr
    w, s, e = replicas * warmup, decay_start // replicas, decay_end // replicas
    flags = ("--warmup-steps", str(w), "--hold-steps", str(s - w), "--decay-steps", str(e - s),
             "--init-lr-scale", f"{1 / replicas:g}", "--final-lr-scale", f"{lr_min / replicas:g}")
    return dict(lr=peak, warmup_updates=w, lr_scheduler="tri_stage", scheduler_flags=flags)


RNMT_BASE = Recipe(
    **chen_schedule(), max_update=200000, tokens_per_update=32768, adam_betas="(0.9, 0.98)", adam_eps=1e-6,
    save="updates:1000", keep=21,
    notes=(("lr", "Chen et al. (2018) Sec. 4.1 schedule with n = 8 replicas (Bapna Sec. 2.2: 'eight P100 GPUs "
                  "with synchronous training') and the authors' En-De constants (lingvo WmtEnDeRNMT: base 1e-4, "
                  "p = 500, s = 400k, e = 1.2M, floor 0.5): warm-up 4000 updates 1e-4 -> 8e-4, hold to 50k, "
                  "exponential decay to 5e-5 at 150k (fairseq tri_stage)"),
           ("adam", "Adam beta2 0.98, eps 1e-6 (lingvo WmtEnDeRNMT; Bapna: 'optimized using Adam')"),
           ("max_update", "not in the papers: 200k, 50k updates past the end of the decay; the score is the "
                          "mean over the last 21 checkpoints (every 1000 updates), as for the Transformer rows"),
           ("tokens_per_update", "not in the papers: 8 x 4096 tokens, close to lingvo's 8 replicas x 128 "
                                 "sentences"),
           ("l2", "not reproduced: lingvo adds an L2 loss of 1e-5 on the weights; fairseq's Adam weight decay "
                  "is decoupled (AdamW), a different regulariser, so it stays 0"),
           ("clip_norm", "0: the authors' configuration does not clip the gradient norm"),
           ("dropout", "0.3 on embeddings, LSTM outputs and attention, label smoothing 0.1 (Chen et al. Sec. 4.1 "
                       "with the authors' En-De values; --arch rnmt_plus defaults)")),
)
RNMT_EVAL = BAPNA_EVAL
for _pair, _ds, _tab, _vals in (
    ("wmt14-ende", "wmt14-en-de", "bapna-t3",
     {"baseline": [26.63, 26.32, 26.49, 26.33], "big": 28.49, "transparent": [26.61, 26.87, 27.07, 27.33],
      "nores": [26.37, "failed", "failed", "failed"]}),
    ("wmt15-csen", "wmt15-cs-en", "bapna-t4",
     {"baseline": [25.77, 25.86, 26.02, 25.75], "big": 26.66, "transparent": [26.69, 26.74, 26.79, 26.72],
      "nores": [25.43, "failed", "failed", "failed"]}),
):
    _rows = []
    _data_note = ("dataset wmt14-en-de (32k BPE); the paper validates on newstest2012+2013, ours on newstest2013"
                  if _ds == "wmt14-en-de" else
                  "WMT15 Cs->En, shared 32k subwords, valid newstest2013, test newstest2015 (Sec. 2.1)")
    for _variant, _label, _what in (
            ("baseline", "Baseline", "RNMT+ 512 baseline (residuals from the third layer)"),
            ("nores", "Baseline - residuals", "RNMT+ 512 without encoder residuals (--no-encoder-residual)"),
            ("transparent", "Transparent", "RNMT+ 512 with transparent attention (M = 1, projection after the mix)")):
        for _i, _n in enumerate((6, 12, 16, 20)):
            _a = _arch("rnmt_plus", _variant, 512, _n)
            _e = _single(f"rnmt-{_pair}-{_variant}-{_n}L", BAPNA, _ds, _a, RNMT_BASE, RNMT_EVAL,
                         f"Bapna Table {_tab[-1]}: {_what}, {_n} encoder layers", notes=(_data_note,))
            _rows.append(Row(f"RNMT+ (512) {_label}, {_n} encoder layers", _e,
                             {"bleu": _vals[_variant][_i], "params_m": paper_params(_a)}))
    _a = _arch("rnmt_plus", "baseline", 1024, 6)
    _e = _single(f"rnmt-{_pair}-baseline-1024-6L", BAPNA, _ds, _a, RNMT_BASE, RNMT_EVAL,
                 f"Bapna Table {_tab[-1]}: RNMT+ (1024) baseline, 6 encoder layers (Chen et al.'s RNMT+)",
                 notes=(_data_note,))
    _rows.append(Row("RNMT+ (1024) Baseline, 6 encoder layers", _e, {"bleu": _vals["big"], "params_m": paper_params(_a)}))
    TABLES.append(Table(_tab, BAPNA, f"Table {_tab[-1]}: RNMT+, "
                        f"{'WMT14 En→De newstest2014' if _ds == 'wmt14-en-de' else 'WMT15 Cs→En newstest2015'} "
                        "(tokenized true-case BLEU; '*' = failed to train)", tuple(_rows),
                        note="Parameter counts: ours match the paper's (128/165/191/216M, 379M) with a 32k "
                             "vocabulary and separate source/target embeddings."))

# ======================================================================================
# Deep decoder: cross-attention drop + collapse-reducing training
# ======================================================================================
DD_BASE = Recipe(
    lr=vaswani_lr(512, 4000), warmup_updates=4000, max_update=200000, tokens_per_update=32768,
    adam_betas="(0.9, 0.98)", save="updates:1000", keep=20,
    notes=(("tokens_per_update", "Sec. 4.1: 4096 tokens per GPU on 8 V100 = 32768 per update"),
           ("max_update", "Sec. 4.1: 200K steps En->De, 400K En->Fr"),
           ("lr", "'other hyperparameters consistent with Vaswani et al. (2017)': peak d^-0.5*w^-0.5 with w=4000"),
           ("save", "Vaswani: checkpoints every 10 minutes, last 5 (base) / 20 (big) averaged; ours every 1000 updates"),
           ("adam_betas", "(0.9, 0.98), Vaswani et al. 2017"),
           ) + _VASWANI_NOTES,
)
DD_BIG = DD_BASE.with_(lr=vaswani_lr(1024, 4000),
                       notes=(("big", "d=1024 in Vaswani's schedule; dropout 0.3 En-De / 0.1 En-Fr (Vaswani big)"),))


def dd_eval(pair: str, big: bool) -> EvalSpec:
    avg = 20 if big else 5
    if pair == "ende":
        # headline: what Sec. 4.1 states ("We used multi-bleu.perl and detokenized sacreBLEU"): tokenized BLEU
        # without compound splitting, which the paper does not mention; compound-split BLEU is printed beside it
        return EvalSpec(beam=4, lenpen=0.6, average=avg, primary="tok_bleu",
                        notes=("beam 4, length penalty 0.6 (Vaswani; the paper is silent)",
                               "headline: multi-bleu.perl on the Moses-tokenized output (Sec. 4.1 'We used "
                               "multi-bleu.perl and detokenized sacreBLEU'); the paper does not mention compound "
                               "splitting, so compound-split BLEU is printed beside it, not instead of it",
                               f"last {avg} checkpoints averaged (Vaswani; the paper is silent)"))
    return EvalSpec(beam=4, lenpen=0.6, average=avg, primary="tok_bleu",
                    notes=("beam 4, length penalty 0.6 (Vaswani)", "multi-bleu.perl (tokenized, case-sensitive) "
                           f"and detokenized sacreBLEU (Sec. 4.1); last {avg} checkpoints averaged (Vaswani)"))


# label, size, enc, dec, cad+crt, En-De (params, h, bleu, sacre), En-Fr (params, h, bleu, sacre);
# En-De params None: the architecture's paper count (PAPER_ROWS); numbers: OWN_PARAM_COUNTS says why
_DD_T1 = [
    ("BASE (Pre-Norm)", "base", 6, 6, False, (None, 4.79, 27.05, 26.0), (65, 27.11, 41.00, 39.2)),
    ("DeepE", "base", 24, 6, False, (None, 8.66, 28.95, 27.8), (119, 48.43, 42.40, 40.6)),
    ("DeepE", "base", 48, 6, False, (None, 16.38, 29.44, 28.3), (195, 90.85, 42.75, 41.0)),
    ("DEEP", "base", 15, 15, False, (None, 9.82, 0.55, 0.2), (124, 49.96, 0.93, 0.3)),
    ("DEEP+CAD+CRT", "base", 15, 15, True, (None, 10.52, 29.09, 28.1), (124, 50.13, 42.86, 41.0)),
    ("DEEP", "base", 27, 27, False, (None, 16.56, 0.31, 0.1), (200, 78.82, 0.65, 0.1)),
    ("DEEP+CAD+CRT", "base", 27, 27, True, (None, 17.92, 30.31, 28.8), (200, 79.96, 43.57, 41.6)),
    ("BIG (Pre-Norm)", "big", 6, 6, False, (210, 36.05, 28.79, 27.7), (212, 97.51, 42.40, 40.6)),
    ("DeepE", "big", 24, 6, False, (None, 42.41, 29.90, 28.7), (439, 102.14, 43.11, 40.9)),
    ("DEEP", "big", 15, 15, False, (None, 45.32, 0.40, 0.2), (449, 108.02, 0.71, 0.2)),
    ("DEEP+CAD+CRT", "big", 15, 15, True, (None, 46.52, 30.69, 29.0), (449, 110.5, 43.95, 41.9)),
]
_CAD_NOTE = ("CAD: drop depth round(21/27 * L_dec), ratio 0.5 (named architecture's cad_defaults: Fig. 2 peaks at "
             "depth 21 of 27; Sec. 4.3 prefers a ratio below 1 at large depths); the exact values are not in the text")
_CRT_NOTE = ("CRT = DDR + ALD (criterion collapse_reducing): alpha_DDR 1.0, alpha_ALD 0.5, p_ALD 0.3, tau 0.1 - "
             "the alphas and p_ALD are not in the paper (criterion docstring)")


def dd_name(pair: str, size: str, enc: int, dec: int, suffix: str = "") -> str:
    return f"dd-wmt14-{pair}-{size}-{enc}-{dec}" + (f"-{suffix}" if suffix else "")


def _dd_arch(size, enc, dec, cad=False):
    if (enc, dec) == (6, 6):
        return "prenorm_wmt_base_6l" if size == "base" else "prenorm_wmt_big_6l"
    return _arch("dd", size, enc, dec, cad)


_dd_rows = {"ende": [], "enfr": []}
for _pair, _ds in (("ende", "wmt14-en-de-dd"), ("enfr", "wmt14-en-fr")):
    for _label, _size, _enc, _dec, _cad, _de, _fr in _DD_T1:
        _r = (DD_BIG if _size == "big" else DD_BASE)
        _flags: Tuple[str, ...] = ()
        _notes = ["joint BPE 40K, valid newstest2012+2013, test newstest2014 (Sec. 4.1)"]
        if _pair == "enfr":
            _r = _r.with_(max_update=400000)
            if _size == "big":
                _flags = ("--dropout", "0.1")
                _notes.append("dropout 0.1 for En-Fr big (Vaswani et al. 2017)")
        if _cad:
            _notes += [_CAD_NOTE, _CRT_NOTE]
        _name = dd_name(_pair, _size, _enc, _dec, "cad-crt" if _cad else "")
        _a = _dd_arch(_size, _enc, _dec, _cad)
        _single(_name, DD, _ds, _a, _r, dd_eval(_pair, _size == "big"),
                f"Deep-decoder Table 1: {_label} {_size} {_enc}-{_dec} ({_pair})", model_flags=_flags,
                criterion=CR if _cad else "label_smoothed_cross_entropy", criterion_flags=CRT if _cad else (),
                notes=_notes)
        _p, _h, _b, _s = _de if _pair == "ende" else _fr
        _p = paper_params(_a) if _p is None else _p
        _dd_rows[_pair].append(Row(f"{_label} ({_size.upper()}) {_enc}-{_dec}", _name,
                                   {"bleu": _b, "sacrebleu": _s, "params_m": _p, "train_hours": _h}))

_DD_CITED = [  # label, En-De (params, bleu, sacre), En-Fr, experiment to compare with (params None: its arch's)
    ("(Vaswani et al., 2017) (BIG) 6-6", (213, 28.40, None), (222, 41.00, None), None),
    ("(Shaw et al., 2018) (BIG) 6-6", (210, 29.20, None), (222, 41.30, None), None),
    ("(Ott et al., 2018) (BIG) 6-6", (210, 29.30, 28.6), (222, 43.20, 41.4), None),
    ("(Wu et al., 2019) (BIG) 8-8", (270, 29.92, None), (281, 43.27, None), None),
    ("(Wang et al., 2019) (BIG, DEEPE) 30-6", (137, 29.30, None), None, None),
    ("(Wei et al., 2020) (BASE, DEEPE) 48-6", (None, 30.19, None), None, "msc-wmt14-ende-base-48L"),
    ("(Wei et al., 2020) (BIG, DEEPE) 18-6", (None, 30.56, None), None, "msc-wmt14-ende-big-18L"),
    ("(Li et al., 2020) (BASE, DEEPE) 24-6", (118, 29.02, 27.9), (124, 42.42, 40.6), None),
    ("(Li et al., 2020) (BASE, DEEPE) 48-6", (194, 29.60, 28.5), (199, 42.82, 41.0), None),
    ("(Li et al., 2020) (BIG, DEEPE) 24-6", (437, 29.93, 28.7), None, None),
]
for _pair in ("ende", "enfr"):
    _cited = []
    for _label, _de, _fr, _exp in _DD_CITED:
        _v = _de if _pair == "ende" else _fr
        if _v is None:
            continue
        _paper = {"bleu": _v[1], "params_m": exp_params(_exp) if _v[0] is None else _v[0]}
        if _v[2] is not None:
            _paper["sacrebleu"] = _v[2]
        _cited.append(Row(_label, _exp, _paper,
                          "cited; our MSC reproduction (32k BPE data)" if _exp else "cited; not implemented here"))
    TABLES.append(Table(f"dd-t1-{_pair}", DD, "Table 1: WMT14 " + ("En→De" if _pair == "ende" else "En→Fr") +
                        " (multi-bleu.perl BLEU, detokenized sacreBLEU, training hours)",
                        tuple(_cited + _dd_rows[_pair])))

# Table 2: balance of encoder and decoder depth (30 layers in all)
_single(dd_name("ende", "base", 6, 24, "cad-crt"), DD, "wmt14-en-de-dd", _dd_arch("base", 6, 24, True), DD_BASE,
        dd_eval("ende", False), "Deep-decoder Table 2: 6-24 with CAD+CRT", criterion=CR, criterion_flags=CRT,
        notes=(_CAD_NOTE, _CRT_NOTE))
TABLES.append(Table("dd-t2", DD, "Table 2: encoder/decoder depth with 30 layers in all, WMT14 En→De", (
    Row("24-6", dd_name("ende", "base", 24, 6), {"bleu": 28.95, "sacrebleu": 27.8}, "= Table 1 DeepE 24-6"),
    Row("6-24", dd_name("ende", "base", 6, 24, "cad-crt"), {"bleu": 28.21, "sacrebleu": 27.0}, "with CAD+CRT"),
    Row("15-15", dd_name("ende", "base", 15, 15, "cad-crt"), {"bleu": 29.09, "sacrebleu": 28.1},
        "= Table 1 DEEP+CAD+CRT 15-15"),
)))

# Table 3: ablations on BASE, DEEP-30L (15-15)
_DD_T3 = [
    ("+R-Drop", "rdrop", False, ("--ddr-alpha", "5.0", "--ald-alpha", "0"), 0.97, 0.5,
     "R-Drop (Liang et al. 2021) approximated by DDR with alpha 5 (R-Drop's WMT value) on a model without CAD; "
     "our criterion shares one encoder pass between the two predictions, R-Drop runs the whole model twice"),
    ("+DDR", "ddr", False, DDR_ONLY, 1.01, 0.4, "DDR alone, alpha 1.0"),
    ("+ALD", "ald", False, ALD_ONLY, 1.45, 0.7, "ALD alone"),
    ("+CAD", "cad", True, None, 28.35, 27.2, "CAD alone, label-smoothed cross-entropy"),
    ("-CAD", "crt", False, CRT, 1.39, 0.7, "DDR + ALD without CAD"),
    ("-DDR", "cad-ald", True, ALD_ONLY, 28.77, 27.6, "CAD + ALD"),
    ("-ALD", "cad-ddr", True, DDR_ONLY, 28.52, 27.4, "CAD + DDR"),
]
_t3 = [Row("BASE, DEEP-30L", dd_name("ende", "base", 15, 15), {"bleu": 0.55, "sacrebleu": 0.2}, "= Table 1 DEEP 15-15")]
for _label, _suffix, _cad, _crit, _b, _s, _note in _DD_T3:
    _name = dd_name("ende", "base", 15, 15, _suffix)
    _single(_name, DD, "wmt14-en-de-dd", _dd_arch("base", 15, 15, _cad), DD_BASE,
            dd_eval("ende", False), f"Deep-decoder Table 3: BASE, DEEP-30L {_label}",
            criterion=CR if _crit else "label_smoothed_cross_entropy", criterion_flags=_crit or (),
            notes=(_note,) + ((_CAD_NOTE,) if _cad else ()))
    _t3.append(Row(_label, _name, {"bleu": _b, "sacrebleu": _s}, _note))
    if _label == "+CAD":
        _t3.append(Row("BASE, DEEP-30L-Full", dd_name("ende", "base", 15, 15, "cad-crt"),
                       {"bleu": 29.09, "sacrebleu": 28.1}, "= Table 1 DEEP+CAD+CRT 15-15"))
TABLES.append(Table("dd-t3", DD, "Table 3: ablations, WMT14 En→De, BASE DEEP-30L (15-15)", tuple(_t3)))

# Figures 2-4 as sweeps (every point is an ordinary experiment)
_fig2 = []
for _depth in (3, 6, 9, 12, 15, 18, 21, 24, 27):
    for _ratio in (0.25, 0.5, 0.75, 1.0):
        if _depth == 27 and _ratio == 1.0:
            continue  # no decoder layer would ever see the source
        _name = f"dd-fig2-base-27-27-depth{_depth}-ratio{_ratio:g}"
        _single(_name, DD, "wmt14-en-de-dd", _dd_arch("base", 27, 27), DD_BASE, dd_eval("ende", False),
                f"Deep-decoder Fig. 2: BASE DEEP-54L, CAD drop depth {_depth}, ratio {_ratio:g}, + ALD",
                model_flags=("--cad-drop-depth", str(_depth), "--cad-drop-ratio", f"{_ratio:g}"),
                criterion=CR, criterion_flags=ALD_ONLY,
                notes=("Sec. 4.3: 'BASE, DEEP-54L model with both CAD and ALD techniques' (no DDR)",
                       "the grid (depths 3..27 step 3, ratios 0.25..1) is ours; the figure's points are not in the text"))
        _fig2.append(Row(f"drop depth {_depth}, ratio {_ratio:g}", _name, {"bleu": "fig."}))
TABLES.append(Table("dd-fig2", DD, "Figure 2: drop depth x drop ratio, BASE DEEP-54L (27-27), CAD + ALD",
                    tuple(_fig2), note="Peak at drop depth 21 (Sec. 4.3); values only in the figure."))

_fig3 = []
for _p, _tau in [(0.1, 0.1), (0.2, 0.1), (0.3, 0.1), (0.4, 0.1), (0.3, 0.05), (0.3, 0.2), (0.3, 0.5)]:
    _name = f"dd-fig3-base-15-15-pald{_p:g}-tau{_tau:g}"
    _single(_name, DD, "wmt14-en-de-dd", _dd_arch("base", 15, 15, True), DD_BASE, dd_eval("ende", False),
            f"Deep-decoder Fig. 3: BASE DEEP-30L, p_ALD {_p:g}, tau {_tau:g}", criterion=CR,
            criterion_flags=("--ddr-alpha", "1.0", "--ald-alpha", "0.5", "--ald-p", f"{_p:g}", "--ald-tau", f"{_tau:g}"),
            notes=("full CAD+CRT model with p_ALD / tau varied (one at a time around p 0.3, tau 0.1; our grid)",
                   _CAD_NOTE))
    _fig3.append(Row(f"p_ALD {_p:g}, tau {_tau:g}", _name, {"bleu": "fig."}))
TABLES.append(Table("dd-fig3", DD, "Figure 3: ALD sampling threshold p_ALD and temperature tau, BASE DEEP-30L",
                    tuple(_fig3), note="Sec. 4.3: BLEU rises with p_ALD then falls; tau 0.05 slightly below 0.1."))


_fig4 = []
for _side in ("enc", "dec"):
    for _n in (1, 3, 6, 9, 12, 18, 21, 24):
        _enc, _dec = (_n, 15) if _side == "enc" else (15, _n)
        _depth, _ratio = cad_defaults(_dec)
        _name = f"dd-fig4-base-{_enc}-{_dec}-cad-crt"
        _single(_name, DD, "wmt14-en-de-dd", MODEL_NAME, DD_BASE, dd_eval("ende", False),
                f"Deep-decoder Fig. 4: {_enc} encoder / {_dec} decoder layers, CAD+CRT",
                model_flags=("--encoder-layers", str(_enc), "--decoder-layers", str(_dec), "--share-all-embeddings",
                             "--cad-drop-depth", str(_depth), "--cad-drop-ratio", f"{_ratio:g}"),
                criterion=CR, criterion_flags=CRT,
                notes=("BASE, DEEP-30L with only the encoder or only the decoder depth changed (Sec. 4.3); "
                       "the depth grid is ours", _CAD_NOTE, _CRT_NOTE))
        _fig4.append(Row(f"{_enc}-{_dec}", _name, {"bleu": "fig."}))
_fig4.append(Row("15-15", dd_name("ende", "base", 15, 15, "cad-crt"), {"bleu": 29.09}, "= Table 1"))
TABLES.append(Table("dd-fig4", DD, "Figure 4: encoder depth vs decoder depth (the other fixed at 15), CAD+CRT",
                    tuple(_fig4)))

# Fig. 1: training PPL and BLEU vs decoder depth after 200K steps, "except for the number of decoder layers, other
# hyperparameters were kept consistent with ... the Transformer-based model setting" (6-layer encoder), without
# the methods (the collapse) and with CAD + CRT (what the methods change)
_FIG1_DEPTHS = (6, 9, 12, 15, 18, 21, 24, 27)
_fig1 = {"plain": [], "cad-crt": []}
_fig1_rows = []
for _dec in _FIG1_DEPTHS:
    for _m in ("plain", "cad-crt"):
        if _dec == 6 and _m == "cad-crt":
            continue  # 6-6 is the baseline itself (no deep decoder to fix)
        if _dec == 6:
            _name = dd_name("ende", "base", 6, 6)
        elif _dec == 24 and _m == "cad-crt":
            _name = dd_name("ende", "base", 6, 24, "cad-crt")  # Table 2's 6-24
        else:
            _name = f"dd-fig1-base-6-{_dec}" + ("-cad-crt" if _m == "cad-crt" else "")
            _flags = ("--encoder-layers", "6", "--decoder-layers", str(_dec), "--share-all-embeddings")
            if _m == "cad-crt":
                _depth, _ratio = cad_defaults(_dec)
                _flags += ("--cad-drop-depth", str(_depth), "--cad-drop-ratio", f"{_ratio:g}")
            _single(_name, DD, "wmt14-en-de-dd", MODEL_NAME, DD_BASE, dd_eval("ende", False),
                    f"Deep-decoder Fig. 1: 6-layer encoder, {_dec}-layer decoder" + (", CAD+CRT" if _m == "cad-crt" else ""),
                    model_flags=_flags, criterion=CR if _m == "cad-crt" else "label_smoothed_cross_entropy",
                    criterion_flags=CRT if _m == "cad-crt" else (),
                    notes=("Sec. 3.2 / Fig. 1: BASE setting, only the decoder depth changes, 200K updates; the "
                           "depth grid and the pre-norm layers (as Table 1's BASE) are ours",)
                    + ((_CAD_NOTE, _CRT_NOTE) if _m == "cad-crt" else ()))
        _fig1[_m].append((_dec, _name))
        _fig1_rows.append(Row(f"6-{_dec}" + (" + CAD + CRT" if _m == "cad-crt" else ""), _name, {"bleu": "fig."}))
TABLES.append(Table("dd-fig1", DD, "Figure 1: training PPL and BLEU vs decoder depth (6-layer encoder), without and "
                    "with CAD + CRT", tuple(_fig1_rows),
                    note="The paper's Fig. 1 shows the plain model only; the CAD + CRT line is the issue's "
                         "'with and without the methods'. Training PPL is the last logged training perplexity."))
_fig1["cad-crt"].insert(0, (6, dd_name("ende", "base", 6, 6)))  # both lines start at the 6-6 baseline

FIG.add(FIG.Figure(
    "dd-fig1", DD, "Deep-decoder Fig. 1: training PPL and BLEU vs decoder depth (WMT14 En-De, 6-layer encoder)",
    "sweep", "decoder layers", (("last_train_ppl", "training PPL"), ("bleu", "BLEU (multi-bleu.perl)")),
    (("Transformer BASE (pre-norm)", tuple(FIG.Point(d, n) for d, n in _fig1["plain"])),
     ("+ CAD + CRT", tuple(FIG.Point(d, n) for d, n in _fig1["cad-crt"]))),
    chosen="decoder depths 6..27 step 3 (the paper prints no grid); training PPL = the last logged training "
           "perplexity of the run; the CAD + CRT line is added"))
_f2 = {}
for _r in _fig2:
    _m = re.search(r"depth(\d+)-ratio([0-9.]+)$", _r.experiment)
    _f2.setdefault(f"drop ratio {_m.group(2)}", []).append(FIG.Point(int(_m.group(1)), _r.experiment))
FIG.add(FIG.Figure(
    "dd-fig2", DD, "Deep-decoder Fig. 2: BLEU vs CAD drop depth per drop ratio (BASE DEEP-54L, CAD + ALD)", "sweep",
    "drop depth L_dr (of 27 decoder layers)", (("bleu", "BLEU"),), tuple((k, tuple(v)) for k, v in _f2.items()),
    chosen="depths 3..27 step 3 and ratios 0.25/0.5/0.75/1.0 (the text states only the peak at 21 and ratio 1.0)"))
_f3p = tuple(FIG.Point(float(re.search(r"pald([0-9.]+)", r.experiment).group(1)), r.experiment)
             for r in _fig3 if r.experiment.endswith("tau0.1"))
_f3t = tuple(FIG.Point(float(re.search(r"tau([0-9.]+)$", r.experiment).group(1)), r.experiment)
             for r in _fig3 if "pald0.3-" in r.experiment)
FIG.add(FIG.Figure(
    "dd-fig3", DD, "Deep-decoder Fig. 3: BLEU vs p_ALD (tau 0.1) and vs tau (p_ALD 0.3), BASE DEEP-30L", "sweep",
    "p_ALD (left line) / tau (right line)", (("bleu", "BLEU"),),
    (("p_ALD, tau = 0.1", _f3p), ("tau, p_ALD = 0.3", _f3t)),
    chosen="p_ALD 0.1..0.4 at tau 0.1 and tau 0.05/0.1/0.2/0.5 at p_ALD 0.3 (the text names tau 0.05 and 0.1 only)"))
_f4 = {"encoder depth (decoder 15)": [], "decoder depth (encoder 15)": []}
for _r in _fig4:
    _e, _d = (int(x) for x in _r.label.split("-"))
    if _r.label == "15-15":
        for _k in _f4:
            _f4[_k].append(FIG.Point(15, _r.experiment))
    elif _d == 15:
        _f4["encoder depth (decoder 15)"].append(FIG.Point(_e, _r.experiment))
    else:
        _f4["decoder depth (encoder 15)"].append(FIG.Point(_d, _r.experiment))
FIG.add(FIG.Figure(
    "dd-fig4", DD, "Deep-decoder Fig. 4: BLEU vs encoder / decoder depth (the other 15), CAD + CRT", "sweep",
    "layers", (("bleu", "BLEU"),), tuple((k, tuple(sorted(v, key=lambda p: p.x))) for k, v in _f4.items()),
    chosen="depths 1..24 (the text names depth 1 only)"))


def dd_settings(name: str) -> str:
    """The CAD / CRT values an experiment runs with, ``*`` marking each value that is our choice rather than
    the paper's (Sec. 3.3-4.3 print none of them; the text names drop depth 21 of 27, ratio 1.0, tau 0.05 and
    0.1 as points of its sweeps).  Empty for models without CAD or CRT."""
    exp = EXPERIMENTS[name]
    st = exp.eval_stage
    def flags(seq):
        return {k: (seq[i + 1] if i + 1 < len(seq) and not seq[i + 1].startswith("--") else "")
                for i, k in enumerate(seq) if k.startswith("--")}

    f, crit = flags(st.model_flags), flags(st.criterion_flags)
    depth, ratio = f.get("--cad-drop-depth"), f.get("--cad-drop-ratio")
    dec = int(f.get("--decoder-layers") or 0)
    for key, arch in ARCHS.items():
        if arch == st.arch and key[0] == "dd":
            dec = dec or key[3]
            if key[-1]:  # a named CAD architecture: its cad_defaults unless the flags say otherwise
                d, r = cad_defaults(key[3])
                depth, ratio = depth or str(d), ratio or f"{r:g}"
            break
    out = []
    if depth is not None:
        out.append(f"L_dr {depth}" + ("" if (depth == "21" and dec == 27) else "*"))
        out.append(f"p_net {ratio}" + ("" if ratio in ("1", "1.0") else "*"))
    if st.criterion == CR and (crit.get("--ddr-alpha") not in (None, "0") or crit.get("--ald-alpha") not in (None, "0")):
        if crit.get("--ddr-alpha") not in (None, "0"):
            out.append(f"α_DDR {crit['--ddr-alpha']}*")
        if crit.get("--ald-alpha") not in (None, "0"):
            out.append(f"α_ALD {crit['--ald-alpha']}*")
            out.append(f"p_ALD {crit.get('--ald-p', '?')}*")
            tau = crit.get("--ald-tau", "?")
            out.append(f"τ {tau}" + ("" if tau in ("0.05", "0.1") else "*"))
    return ", ".join(out)

# ======================================================================================
# GPKD + skipping sub-layer (Li et al. 2021), WMT En-De (Zh-En data is not freely available)
# ======================================================================================
GPKD_BASE = Recipe(
    lr=0.002, warmup_updates=16000, max_update=50000, tokens_per_update=65536, adam_betas="(0.9, 0.997)",
    adam_eps=1e-8, save="epoch", keep=10,
    notes=(("lr/warmup/betas", "'followed the hyper-parameters used in Wang et al. (2019)': Adam (0.9, 0.997), "
                               "lr 0.002, 16K warm-up (as in the authors' public scripts, libeineu/GPKD)"),
           ("tokens_per_update", "4096 tokens per GPU, update every two steps (paper) on 8 GPUs (Wang et al. 2019a) "
                                 "= 65536"),
           ("max_update", "Base/Deep 50K, Big 150K updates (paper; Table 3 lists 100K for Base-RPR - we follow the "
                          "settings text)"),
           ("save", "a checkpoint per epoch, the last 5 averaged (Wang et al. 2019a / authors' translate.sh)"),
           ("adam_eps", "1e-8 (fairseq default, as the authors' scripts)"),
           ("clip_norm/weight_decay", "0 (authors' scripts)"),
           ("dropout", "0.1 residual, 0.1 attention and ReLU dropout (Wang et al. 2019a's t2t setting); big: 0.3 residual"),
           ("data", "wmt14-en-de-gpkd: the 4.5M En-De set, 32K merges, valid newstest2016, test newstest2014 (paper)"),
           ),
)
GPKD_BIG = GPKD_BASE.with_(max_update=150000)
# GPKD: "We adopted the compound split strategy for En-De ... case-sensitive tokenized BLEU ... multi-bleu.perl"
GPKD_EVAL = wmt_ende_eval(5, batch_size=64, compound_split=True, extra_notes=(
    "last 5 epoch checkpoints averaged; batch 64 as the authors' translate.sh; speed = tokens/s of fairseq-generate",))
GPKD_EVAL_T5 = EvalSpec(**{**GPKD_EVAL.__dict__, "also_single": True,
                           "notes": GPKD_EVAL.notes + ("Table 5 also reports the single last checkpoint",)})
RPR_DROP = ("--attention-dropout", "0.1", "--activation-dropout", "0.1")
_SKD_NOTE = ("SKD data: the teacher (average of its last 5 checkpoints) translates the training set with beam 4, "
             "length penalty 0.6 (deepnmt-skd)")
_PLAIN_NOTE = ("plain Deep-RPR model, trained without group permutation: the baseline rows of Tables 1-5 (Table 1 "
               "lists the deep models apart from the GPKD students; Table 3 lists '+Skipping Sub-Layer' and Table 6 "
               "'Skipping Sub-Layer + GP' as different systems); its SKD data trains the '+SKD' students")
_GP_NOTE = ("GP-trained teacher (its own row; the paper prints no BLEU for it): 'Group-Permutation Training' with "
            "group size h = N/M, the h its students are extracted with ('One can compress a 48-layer teacher into a "
            "6-layer network by setting h = 8, or progressively ... with h = 2'); evaluated in the original layer order")
# Two-stage training (paper, 'Two-stage Training'): "First, we train the model as usual but early stop it when the
# model converges on the validation set. Then, we apply our Skipping Sub-Layer method to the model and continue
# training until the model converges again."  Neither the patience nor the second stage's length is given.
GPKD_PATIENCE = 3
_STAGE1_NOTE = (f"two-stage training, stage 1: trained as usual, early-stopped when the validation loss has not "
                f"improved for {GPKD_PATIENCE} validations (one per epoch; --patience {GPKD_PATIENCE}, our value: "
                "the paper says 'early stop it when the model converges on the validation set'), within the 50K-update "
                "Deep schedule")
_STAGE2_NOTE = ("two-stage training, stage 2: starts from stage 1's averaged model (last 5 epoch checkpoints, the "
                "model the paper evaluates) with stage 1's Adam state, learning-rate schedule and update count "
                "(--continue-once on an average written with --keep-training-state), so the inverse-sqrt schedule "
                "goes on where stage 1 stopped instead of warming up to the peak rate again ('continue training "
                f"until the model converges again': --patience {GPKD_PATIENCE}, at most 100K updates in all; our "
                "reading of 'continue' and of Table 3's 50K updates, which the paper does not split between stages)")
GPKD_STAGE1 = GPKD_BASE.with_(patience=GPKD_PATIENCE)
GPKD_STAGE2 = GPKD_BASE.with_(max_update=100000, patience=GPKD_PATIENCE)
_SCRATCH_NOTE = "from scratch (Table 4 'Scratch'): the method on from update 0, 50K updates, no GP"


def _gp_flags(enc_h: int, dec_h: int = 1) -> Tuple[str, ...]:
    return ((("--gp-group-size", str(enc_h)) if enc_h > 1 else ()) +
            (("--gp-decoder-group-size", str(dec_h)) if dec_h > 1 else ()))


def gpkd_teacher(name, arch, recipe, enc_h=1, dec_h=1, title="", notes=()) -> str:
    """A deep model and its SKD data: plain (enc_h = dec_h = 1, the baseline rows) or GP-trained with
    the group sizes its students are extracted with."""
    stages = (TrainStage(arch=arch, recipe=recipe, name="train", model_flags=RPR_DROP + _gp_flags(enc_h, dec_h)),
              SkdStage(teacher=Ref(None, "train", "model")))
    return _add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=stages, eval=GPKD_EVAL, title=title,
                           notes=((_GP_NOTE if enc_h > 1 or dec_h > 1 else _PLAIN_NOTE), _SKD_NOTE) + tuple(notes)))


def gpkd_two_stage_teacher(name, arch, skip_flags, enc_h, dec_h, title, notes=()) -> str:
    """Skipping Sub-Layer + GP teacher (Table 6): stage 'converge' GP-trained and early-stopped, stage
    'train' continues it with skipping and GP, then its SKD data."""
    gp = _gp_flags(enc_h, dec_h)
    stages = (TrainStage(arch=arch, recipe=GPKD_STAGE1, name="converge", model_flags=RPR_DROP + gp),
              TrainStage(arch=arch, recipe=GPKD_STAGE2, name="train", model_flags=RPR_DROP + gp + tuple(skip_flags),
                         init=("continue", Ref(None, "converge", "resume"))),
              SkdStage(teacher=Ref(None, "train", "model")))
    return _add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=stages, eval=GPKD_EVAL, title=title,
                           notes=(_GP_NOTE, _STAGE1_NOTE.replace("trained as usual", "GP-trained"), _STAGE2_NOTE,
                                  _SKD_NOTE) + tuple(notes)))


def gpkd_skd_student(name, teacher, arch, recipe, title) -> str:
    stage = TrainStage(arch=arch, recipe=recipe, name="train", model_flags=RPR_DROP, data=Ref(teacher, "skd", "skd"))
    return _add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=(stage,), eval=GPKD_EVAL, title=title,
                           notes=(f"SKD baseline (Kim and Rush 2016): random initialisation, trained on the SKD data of "
                                  f"{teacher}, the plain deep model of the rows above it (our reading: the paper does "
                                  "not say whether SKD used the GP teacher's translations)",
                                  "student training length is not in the paper: the Base schedule")))


def gpkd_student(name, teacher, arch, recipe, enc_h, dec_h, title) -> str:
    """Extract one layer per group with the teacher's own GP group sizes, train on its SKD data."""
    stages = (ExtractStage(teacher=Ref(teacher, "train", "model"), encoder_group_size=enc_h, decoder_group_size=dec_h),
              TrainStage(arch=arch, recipe=recipe, name="student", model_flags=RPR_DROP,
                         data=Ref(teacher, "skd", "skd"), init=("finetune", Ref(None, "extract", "student"))))
    return _add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=stages, eval=GPKD_EVAL, title=title,
                           notes=(f"GPKD: one random layer per group (encoder h={enc_h}, decoder h={dec_h}, the group "
                                  f"sizes {teacher} was GP-trained with) of its averaged model initialises the student, "
                                  "trained on its SKD data",
                                  "student training is a new training run (--finetune-from-model: fresh Adam state and "
                                  "warm-up; 'we begin optimizing the student network'); its length is not in the "
                                  "paper: the Base/Big schedule")))


# Table 1 (En-De columns)
_base6 = _single("gpkd-wmt14-ende-base-6L", GPKD, "wmt14-en-de-gpkd", "rpr_base_6_6", GPKD_BASE, GPKD_EVAL,
                 "GPKD Table 1/3: Base-RPR-6L", model_flags=RPR_DROP)
_big6 = _single("gpkd-wmt14-ende-big-6L", GPKD, "wmt14-en-de-gpkd", "rpr_big_6_6", GPKD_BIG, GPKD_EVAL,
                "GPKD Table 1: Big-RPR-6L", model_flags=RPR_DROP)
_p24 = gpkd_teacher("gpkd-wmt14-ende-24L", "rpr_deep_24_6", GPKD_BASE, title="GPKD Table 1: Deep-RPR-24L (no GP)")
_p48 = gpkd_teacher("gpkd-wmt14-ende-48L", "rpr_deep_48_6", GPKD_BASE, title="GPKD Tables 1-5: Deep-RPR-48L (no GP)")
_p12 = gpkd_teacher("gpkd-wmt14-ende-big-12L", "rpr_big_12_6", GPKD_BIG, title="GPKD Table 1: Big-RPR-12L (no GP)")
_t24 = gpkd_teacher("gpkd-wmt14-ende-24L-teacher", "rpr_deep_24_6", GPKD_BASE, 4,
                    title="GPKD Table 1: Deep-RPR-24L GP teacher (h=4)")
_t48 = gpkd_teacher("gpkd-wmt14-ende-48L-teacher", "rpr_deep_48_6", GPKD_BASE, 8,
                    title="GPKD Table 1: Deep-RPR-48L GP teacher (h=8)")
_t12 = gpkd_teacher("gpkd-wmt14-ende-big-12L-teacher", "rpr_big_12_6", GPKD_BIG, 2,
                    title="GPKD Table 1: Big-RPR-12L GP teacher (h=2)")
_g = {}
for _tag, _plain, _teacher, _a, _recipe, _h in (
        ("24L", _p24, _t24, "rpr_base_6_6", GPKD_BASE, 4), ("48L", _p48, _t48, "rpr_base_6_6", GPKD_BASE, 8),
        ("big-12L", _p12, _t12, "rpr_big_6_6", GPKD_BIG, 2)):
    _g[_tag] = (gpkd_skd_student(f"gpkd-wmt14-ende-{_tag}-skd", _plain, _a, _recipe, f"GPKD Table 1: {_tag} -> 6-6 +SKD"),
                gpkd_student(f"gpkd-wmt14-ende-{_tag}-gpkd", _teacher, _a, _recipe, _h, 1,
                             f"GPKD Table 1: {_tag} -> 6-6 +GPKD (h={_h})"))

# Progressive compression 48 -> 24 -> 12 -> 6 with h = 2 (Sec. "Student Training"): every model that is
# compressed was GP-trained with h = 2, the h it is compressed with
_t48h2 = gpkd_teacher("gpkd-wmt14-ende-48L-gp2-teacher", "rpr_deep_48_6", GPKD_BASE, 2,
                      title="GPKD progressive compression: Deep-RPR-48L GP teacher (h=2)")
_skd_h2 = Ref(_t48h2, "skd", "skd")
_prog_stages = (
    ExtractStage(teacher=Ref(_t48h2, "train", "model"), name="extract-24", encoder_group_size=2),
    TrainStage(arch="rpr_deep_24_6", recipe=GPKD_BASE, name="student-24", model_flags=RPR_DROP + _gp_flags(2),
               data=_skd_h2, init=("finetune", Ref(None, "extract-24", "student"))),
    ExtractStage(teacher=Ref(None, "student-24", "model"), name="extract-12", encoder_group_size=2),
    TrainStage(arch="rpr_deep_24_6", recipe=GPKD_BASE, name="student-12",
               model_flags=RPR_DROP + ("--encoder-layers", "12") + _gp_flags(2),
               data=_skd_h2, init=("finetune", Ref(None, "extract-12", "student"))),
    ExtractStage(teacher=Ref(None, "student-12", "model"), name="extract-6", encoder_group_size=2),
    TrainStage(arch="rpr_base_6_6", recipe=GPKD_BASE, name="student-6", model_flags=RPR_DROP,
               data=_skd_h2, init=("finetune", Ref(None, "extract-6", "student"))),
)
_prog = _add(Experiment(
    name="gpkd-wmt14-ende-6-6-progressive", paper=GPKD, dataset="wmt14-en-de-gpkd", stages=_prog_stages, eval=GPKD_EVAL,
    title="GPKD: progressive compression 48 -> 24 -> 12 -> 6 (GP h = 2 and extraction h = 2, three times)",
    notes=("'progressively achieve this goal with h = 2 for three times of compression': the 48-layer teacher is "
           "GP-trained with h = 2, each intermediate student (24, 12 layers) is GP-trained with h = 2 on the "
           "teacher's SKD data and then compressed with h = 2 again; the 6-layer student trains without GP",
           "intermediate training lengths are ours (the Base schedule)")))
TABLES.append(Table("gpkd-t1", GPKD, "Table 1: GPKD on the encoder, WMT En-De (compound-split tokenized BLEU)", (
    Row("Deep-RPR-24L (24-6)", _p24, {"bleu": 29.39, "params_m": exp_params(_p24)}, "trained without GP"),
    Row("Base-RPR-6L (6-6)", _base6, {"bleu": 27.60, "params_m": exp_params(_base6)}),
    Row("+SKD (6-6)", _g["24L"][0], {"bleu": 28.50, "params_m": exp_params(_g["24L"][0])}),
    Row("+GPKD (6-6)", _g["24L"][1], {"bleu": 29.33, "params_m": exp_params(_g["24L"][1])}),
    Row("Deep-RPR-48L (48-6)", _p48, {"bleu": 30.03, "params_m": exp_params(_p48)}, "trained without GP"),
    Row("Base-RPR-6L (6-6)", _base6, {"bleu": 27.60, "params_m": exp_params(_base6)}),
    Row("+SKD (6-6)", _g["48L"][0], {"bleu": 29.01, "params_m": exp_params(_g["48L"][0])}),
    Row("+GPKD (6-6)", _g["48L"][1], {"bleu": 29.68, "params_m": exp_params(_g["48L"][1])}),
    Row("Big-RPR-12L (12-6)", _p12, {"bleu": 29.91, "params_m": exp_params(_p12)}, "trained without GP"),
    Row("Big-RPR-6L (6-6)", _big6, {"bleu": 29.21, "params_m": exp_params(_big6)}),
    Row("+SKD (6-6)", _g["big-12L"][0], {"bleu": 29.47, "params_m": exp_params(_g["big-12L"][0])}),
    Row("+GPKD (6-6)", _g["big-12L"][1], {"bleu": 29.88, "params_m": exp_params(_g["big-12L"][1])}),
    Row("GP teacher of +GPKD from 24L (GP h=4)", _t24, {"bleu": "-"}, "not in the table: the GP-trained teacher"),
    Row("GP teacher of +GPKD from 48L (GP h=8)", _t48, {"bleu": "-"}, "not in the table: the GP-trained teacher"),
    Row("GP teacher of +GPKD from Big-12L (GP h=2)", _t12, {"bleu": "-"}, "not in the table: the GP-trained teacher"),
    Row("GP teacher of the progressive student (48L, GP h=2)", _t48h2, {"bleu": "-"}, "not in the table"),
    Row("+GPKD, progressive 48 -> 24 -> 12 -> 6 (h = 2 three times)", _prog, {"bleu": "-"},
        "not in the table; the paper's alternative to h = 8"),
    Row("NIST Zh-En, WMT19 Zh-En columns", None, {"bleu": "see paper"},
        "not reproducible here: NIST OpenMT12 (LDC) and the CWMT/UN Zh-En data are not freely available"),
)))

# Table 2: DESDAR
_d483 = _single("gpkd-wmt14-ende-desdar-48-3", GPKD, "wmt14-en-de-gpkd", "desdar_48_3", GPKD_BASE, GPKD_EVAL,
                "GPKD Table 2: DESDAR 48-3 (real data)", model_flags=RPR_DROP)
_d481 = _single("gpkd-wmt14-ende-desdar-48-1", GPKD, "wmt14-en-de-gpkd", "desdar_48_1", GPKD_BASE, GPKD_EVAL,
                "GPKD Table 2: DESDAR 48-1 (real data)", model_flags=RPR_DROP)
_t48d6 = gpkd_teacher("gpkd-wmt14-ende-48L-gp-dec6-teacher", "rpr_deep_48_6", GPKD_BASE, 1, 6,
                      title="GPKD Table 2: Deep-RPR-48L GP teacher for DESDAR 48-1 (decoder h=6)",
                      notes=("'The GPKD method also fits into the decoder': GP on the 6 decoder layers (h = 6 -> one "
                             "decoder layer), the encoder trained as usual (it is not compressed)",))
_d481s = gpkd_skd_student("gpkd-wmt14-ende-desdar-48-1-skd", _p48, "desdar_48_1", GPKD_BASE, "GPKD Table 2: DESDAR 48-1 (SKD)")
_d481g = gpkd_student("gpkd-wmt14-ende-desdar-48-1-gpkd", _t48d6, "desdar_48_1", GPKD_BASE, 1, 6,
                      "GPKD Table 2: DESDAR 48-1 (GPKD, decoder h=6)")
# DESDAR greedy-search claim (Sec. 'The Effect of GPKD Method'): "after knowledge distillation, the beam search
# seems like to be not important for the DESDAR systems, which can achieve a 3.2x speedup with no performance
# sacrifice with the greedy search": the same trained systems decoded again with beam 1
# (evaluate NAME --beam 1 writes results-beam1-lenpen0.6.json next to results.json)
_GREEDY = dict(eval_args="--beam 1", results="results-beam1-lenpen0.6.json")
TABLES.append(Table("gpkd-t2", GPKD, "Table 2: DESDAR (deep encoder, shallow decoder), WMT En-De", (
    Row("Zhang, Xiong, and Su (2018)", None, {"bleu": 27.33, "speedup_vs_base": 1.34}, "cited; not implemented"),
    Row("Xiao et al. (2019)", None, {"bleu": 27.69, "speedup_vs_base": 1.39}, "cited; not implemented"),
    Row("Base", _base6, {"bleu": 27.60}),
    Row("Deep", _p48, {"bleu": 30.03}, "Deep-RPR-48L without GP"),
    Row("DESDAR 48-3", _d483, {"bleu": 29.82, "speedup_vs_base": 1.28, "speedup_vs_deep": 1.52}),
    Row("DESDAR 48-1", _d481, {"bleu": 28.31, "speedup_vs_base": 1.97, "speedup_vs_deep": 2.17}),
    Row("DESDAR 48-1 (SKD)", _d481s, {"bleu": 29.70, "speedup_vs_base": 1.99, "speedup_vs_deep": 2.18}),
    Row("DESDAR 48-1 (GPKD)", _d481g, {"bleu": 30.01, "speedup_vs_base": 1.99, "speedup_vs_deep": 2.18}),
    Row("GP teacher of DESDAR 48-1 (GPKD) (decoder GP h=6)", _t48d6, {"bleu": "-"}, "not in the table"),
), note="speedup = decoding tokens/s relative to Base / Deep (measured from fairseq-generate)."))
TABLES.append(Table("gpkd-desdar-greedy", GPKD, "DESDAR greedy-search claim: beam 1 vs beam 4, WMT En-De (text, "
                    "Sec. 'The Effect of GPKD Method')", (
    Row("Deep-RPR-48L 48-6, beam 4", _p48, {"bleu": 30.03}),
    Row("Deep-RPR-48L 48-6, beam 1", _p48, {"bleu": "-"}, "our reference point for the greedy speedup", **_GREEDY),
    Row("DESDAR 48-1 (SKD), beam 4", _d481s, {"bleu": 29.70}),
    Row("DESDAR 48-1 (SKD), beam 1", _d481s, {"bleu": "≈ beam 4"}, "'no performance sacrifice'", **_GREEDY),
    Row("DESDAR 48-1 (GPKD), beam 4", _d481g, {"bleu": 30.01}),
    Row("DESDAR 48-1 (GPKD), beam 1", _d481g, {"bleu": "≈ beam 4", "speedup_vs_deep": 3.2},
        "'3.2x speedup ... with the greedy search': the paper does not say relative to which system and beam; we "
        "read it as relative to Deep 48-6 with beam 4 (speedup vs Deep)", **_GREEDY),
), note="speedup vs Deep = decoding tokens/s relative to Deep-RPR-48L 48-6 with beam 4 (its results.json); the "
        "beam-1 rows read results-beam1-lenpen0.6.json of the same experiment (evaluate NAME --beam 1)."))

# Tables 3-5: skipping sub-layer, two-stage (stage 1: plain, early-stopped; stage 2: the method on, continued)
_conv = _add(Experiment(
    name="gpkd-wmt14-ende-48L-converged", paper=GPKD, dataset="wmt14-en-de-gpkd",
    stages=(TrainStage(arch="rpr_deep_48_6", recipe=GPKD_STAGE1, name="train", model_flags=RPR_DROP),),
    eval=GPKD_EVAL, title="GPKD Tables 3-5: Deep-RPR-48L, two-stage training stage 1 (early-stopped, no GP)",
    notes=(_STAGE1_NOTE, "the fine-tuning runs of Tables 3-5 continue from its averaged model")))
_CONT = ("continue", Ref(_conv, "train", "resume"))


def _gpkd_skip(name, flags, title, finetune, ev=GPKD_EVAL, notes=()):
    return _single(name, GPKD, "wmt14-en-de-gpkd", "rpr_deep_48_6", GPKD_STAGE2 if finetune else GPKD_BASE, ev, title,
                   model_flags=RPR_DROP + flags, init=_CONT if finetune else None,
                   notes=((_STAGE2_NOTE + f"; stage 1: {_conv}") if finetune else _SCRATCH_NOTE,) + tuple(notes))


_ssl = _gpkd_skip("gpkd-wmt14-ende-48L-ssl", ("--ssl-rate", "0.4"), "GPKD Table 3/4/5: Deep-RPR-48L + Skipping Sub-Layer "
                  "(two-stage)", True, GPKD_EVAL_T5, ("phi = 0.4 (Eq. 5), encoder sub-layers only",))
_ssl_s = _gpkd_skip("gpkd-wmt14-ende-48L-ssl-scratch", ("--ssl-rate", "0.4"), "GPKD Table 4: Skipping Sub-Layer from scratch", False)
_ld_s = _gpkd_skip("gpkd-wmt14-ende-48L-layerdrop-scratch", ("--encoder-layerdrop", "0.2"),
                   "GPKD Table 4: LayerDrop from scratch", False, notes=(
                       "LayerDrop (Fan et al. 2020, fairseq's --encoder-layerdrop) with p = 0.2, their translation value; "
                       "encoder only, like the skipping sub-layer",))
_sl_s = _gpkd_skip("gpkd-wmt14-ende-48L-stochastic-scratch", ("--ssl-mode", "layer", "--ssl-rate", "0.5"),
                   "GPKD Table 4: Stochastic Layers from scratch", False, notes=(
                       "Stochastic Layers (Pham et al. 2019): whole layers, p_l = l/L * 0.5 (the linear-decay rule with "
                       "final drop rate 0.5; GPKD gives no value)",))
_ld = _gpkd_skip("gpkd-wmt14-ende-48L-layerdrop", ("--encoder-layerdrop", "0.2"), "GPKD Table 4: LayerDrop (two-stage)",
                 True, notes=("LayerDrop p = 0.2 (Fan et al. 2020)",))
_sl = _gpkd_skip("gpkd-wmt14-ende-48L-stochastic", ("--ssl-mode", "layer", "--ssl-rate", "0.5"),
                 "GPKD Table 4: Stochastic Layers (two-stage)", True, notes=("p_l = l/L * 0.5 (see scratch run)",))
_skl = _gpkd_skip("gpkd-wmt14-ende-48L-skip-layer", ("--ssl-mode", "layer", "--ssl-rate", "0.4"),
                  "GPKD Table 5: Skip Layer (two-stage)", True, GPKD_EVAL_T5, (
                      "whole layers with the paper's rate phi = 0.4 (p_l = l/L * 0.4); Table 4's Stochastic Layers "
                      "uses 0.5 - the paper does not say how the two differ (our reading)",))
_skip_ffn = _gpkd_skip("gpkd-wmt14-ende-48L-skip-ffn", ("--ssl-rate", "0.4", "--ssl-sublayers", "ffn"),
                       "GPKD Table 5: skip FFN sub-layers only (two-stage)", True, GPKD_EVAL_T5,
                       ("--ssl-sublayers ffn: only FFN sub-layers are omitted, each with its Eq. 5 rate p_l "
                        "(its position l in the 2L numbering; our reading)",))
_skip_san = _gpkd_skip("gpkd-wmt14-ende-48L-skip-san", ("--ssl-rate", "0.4", "--ssl-sublayers", "attn"),
                       "GPKD Table 5: skip self-attention sub-layers only (two-stage)", True, GPKD_EVAL_T5,
                       ("--ssl-sublayers attn: only self-attention sub-layers are omitted (our reading of p_l, "
                        "as for Skip FFN)",))
TABLES.append(Table("gpkd-t3", GPKD, "Table 3: skipping sub-layer, WMT En-De (BLEU, sacreBLEU, training time)", (
    Row("Fan, Grave, and Joulin (2020)", None, {"bleu": 30.20, "params_m": 286}, "cited (LayerDrop 12-6 big); see Table 4 rows"),
    Row("Li et al. (2020)", None, {"bleu": 30.21, "sacrebleu": 29.0, "params_m": 194, "train_hours": 11.75}, "cited"),
    Row("Wu et al. (2019b)", None, {"bleu": 29.92, "params_m": 270}, "cited"),
    Row("Ott et al. (2018)", None, {"bleu": 29.30, "sacrebleu": 28.3, "params_m": 210}, "cited"),
    Row("Wang et al. (2019)", None, {"bleu": 29.30, "params_m": 137}, "cited; see MSC Table 4's DLCL run"),
    Row("Base-RPR", _base6, {"bleu": 27.60, "sacrebleu": 26.5, "params_m": exp_params(_base6), "train_hours": 5.02}),
    Row("Deep-RPR-48L", _p48, {"bleu": 30.03, "sacrebleu": 28.8, "params_m": exp_params(_p48), "train_hours": 16.87},
        "trained without GP"),
    Row("+ Skipping Sub-Layer", _ssl, {"bleu": 30.49, "sacrebleu": 29.4, "params_m": exp_params(_ssl), "train_hours": 15.41},
        "two-stage; 30.49 is the paper's beam-4 score (30.63 with beam 8: evaluate.sh NAME --beam 8); train h: "
        "stage 2 only (stage 1: gpkd-wmt14-ende-48L-converged)"),
    Row("two-stage training, stage 1 (early-stopped Deep-RPR-48L)", _conv, {"bleu": "-"},
        "not in the table: the converged model every fine-tuning run continues"),
    Row("NIST / WMT Zh-En columns", None, {"bleu": "see paper"}, "data not freely available"),
)))
TABLES.append(Table("gpkd-t4", GPKD, "Table 4: training from scratch vs fine-tuning (validation PPL, BLEU)", (
    Row("Deep-RPR-48L", _p48, {"valid_ppl": 3.52, "bleu": 30.03}, "trained without GP"),
    Row("Scratch: Skipping Sub-Layer", _ssl_s, {"valid_ppl": 3.41, "bleu": 29.82}),
    Row("Scratch: LayerDrop", _ld_s, {"valid_ppl": 3.42, "bleu": 29.65}),
    Row("Scratch: Stochastic Layers", _sl_s, {"valid_ppl": 3.44, "bleu": 29.75}),
    Row("Finetune: Skipping Sub-Layer", _ssl, {"valid_ppl": 3.39, "bleu": 30.49}),
    Row("Finetune: LayerDrop", _ld, {"valid_ppl": 3.47, "bleu": 29.77}),
    Row("Finetune: Stochastic Layers", _sl, {"valid_ppl": 3.44, "bleu": 30.12}),
), note="valid_ppl: the best validation perplexity in the training log (fairseq reports base-2 ppl, as the paper). "
        "Finetune = two-stage: stage 2 continues gpkd-wmt14-ende-48L-converged."))
TABLES.append(Table("gpkd-t5", GPKD, "Table 5: ablation of what is skipped (PPL, single checkpoint, average)", (
    Row("Deep-RPR-48L", _p48, {"valid_ppl": 3.52, "single_bleu": 29.19, "bleu": 30.03}, "trained without GP"),
    Row("Skip FFN", _skip_ffn, {"valid_ppl": 3.45, "single_bleu": 29.61, "bleu": 30.22}),
    Row("Skip SAN", _skip_san, {"valid_ppl": 3.45, "single_bleu": 29.71, "bleu": 30.26}),
    Row("Skip FFN or SAN", _ssl, {"valid_ppl": 3.39, "single_bleu": 29.95, "bleu": 30.49}),
    Row("Skip Layer", _skl, {"valid_ppl": 3.46, "single_bleu": 29.45, "bleu": 29.92}),
)))

# Table 6: Skipping Sub-Layer + GP teachers and their students.  Each student is extracted with the h its
# teacher was GP-trained with, so the four students need four teachers (encoder h, decoder h):
# 24-3 (2, 2), 24-1 (2, 6), 6-6 (8, 1), 6-3 (8, 2).
_T6 = (("GPKD 24-3", "gpkd_student_24_3", 2, 2, 30.40, 5237), ("GPKD 24-1", "gpkd_student_24_1", 2, 6, 30.05, 8116),
       ("GPKD 6-6", "rpr_base_6_6", 8, 1, 30.16, 3817), ("GPKD 6-3", "gpkd_student_6_3", 8, 2, 29.71, 5460))
_tss = {}
for _label, _a, _eh, _dh, _bleu, _speed in _T6:
    _tss[(_eh, _dh)] = gpkd_two_stage_teacher(
        f"gpkd-wmt14-ende-48L-ssl-gp-e{_eh}-d{_dh}-teacher", "rpr_deep_48_6", ("--ssl-rate", "0.4"), _eh, _dh,
        f"GPKD Table 6: Skipping Sub-Layer + GP 48-6 teacher (GP encoder h={_eh}, decoder h={_dh}) of {_label}",
        notes=("one teacher per student: GP with the group sizes that student is extracted with (the paper names "
               "one 'Skipping Sub-Layer + GP' system; which h it used is not stated)",))
_t6 = [
    Row("Fan, Grave, and Joulin (2020) 12-6", None, {"bleu": 30.20, "params_m": 286, "tokens_per_s": 2534}, "cited"),
    Row("Wu et al. (2019b) 8-8", None, {"bleu": 29.92, "params_m": 270, "tokens_per_s": 2044}, "cited"),
    Row("Wei et al. (2020) 18-6", "msc-wmt14-ende-big-18L", {"bleu": 30.56, "params_m": exp_params("msc-wmt14-ende-big-18L")}, "cited; our MSC reproduction"),
    Row("Skipping Sub-Layer + GP 48-6", _tss[(8, 1)], {"bleu": 30.59, "params_m": exp_params(_tss[(8, 1)]), "tokens_per_s": 3092},
        "the GP h=8 teacher (of GPKD 6-6) stands for this row (our choice)"),
]
for _label, _a, _eh, _dh, _bleu, _speed in _T6:
    _n = gpkd_student(f"gpkd-wmt14-ende-{_label.split()[1]}", _tss[(_eh, _dh)], _a, GPKD_BASE, _eh, _dh,
                      f"GPKD Table 6: {_label} (h encoder {_eh}, decoder {_dh})")
    _t6.append(Row(_label, _n, {"bleu": _bleu, "params_m": paper_params(_a), "tokens_per_s": _speed}))
for (_eh, _dh), _n in _tss.items():
    if (_eh, _dh) != (8, 1):
        _t6.append(Row(f"Skipping Sub-Layer + GP 48-6 teacher, GP h encoder {_eh} / decoder {_dh}", _n, {"bleu": "-"},
                       "not in the table: the teacher of the student with these group sizes"))
TABLES.append(Table("gpkd-t6", GPKD, "Table 6: overall results (BLEU, decoding tokens/s)", tuple(_t6)))

# Figures (curves from the training logs, sweeps from results.json; deepnmt-repro plot KEY)
FIG.add(FIG.Figure(
    "gpkd-fig2", GPKD, "GPKD Fig. 2: training and validation PPL of the shallow and the deep model (WMT En-De)",
    "curves", "updates", (("train_ppl", "training PPL"), ("valid_ppl", "validation PPL")),
    (("shallow: Base-RPR-6L", FIG.Run(((_base6, None),))), ("deep: Deep-RPR-48L", FIG.Run(((_p48, None),)))),
    chosen="x = updates (the paper: 'training steps'); one panel per metric with both models, where the paper "
           "has one panel per model with both metrics"))
FIG.add(FIG.Figure(
    "gpkd-fig4", GPKD, "GPKD Fig. 4: training loss of the GPKD and the SKD student (WMT En-De, 48L -> 6-6)",
    "curves", "updates", (("train_loss", "training loss"),),
    (("GPKD", FIG.Run(((_g["48L"][1], "student"),))), ("SKD", FIG.Run(((_g["48L"][0], None),)))),
    chosen="the Table 1 students of the 48-layer teacher (the paper does not say which teacher); fairseq's "
           "label-smoothed training loss (base 2)"))
_fig5_rows, _fig5 = [], {"6-layer encoder": [], "48-layer encoder": []}
for _dec in (1, 2, 3, 6, 9, 12):
    if _dec == 6:
        _n = _base6
    else:
        _n = _single(f"gpkd-wmt14-ende-fig5-6-{_dec}", GPKD, "wmt14-en-de-gpkd", "rpr_base_6_6", GPKD_BASE, GPKD_EVAL,
                     f"GPKD Fig. 5: Base-RPR 6-{_dec}", model_flags=RPR_DROP + ("--decoder-layers", str(_dec)),
                     notes=("Fig. 5: BLEU and speed against decoder depth on a shallow encoder; the depth grid is ours",))
    _fig5["6-layer encoder"].append(FIG.Point(_dec, _n))
    _fig5_rows.append(Row(f"6-{_dec}", _n, {"bleu": "fig."}))
for _dec, _n in ((1, _d481), (3, _d483), (6, _p48)):
    _fig5["48-layer encoder"].append(FIG.Point(_dec, _n))
    _fig5_rows.append(Row(f"48-{_dec}", _n, {"bleu": "fig."}))
TABLES.append(Table("gpkd-fig5", GPKD, "Figure 5: BLEU and decoding speed against decoder depth (WMT En-De)",
                    tuple(_fig5_rows), note="Values only in the figure; the 48-layer points are Table 2's systems."))
FIG.add(FIG.Figure(
    "gpkd-fig5", GPKD, "GPKD Fig. 5: BLEU and translation speed against decoder depth (WMT En-De)", "sweep",
    "decoder layers", (("bleu", "BLEU"), ("tokens_per_s", "tokens/s")),
    tuple((k, tuple(v)) for k, v in _fig5.items()),
    chosen="decoder depths 1, 2, 3, 6, 9, 12 on the 6-layer encoder and 1, 3, 6 on the 48-layer one (Table 2's "
           "systems); speed = fairseq-generate tokens/s with the paper's beam 4 and batch 64"))
TABLES.append(Table("gpkd-fig2", GPKD, "Figure 2: training / validation PPL over training, shallow vs deep", (
    Row("shallow: Base-RPR-6L", _base6, {"valid_ppl": "fig."}), Row("deep: Deep-RPR-48L", _p48, {"valid_ppl": "fig."}),
), note="Curves from the runs' train.log; 'Clearly, the deep model (48-layer encoder) appears to overfit.'"))
TABLES.append(Table("gpkd-fig4", GPKD, "Figure 4: training loss of the GPKD and SKD students", (
    Row("GPKD (48L -> 6-6)", _g["48L"][1], {"bleu": "fig."}), Row("SKD (48L -> 6-6)", _g["48L"][0], {"bleu": "fig."}),
), note="Curves from the students' train.log ('GPKD obtains a much lower training loss than SKD')."))
TABLES.append(Table("gpkd-fig6", GPKD, "Figure 6: validation PPL before / after the Skipping Sub-Layer", (
    Row("before: Deep-RPR-48L", _p48, {"valid_ppl": 3.52}),
    Row("after, stage 1 (early-stopped)", _conv, {"valid_ppl": "fig."}),
    Row("after, stage 2 (skipping)", _ssl, {"valid_ppl": 3.39}),
), note="Validation PPL per validation from train.log; the paper's numbers are Table 4's best PPLs."))
FIG.add(FIG.Figure(
    "gpkd-fig6", GPKD, "GPKD Fig. 6: validation PPL before (Deep-RPR-48L) and after the Skipping Sub-Layer (WMT En-De)",
    "curves", "updates", (("valid_ppl", "validation PPL"),),
    (("before: Deep-RPR-48L", FIG.Run(((_p48, None),))),
     ("after: Skipping Sub-Layer (stage 1, then stage 2)", FIG.Run(((_conv, None), (_ssl, None))))),
    chosen="x = updates; the 'after' curve is the early-stopped stage 1 followed by the skipping stage 2 "
           "(En-De only: the Zh-En data are not freely available)"))


# ======================================================================================
def check_registry() -> None:
    """Every row points at an existing experiment and every reference at an existing stage."""
    for table in TABLES:
        for row in table.rows:
            if row.experiment is not None and row.experiment not in EXPERIMENTS:
                raise ValueError(f"{table.key} row {row.label!r}: unknown experiment {row.experiment}")
    for exp in EXPERIMENTS.values():
        for ref in exp.refs():
            target = EXPERIMENTS[ref.experiment] if ref.experiment else exp
            stage = target.stage(ref.stage)
            want = {"skd": "skd", "student": "extract", "model": "train", "last": "train", "resume": "train",
                    "dir": stage.kind}[ref.what]
            if stage.kind != want:
                raise ValueError(f"{exp.name}: reference {ref} points at a {stage.kind} stage")


check_registry()


def rows_of(name: str) -> List[Tuple[Table, Row]]:
    return [(t, r) for t in TABLES for r in t.rows if r.experiment == name]

