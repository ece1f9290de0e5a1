"""Deep decoder: cross-attention drop (CAD) + collapse-reducing training (CRT), Tables 1-3 and
Figs. 1-4 (WMT14 En->De, En->Fr)."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

from ...models.architectures import cad_defaults
from ...models.deep_transformer import MODEL_NAME
from ..spec import Choice, EvalSpec, Figure, Point, Recipe, Row, Table, vaswani_lr
from .common import CR, DD, VASWANI_NOTES, add_figure, arch_name, exp_params, paper_params, single

# Rows whose params_m is the table's own number, not the architecture's paper count
# (PAPER_ROWS), and why.  Key: (table key, row label), or (table key, None) for a whole table.
OWN_PARAM_COUNTS: Dict[Tuple[str, object], str] = {
    ("dd-t1-enfr", None): "the En→Fr models' counts (their own 40k En-Fr vocabulary); the architectures carry "
                          "the En→De counts",
    ("dd-t1-ende", "BIG (Pre-Norm) (BIG) 6-6"): "the deep-decoder paper's 210M for the big pre-norm 6-6 model; "
                                                "prenorm_wmt_big_6l carries MSC Table 4's 211M",
}

# Criterion flag sets: Sec. 3.4 CRT = DDR + ALD.  The paper gives no loss weights ("joint model optimization"):
# the unweighted sum, alpha_DDR = alpha_ALD = 1 (our reading, the criterion's defaults); p_ALD and tau are not in
# the paper either (criterion docstring: p_ALD 0.3, tau 0.1, Fig. 3).  CRT_ALD_HALF is our earlier weighting.
CRT = ("--ddr-alpha", "1.0", "--ald-alpha", "1.0", "--ald-p", "0.3", "--ald-tau", "0.1")
CRT_ALD_HALF = ("--ddr-alpha", "1.0", "--ald-alpha", "0.5", "--ald-p", "0.3", "--ald-tau", "0.1")
DDR_ONLY = ("--ddr-alpha", "1.0", "--ald-alpha", "0")
ALD_ONLY = ("--ddr-alpha", "0", "--ald-alpha", "1.0", "--ald-p", "0.3", "--ald-tau", "0.1")

DD_BASE = Recipe(
    lr=vaswani_lr(512, 4000), warmup_updates=4000, max_update=200000, tokens_per_update=32768,
    adam_betas="(0.9, 0.98)", save="updates:1000", keep=20,
    notes=(("tokens_per_update", "Sec. 4.1: 4096 tokens per GPU on 8 V100 = 32768 per update"),
           ("max_update", "Sec. 4.1: 200K steps En->De, 400K En->Fr"),
           ("lr", "'other hyperparameters consistent with Vaswani et al. (2017)': peak d^-0.5*w^-0.5 with w=4000"),
           ("save", "Vaswani: checkpoints every 10 minutes, last 5 (base) / 20 (big) averaged; ours every 1000 updates"),
           ("adam_betas", "(0.9, 0.98), Vaswani et al. 2017"),
           ) + VASWANI_NOTES,
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
_CRT_NOTE = ("CRT = DDR + ALD (criterion collapse_reducing) as their unweighted sum, alpha_DDR = alpha_ALD = 1: "
             "the paper gives no weights, it adds both losses 'for joint model optimization' (Sec. 1), our reading; "
             "p_ALD 0.3, tau 0.1 are not in the paper either (criterion docstring)")
# p_net = 1.0: what the layers 1..L_dr are at inference
_RATIO1_NOTE = ("p_net = 1.0, our reading: 'with probability p_net^l, only self-attention is used ... During the "
                "inference stage, both attentions are used' (Sec. 3.3); at p_net = 1 a layer's cross-attention would "
                "never be trained, so layers 1..L_dr are built without it and have none at inference either (an "
                "untrained cross-attention used only at inference would add random projections of the source)")


def dd_name(pair: str, size: str, enc: int, dec: int, suffix: str = "") -> str:
    return f"dd-wmt14-{pair}-{size}-{enc}-{dec}" + (f"-{suffix}" if suffix else "")


def _dd_arch(size, enc, dec, cad=False):
    if (enc, dec) == (6, 6):
        return "prenorm_wmt_base_6l" if size == "base" else "prenorm_wmt_big_6l"
    return arch_name("dd", size, enc, dec, cad)


def _table1_rows(pair: str, ds: str) -> List[Row]:
    rows = []
    for label, size, enc, dec, cad, de, fr in _DD_T1:
        recipe = (DD_BIG if size == "big" else DD_BASE)
        flags: Tuple[str, ...] = ()
        notes = ["joint BPE 40K, valid newstest2012+2013, test newstest2014 (Sec. 4.1)"]
        if pair == "enfr":
            recipe = recipe.with_(max_update=400000)
            if size == "big":
                flags = ("--dropout", "0.1")
                notes.append("dropout 0.1 for En-Fr big (Vaswani et al. 2017)")
        if cad:
            notes += [_CAD_NOTE, _CRT_NOTE]
        name = dd_name(pair, size, enc, dec, "cad-crt" if cad else "")
        arch = _dd_arch(size, enc, dec, cad)
        single(name, DD, ds, arch, recipe, dd_eval(pair, size == "big"),
               f"Deep-decoder Table 1: {label} {size} {enc}-{dec} ({pair})", model_flags=flags,
               criterion=CR if cad else "label_smoothed_cross_entropy", criterion_flags=CRT if cad else (),
               notes=notes)
        params, hours, bleu, sacre = de if pair == "ende" else fr
        params = paper_params(arch) if params is None else params
        rows.append(Row(f"{label} ({size.upper()}) {enc}-{dec}", name,
                        {"bleu": bleu, "sacrebleu": sacre, "params_m": params, "train_hours": hours}))
    return rows


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


def _cited_rows(pair: str) -> List[Row]:
    rows = []
    for label, de, fr, exp in _DD_CITED:
        v = de if pair == "ende" else fr
        if v is None:
            continue
        paper = {"bleu": v[1], "params_m": exp_params(exp) if v[0] is None else v[0]}
        if v[2] is not None:
            paper["sacrebleu"] = v[2]
        rows.append(Row(label, exp, paper, "cited; our MSC reproduction (32k BPE data)" if exp else "cited; not implemented here"))
    return rows


def _table1() -> List[Table]:
    own = {pair: _table1_rows(pair, ds) for pair, ds in (("ende", "wmt14-en-de-dd"), ("enfr", "wmt14-en-fr"))}
    return [Table(f"dd-t1-{pair}", DD, "Table 1: WMT14 " + ("En→De" if pair == "ende" else "En→Fr") +
                  " (multi-bleu.perl BLEU, detokenized sacreBLEU, training hours)", tuple(_cited_rows(pair) + own[pair]))
            for pair in ("ende", "enfr")]


def _table2() -> Table:
    """Balance of encoder and decoder depth (30 layers in all)."""
    single(dd_name("ende", "base", 6, 24, "cad-crt"), DD, "wmt14-en-de-dd", _dd_arch("base", 6, 24, True), DD_BASE,
           dd_eval("ende", False), "Deep-decoder Table 2: 6-24 with CAD+CRT", criterion=CR, criterion_flags=CRT,
           notes=(_CAD_NOTE, _CRT_NOTE))
    return Table("dd-t2", DD, "Table 2: encoder/decoder depth with 30 layers in all, WMT14 En→De", (
        Row("24-6", dd_name("ende", "base", 24, 6), {"bleu": 28.95, "sacrebleu": 27.8}, "= Table 1 DeepE 24-6"),
        Row("6-24", dd_name("ende", "base", 6, 24, "cad-crt"), {"bleu": 28.21, "sacrebleu": 27.0}, "with CAD+CRT"),
        Row("15-15", dd_name("ende", "base", 15, 15, "cad-crt"), {"bleu": 29.09, "sacrebleu": 28.1},
            "= Table 1 DEEP+CAD+CRT 15-15"),
    ))


# Table 3: ablations on BASE, DEEP-30L (15-15)
_DD_T3 = [
    ("+R-Drop", "rdrop", False, ("--ddr-alpha", "5.0", "--ald-alpha", "0"), 0.97, 0.5,
     "R-Drop (Liang et al. 2021) approximated by DDR with alpha 5 (R-Drop's WMT value) on a model without CAD; "
     "our criterion shares one encoder pass between the two predictions, R-Drop runs the whole model twice"),
    ("+DDR", "ddr", False, DDR_ONLY, 1.01, 0.4, "DDR alone, alpha 1.0"),
    ("+ALD", "ald", False, ALD_ONLY, 1.45, 0.7, "ALD alone, alpha 1.0"),
    ("+CAD", "cad", True, None, 28.35, 27.2, "CAD alone, label-smoothed cross-entropy"),
    ("-CAD", "crt", False, CRT, 1.39, 0.7, "DDR + ALD without CAD"),
    ("-DDR", "cad-ald", True, ALD_ONLY, 28.77, 27.6, "CAD + ALD"),
    ("-ALD", "cad-ddr", True, DDR_ONLY, 28.52, 27.4, "CAD + DDR"),
]


_ALD_HALF_NOTE = ("the full model with our earlier loss weights, alpha_DDR 1, alpha_ALD 0.5 (the per-sentence J_ALD "
                  "starts at log 2, so 0.5 keeps the cross-entropy dominant), against the unweighted sum the other "
                  "rows run; neither weighting is in the paper")


def _table3() -> Table:
    rows = [Row("BASE, DEEP-30L", dd_name("ende", "base", 15, 15), {"bleu": 0.55, "sacrebleu": 0.2}, "= Table 1 DEEP 15-15")]
    for label, suffix, cad, crit, bleu, sacre, note in _DD_T3:
        name = dd_name("ende", "base", 15, 15, suffix)
        single(name, DD, "wmt14-en-de-dd", _dd_arch("base", 15, 15, cad), DD_BASE,
               dd_eval("ende", False), f"Deep-decoder Table 3: BASE, DEEP-30L {label}",
               criterion=CR if crit else "label_smoothed_cross_entropy", criterion_flags=crit or (),
               notes=(note,) + ((_CAD_NOTE,) if cad else ()))
        rows.append(Row(label, name, {"bleu": bleu, "sacrebleu": sacre}, note))
        if label == "+CAD":
            rows.append(Row("BASE, DEEP-30L-Full", dd_name("ende", "base", 15, 15, "cad-crt"),
                            {"bleu": 29.09, "sacrebleu": 28.1}, "= Table 1 DEEP+CAD+CRT 15-15"))
    half = dd_name("ende", "base", 15, 15, "cad-crt-ald0.5")
    single(half, DD, "wmt14-en-de-dd", _dd_arch("base", 15, 15, True), DD_BASE, dd_eval("ende", False),
           "Deep-decoder Table 3 variant: BASE, DEEP-30L-Full with alpha_ALD 0.5 (our earlier weighting)",
           criterion=CR, criterion_flags=CRT_ALD_HALF, notes=(_ALD_HALF_NOTE, _CAD_NOTE))
    rows.append(Row("variant (not in the paper): DEEP-30L-Full, α_ALD 0.5", half, {"bleu": "-"}, _ALD_HALF_NOTE))
    return Table("dd-t3", DD, "Table 3: ablations, WMT14 En→De, BASE DEEP-30L (15-15)", tuple(rows))


# Figures 2-4 as sweeps (every point is an ordinary experiment)
def _figure2() -> Tuple[Table, Figure]:
    rows = []
    for depth in (3, 6, 9, 12, 15, 18, 21, 24, 27):
        for ratio in (0.25, 0.5, 0.75, 1.0):
            if depth == 27 and ratio == 1.0:
                continue  # no decoder layer would ever see the source
            name = f"dd-fig2-base-27-27-depth{depth}-ratio{ratio:g}"
            single(name, DD, "wmt14-en-de-dd", _dd_arch("base", 27, 27), DD_BASE, dd_eval("ende", False),
                   f"Deep-decoder Fig. 2: BASE DEEP-54L, CAD drop depth {depth}, ratio {ratio:g}, + ALD",
                   model_flags=("--cad-drop-depth", str(depth), "--cad-drop-ratio", f"{ratio:g}"),
                   criterion=CR, criterion_flags=ALD_ONLY,
                   notes=("Sec. 4.3: 'BASE, DEEP-54L model with both CAD and ALD techniques' (no DDR)",
                          "the grid (depths 3..27 step 3, ratios 0.25..1) is ours; the figure's points are not in the text")
                   + ((_RATIO1_NOTE,) if ratio == 1.0 else ()))
            rows.append(Row(f"drop depth {depth}, ratio {ratio:g}", name, {"bleu": "fig."},
                            _RATIO1_NOTE if ratio == 1.0 else ""))
    lines: Dict[str, List[Point]] = {}
    for r in rows:
        m = re.search(r"depth(\d+)-ratio([0-9.]+)$", r.experiment)
        lines.setdefault(f"drop ratio {m.group(2)}", []).append(Point(int(m.group(1)), r.experiment))
    figure = Figure(
        "dd-fig2", DD, "Deep-decoder Fig. 2: BLEU vs CAD drop depth per drop ratio (BASE DEEP-54L, CAD + ALD)", "sweep",
        "drop depth L_dr (of 27 decoder layers)", (("bleu", "BLEU"),), tuple((k, tuple(v)) for k, v in lines.items()),
        chosen="depths 3..27 step 3 and ratios 0.25/0.5/0.75/1.0 (the text states only the peak at 21 and ratio 1.0)")
    return Table("dd-fig2", DD, "Figure 2: drop depth x drop ratio, BASE DEEP-54L (27-27), CAD + ALD",
                 tuple(rows), note="Peak at drop depth 21 (Sec. 4.3); values only in the figure."), figure


# Fig. 2 under the letter of Sec. 3.3 (--cad-reading literal): p^l = p_net up to the drop depth, 1.0 above it
# (never used in training), every cross-attention used at inference.  p_net = 1.0 is p^l = 1 in every layer
# under the letter (no cross-attention would ever be trained; the model refuses it), so the grid has no ratio-1 line.
_LITERAL_NOTE = ("--cad-reading literal, the letter of Sec. 3.3: 'p_net^l = p_net, 1 <= l <= L_dr ... p_net^l = 1.0 "
                 "for layers l > L_dr' and 'During the inference stage, both attentions are used': layers above the "
                 "drop depth never use their cross-attention in training and all layers use it at inference; the "
                 "default rows (dd-fig2) run our reading (p^l = 0 above L_dr, modules/cross_attention_drop.py)")
_LITERAL_NO_RATIO1 = ("no p_net = 1.0 line: under the letter it means p^l = 1 in every layer, no cross-attention "
                      "ever trained (refused by the model)")


def _figure2_literal() -> Tuple[Table, Figure]:
    rows = []
    lines: Dict[str, List[Point]] = {}
    for ratio in (0.25, 0.5, 0.75):
        for depth in (3, 6, 9, 12, 15, 18, 21, 24, 27):
            if depth == 27:  # no layer above the drop depth: both readings build and run the same model
                name = f"dd-fig2-base-27-27-depth27-ratio{ratio:g}"
                rows.append(Row(f"literal: drop depth 27, ratio {ratio:g}", name, {"bleu": "fig."},
                                "= dd-fig2's run: at full depth both readings are the same model"))
                lines.setdefault(f"drop ratio {ratio:g} (literal)", []).append(Point(depth, name))
                continue
            name = f"dd-fig2-literal-base-27-27-depth{depth}-ratio{ratio:g}"
            single(name, DD, "wmt14-en-de-dd", _dd_arch("base", 27, 27), DD_BASE, dd_eval("ende", False),
                   f"Deep-decoder Fig. 2, literal reading: BASE DEEP-54L, CAD drop depth {depth}, ratio {ratio:g}, "
                   "+ ALD",
                   model_flags=("--cad-drop-depth", str(depth), "--cad-drop-ratio", f"{ratio:g}",
                                "--cad-reading", "literal"),
                   criterion=CR, criterion_flags=ALD_ONLY,
                   notes=("Sec. 4.3: 'BASE, DEEP-54L model with both CAD and ALD techniques' (no DDR)",
                          _LITERAL_NOTE, _LITERAL_NO_RATIO1,
                          "the grid (depths 3..27 step 3, ratios 0.25..0.75) is ours; the figure's points are not "
                          "in the text"))
            rows.append(Row(f"literal: drop depth {depth}, ratio {ratio:g}", name, {"bleu": "fig."}))
            lines.setdefault(f"drop ratio {ratio:g} (literal)", []).append(Point(depth, name))
    figure = Figure(
        "dd-fig2-literal", DD, "Deep-decoder Fig. 2, literal reading of Sec. 3.3 (p^l = 1.0 above the drop depth): "
        "BLEU vs CAD drop depth per drop ratio (BASE DEEP-54L, CAD + ALD)", "sweep",
        "drop depth L_dr (of 27 decoder layers)", (("bleu", "BLEU"),), tuple((k, tuple(v)) for k, v in lines.items()),
        chosen="depths 3..27 step 3 and ratios 0.25/0.5/0.75 under --cad-reading literal; " + _LITERAL_NO_RATIO1)
    return Table("dd-fig2-literal", DD, "Figure 2 variant: the literal reading of Sec. 3.3 (--cad-reading literal), "
                 "BASE DEEP-54L (27-27), CAD + ALD", tuple(rows),
                 note="Not a separate figure of the paper: Fig. 2's grid run with p^l = 1.0 above the drop depth "
                      "and every cross-attention used at inference, the words of Sec. 3.3. At depth 27 both readings "
                      "are the same model (no layer above the drop depth): those points are dd-fig2's runs."), figure


def _figure3() -> Tuple[Table, Figure]:
    rows = []
    for p, tau in [(0.1, 0.1), (0.2, 0.1), (0.3, 0.1), (0.4, 0.1), (0.3, 0.05), (0.3, 0.2), (0.3, 0.5)]:
        name = f"dd-fig3-base-15-15-pald{p:g}-tau{tau:g}"
        single(name, DD, "wmt14-en-de-dd", _dd_arch("base", 15, 15, True), DD_BASE, dd_eval("ende", False),
               f"Deep-decoder Fig. 3: BASE DEEP-30L, p_ALD {p:g}, tau {tau:g}", criterion=CR,
               criterion_flags=("--ddr-alpha", "1.0", "--ald-alpha", "1.0", "--ald-p", f"{p:g}", "--ald-tau", f"{tau:g}"),
               notes=("full CAD+CRT model with p_ALD / tau varied (one at a time around p 0.3, tau 0.1; our grid)",
                      _CAD_NOTE, _CRT_NOTE))
        rows.append(Row(f"p_ALD {p:g}, tau {tau:g}", name, {"bleu": "fig."}))
    by_p = tuple(Point(float(re.search(r"pald([0-9.]+)", r.experiment).group(1)), r.experiment)
                 for r in rows if r.experiment.endswith("tau0.1"))
    by_tau = tuple(Point(float(re.search(r"tau([0-9.]+)$", r.experiment).group(1)), r.experiment)
                   for r in rows if "pald0.3-" in r.experiment)
    figure = Figure(
        "dd-fig3", DD, "Deep-decoder Fig. 3: BLEU vs p_ALD (tau 0.1) and vs tau (p_ALD 0.3), BASE DEEP-30L", "sweep",
        "p_ALD (left line) / tau (right line)", (("bleu", "BLEU"),),
        (("p_ALD, tau = 0.1", by_p), ("tau, p_ALD = 0.3", by_tau)),
        chosen="p_ALD 0.1..0.4 at tau 0.1 and tau 0.05/0.1/0.2/0.5 at p_ALD 0.3 (the text names tau 0.05 and 0.1 only)")
    return Table("dd-fig3", DD, "Figure 3: ALD sampling threshold p_ALD and temperature tau, BASE DEEP-30L",
                 tuple(rows), note="Sec. 4.3: BLEU rises with p_ALD then falls; tau 0.05 slightly below 0.1."), figure


def _figure4() -> Tuple[Table, Figure]:
    rows = []
    for side in ("enc", "dec"):
        for n in (1, 3, 6, 9, 12, 18, 21, 24):
            enc, dec = (n, 15) if side == "enc" else (15, n)
            depth, ratio = cad_defaults(dec)
            name = f"dd-fig4-base-{enc}-{dec}-cad-crt"
            single(name, DD, "wmt14-en-de-dd", MODEL_NAME, DD_BASE, dd_eval("ende", False),
                   f"Deep-decoder Fig. 4: {enc} encoder / {dec} decoder layers, CAD+CRT",
                   model_flags=("--encoder-layers", str(enc), "--decoder-layers", str(dec), "--share-all-embeddings",
                                "--cad-drop-depth", str(depth), "--cad-drop-ratio", f"{ratio:g}"),
                   criterion=CR, criterion_flags=CRT,
                   notes=("BASE, DEEP-30L with only the encoder or only the decoder depth changed (Sec. 4.3); "
                          "the depth grid is ours", _CAD_NOTE, _CRT_NOTE))
            rows.append(Row(f"{enc}-{dec}", name, {"bleu": "fig."}))
    rows.append(Row("15-15", dd_name("ende", "base", 15, 15, "cad-crt"), {"bleu": 29.09}, "= Table 1"))
    lines = {"encoder depth (decoder 15)": [], "decoder depth (encoder 15)": []}
    for r in rows:
        e, d = (int(x) for x in r.label.split("-"))
        if r.label == "15-15":
            for k in lines:
                lines[k].append(Point(15, r.experiment))
        elif d == 15:
            lines["encoder depth (decoder 15)"].append(Point(e, r.experiment))
        else:
            lines["decoder depth (encoder 15)"].append(Point(d, r.experiment))
    table = Table("dd-fig4", DD, "Figure 4: encoder depth vs decoder depth (the other fixed at 15), CAD+CRT",
                  tuple(rows))
    return table, Figure(
        "dd-fig4", DD, "Deep-decoder Fig. 4: BLEU vs encoder / decoder depth (the other 15), CAD + CRT", "sweep",
        "layers", (("bleu", "BLEU"),), tuple((k, tuple(sorted(v, key=lambda p: p.x))) for k, v in lines.items()),
        chosen="depths 1..24 (the text names depth 1 only)")


# Fig. 1: training PPL and BLEU vs decoder depth after 200K steps, "except for the number of decoder layers, other
# hyperparameters were kept consistent with ... the Transformer-based model setting" (6-layer encoder), without
# the methods (the collapse) and with CAD + CRT (what the methods change)
_FIG1_DEPTHS = (6, 9, 12, 15, 18, 21, 24, 27)


def _figure1() -> Tuple[Table, Figure]:
    lines = {"plain": [], "cad-crt": []}
    rows = []
    for dec in _FIG1_DEPTHS:
        for method in ("plain", "cad-crt"):
            if dec == 6 and method == "cad-crt":
                continue  # 6-6 is the baseline itself (no deep decoder to fix)
            if dec == 6:
                name = dd_name("ende", "base", 6, 6)
            elif dec == 24 and method == "cad-crt":
                name = dd_name("ende", "base", 6, 24, "cad-crt")  # Table 2's 6-24
            else:
                name = f"dd-fig1-base-6-{dec}" + ("-cad-crt" if method == "cad-crt" else "")
                flags = ("--encoder-layers", "6", "--decoder-layers", str(dec), "--share-all-embeddings")
                if method == "cad-crt":
                    depth, ratio = cad_defaults(dec)
                    flags += ("--cad-drop-depth", str(depth), "--cad-drop-ratio", f"{ratio:g}")
                single(name, DD, "wmt14-en-de-dd", MODEL_NAME, DD_BASE, dd_eval("ende", False),
                       f"Deep-decoder Fig. 1: 6-layer encoder, {dec}-layer decoder" + (", CAD+CRT" if method == "cad-crt" else ""),
                       model_flags=flags, criterion=CR if method == "cad-crt" else "label_smoothed_cross_entropy",
                       criterion_flags=CRT if method == "cad-crt" else (),
                       notes=("Sec. 3.2 / Fig. 1: BASE setting, only the decoder depth changes, 200K updates; the "
                              "depth grid and the pre-norm layers (as Table 1's BASE) are ours",)
                       + ((_CAD_NOTE, _CRT_NOTE) if method == "cad-crt" else ()))
            lines[method].append((dec, name))
            rows.append(Row(f"6-{dec}" + (" + CAD + CRT" if method == "cad-crt" else ""), name, {"bleu": "fig."}))
    lines["cad-crt"].insert(0, (6, dd_name("ende", "base", 6, 6)))  # both lines start at the 6-6 baseline
    figure = Figure(
        "dd-fig1", DD, "Deep-decoder Fig. 1: training PPL and BLEU vs decoder depth (WMT14 En-De, 6-layer encoder)",
        "sweep", "decoder layers", (("last_train_ppl", "training PPL"), ("bleu", "BLEU (multi-bleu.perl)")),
        (("Transformer BASE (pre-norm)", tuple(Point(d, n) for d, n in lines["plain"])),
         ("+ CAD + CRT", tuple(Point(d, n) for d, n in lines["cad-crt"]))),
        chosen="decoder depths 6..27 step 3 (the paper prints no grid); training PPL = the last logged training "
               "perplexity of the run; the CAD + CRT line is added")
    return Table("dd-fig1", DD, "Figure 1: training PPL and BLEU vs decoder depth (6-layer encoder), without and "
                 "with CAD + CRT", tuple(rows),
                 note="The paper's Fig. 1 shows the plain model only; the CAD + CRT line is the issue's "
                      "'with and without the methods'. Training PPL is the last logged training perplexity."), figure


#: the deep-decoder procedure: our choice next to the paper's text, where it is silent or open (docs/reproduction.md)
PROCEDURE: Tuple[Choice, ...] = (
    Choice("CRT weights",
           'Sec. 3.4 defines J_DDR and J_ALD but prints no weights; Sec. 1 adds them "for joint model '
           'optimization"',
           "the unweighted sum, α_DDR = α_ALD = 1 (the criterion's defaults); our earlier α_ALD 0.5 is the "
           "variant row `dd-wmt14-ende-base-15-15-cad-crt-ald0.5`"),
    Choice("p_ALD, τ",
           '"0 < p_ALD < 0.5"; Fig. 3: "τ = 0.05 is slightly lower than that with τ = 0.1"',
           "p_ALD 0.3, τ 0.1"),
    Choice("CAD drop depth / ratio",
           'Fig. 2: peak "at the 21st layer" of 27; "with a greater drop depth, a smaller p_net ... will achieve '
           'better results"',
           "depth round(21/27 · L_dec), ratio 0.5 (`cad_defaults`)"),
    Choice("CAD at p_net = 1.0",
           '"with probability p_net^l, only self-attention is used ... During the inference stage, both '
           'attentions are used"',
           "layers 1..L_dr are built without cross-attention, so they have none at inference either: at p_net = 1"
           " it would never be trained (our reading; `modules/cross_attention_drop.py`)"),
    Choice("HIERTRANS (MSC Table 6)",
           '"both a sentence-level and a document-level transformer encoders, as well as a standard transformer '
           'decoder ... (each of them have L = 18, emb=512, ffn=1024, head=8)", no citation',
           "`--arch hiertrans_cnndm_36l`: sentences end at `. ! ?` and EOS; the sentence-level encoder attends "
           "within each sentence, positions counted per sentence; a sentence's vector is its end token's state "
           "(as HIBERT, cited in Table 6); the document-level encoder runs over sentence vectors plus sentence "
           "positions; the 6-layer decoder (TRANSFORMER's and MSC's) attends to token and sentence states "
           "concatenated (our readings; `models/hiertrans.py`)"),
    Choice("CAD above the drop depth",
           '"we adopted a same fixed p_net for layers 1 ≤ l ≤ L_dr ..., while set p_net^l = 1.0 for layers l > '
           'L_dr"; Sec. 4.3: too large a drop depth leaves "insufficient cross-attention"',
           "p^l = 0 above L_dr (our reading, `--cad-reading consistent`, the default), the only one that agrees "
           "with Sec. 4.3; the letter (p^l = 1.0 above L_dr, every cross-attention used at inference) is "
           "`--cad-reading literal`, run by the `dd-fig2-literal` variant (no p_net = 1.0 line: under the letter "
           "no cross-attention would ever be trained)"),
    Choice("Fig. 1",
           '"training perplexity ... and BLEU score ... with different decoder depths after 200K training steps"',
           "6-layer pre-norm encoder, decoder depths 6..27 step 3, without and with CAD + CRT; training PPL = the"
           " last logged one"),
    Choice("Fig. 2 / 3 / 4 grids",
           "only the peak (21), ratio 1.0 and τ 0.05 / 0.1 are named",
           "depths 3..27 step 3 × ratios 0.25-1.0; p_ALD 0.1-0.4 at τ 0.1 and τ 0.05-0.5 at p_ALD 0.3; encoder / "
           "decoder depths 1..24 with the other at 15"),
    Choice("headline metric",
           '"We used multi-bleu.perl and detokenized sacreBLEU" (no compound splitting mentioned)',
           "`tok_bleu` (multi-bleu.perl on the tokenized output); compound-split BLEU and sacreBLEU beside it"),
    Choice("marking",
           "—",
           "the deep-decoder tables print each run's CAD/CRT values with `*` on every value the paper does not "
           "print and `†` on our readings of its words (loss weights 1, p_net 1)"),
)


def tables() -> List[Table]:
    """Add the deep-decoder paper's experiments and figures; its tables."""
    out = _table1() + [_table2(), _table3()]
    figs = [_figure2(), _figure2_literal(), _figure3(), _figure4(), _figure1()]  # Fig. 1 reuses Table 2's 6-24 run
    out += [table for table, _ in figs]
    for _, figure in sorted(figs, key=lambda tf: tf[1].key):
        add_figure(figure)
    return out
