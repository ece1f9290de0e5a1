"""GPKD and the skipping sub-layer (Li et al. 2021): Tables 1-6 and Figs. 2, 4-6, WMT En-De (the Zh-En
data are not freely available)."""

from __future__ import annotations

from dataclasses import replace
from typing import List, Tuple

from ...jobs.fairseq_argv import gp_flags
from ..spec import (Choice, EvalSpec, ExtractStage, Experiment, Figure, Point, Ref, Row, Run, SkdStage, Table,
                    TrainStage)
from .common import (
    GPKD, WANG_2019A, WANG_2019A_DROPOUT, add, add_figure, exp_params, paper_params, single, wmt_ende_eval,
)

GPKD_BASE = replace(
    WANG_2019A, max_update=50000,
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
RPR_DROP = WANG_2019A_DROPOUT  # Wang et al. (2019a)'s attention / ReLU dropout
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
# training until the model converges again."  Neither the patience nor the second stage's length is given; Table 3
# gives Deep-RPR-48L and '+ Skipping Sub-Layer' the same 50K updates (and the latter less time), so both stages share
# the Deep schedule's 50K updates: stage 2 continues stage 1's update count up to the same --max-update.
GPKD_PATIENCE = 3
_STAGE1_NOTE = (f"two-stage training, stage 1: trained as usual, early-stopped when the validation loss has not "
                f"improved for {GPKD_PATIENCE} validations (one per epoch; --patience {GPKD_PATIENCE}, our value: "
                "the paper says 'early stop it when the model converges on the validation set'), within the 50K-update "
                "Deep schedule")
_STAGE2_NOTE = ("two-stage training, stage 2: starts from stage 1's averaged model (last 5 epoch checkpoints, the "
                "model the paper evaluates) with stage 1's Adam state, learning-rate schedule and update count "
                "(--continue-once on an average written with --keep-training-state), so the inverse-sqrt schedule "
                "goes on where stage 1 stopped instead of warming up to the peak rate again ('continue training "
                f"until the model converges again': --patience {GPKD_PATIENCE}); both stages together stay within "
                "the Deep schedule's 50K updates (--max-update 50000 counts from stage 1's first update), the budget "
                "Table 3 gives both Deep-RPR-48L and '+ Skipping Sub-Layer', so a two-stage gain is not owed to "
                "more training; how the 50K split between the stages is stage 1's early stop (the paper does not "
                "split them; if stage 1 does not stop early, stage 2 has no updates left)")
GPKD_STAGE1 = GPKD_BASE.with_(patience=GPKD_PATIENCE)
GPKD_STAGE2 = GPKD_BASE.with_(patience=GPKD_PATIENCE)  # the same 50K in all: --continue-once keeps the count
_SCRATCH_NOTE = "from scratch (Table 4 'Scratch'): the method on from update 0, 50K updates, no GP"


def _gp_flags(enc_h: int, dec_h: int = 1) -> Tuple[str, ...]:
    """GPKD's group-permutation flags (the one definition: deepnmt_fairseq/jobs/fairseq_argv.py), as a tuple."""
    return tuple(gp_flags(enc_h, dec_h))


def gpkd_teacher(name, arch, recipe, enc_h=1, dec_h=1, title="", notes=()) -> str:
    """A deep model and its SKD data: plain (enc_h = dec_h = 1, the baseline rows) or GP-trained with
    the group sizes its students are extracted with."""
    stages = (TrainStage(arch=arch, recipe=recipe, name="train", model_flags=RPR_DROP + _gp_flags(enc_h, dec_h)),
              SkdStage(teacher=Ref(None, "train", "model")))
    return add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=stages, eval=GPKD_EVAL, title=title,
                           notes=((_GP_NOTE if enc_h > 1 or dec_h > 1 else _PLAIN_NOTE), _SKD_NOTE) + tuple(notes)))


def gpkd_two_stage_teacher(name, arch, skip_flags, enc_h, dec_h, title, notes=()) -> str:
    """Skipping Sub-Layer + GP teacher (Table 6): stage 'converge' GP-trained and early-stopped, stage
    'train' continues it with skipping and GP, then its SKD data."""
    gp = _gp_flags(enc_h, dec_h)
    stages = (TrainStage(arch=arch, recipe=GPKD_STAGE1, name="converge", model_flags=RPR_DROP + gp),
              TrainStage(arch=arch, recipe=GPKD_STAGE2, name="train", model_flags=RPR_DROP + gp + tuple(skip_flags),
                         init=("continue", Ref(None, "converge", "resume"))),
              SkdStage(teacher=Ref(None, "train", "model")))
    return add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=stages, eval=GPKD_EVAL, title=title,
                           notes=(_GP_NOTE, _STAGE1_NOTE.replace("trained as usual", "GP-trained"), _STAGE2_NOTE,
                                  _SKD_NOTE) + tuple(notes)))


def gpkd_skd_student(name, teacher, arch, recipe, title) -> str:
    stage = TrainStage(arch=arch, recipe=recipe, name="train", model_flags=RPR_DROP, data=Ref(teacher, "skd", "skd"))
    return add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=(stage,), eval=GPKD_EVAL, title=title,
                           notes=(f"SKD baseline (Kim and Rush 2016): random initialisation, trained on the SKD data of "
                                  f"{teacher}, the plain deep model of the rows above it (our reading: the paper does "
                                  "not say whether SKD used the GP teacher's translations)",
                                  "student training length is not in the paper: the Base schedule")))


def gpkd_student(name, teacher, arch, recipe, enc_h, dec_h, title) -> str:
    """Extract one layer per group with the teacher's own GP group sizes, train on its SKD data."""
    stages = (ExtractStage(teacher=Ref(teacher, "train", "model"), encoder_group_size=enc_h, decoder_group_size=dec_h),
              TrainStage(arch=arch, recipe=recipe, name="student", model_flags=RPR_DROP,
                         data=Ref(teacher, "skd", "skd"), init=("finetune", Ref(None, "extract", "student"))))
    return add(Experiment(name=name, paper=GPKD, dataset="wmt14-en-de-gpkd", stages=stages, eval=GPKD_EVAL, title=title,
                           notes=(f"GPKD: one random layer per group (encoder h={enc_h}, decoder h={dec_h}, the group "
                                  f"sizes {teacher} was GP-trained with) of its averaged model initialises the student, "
                                  "trained on its SKD data",
                                  "student training is a new training run (--finetune-from-model: fresh Adam state and "
                                  "warm-up; 'we begin optimizing the student network'); its length is not in the "
                                  "paper: the Base/Big schedule")))



# The systems several tables and figures share (added by the first table that lists them)
BASE6 = "gpkd-wmt14-ende-base-6L"  # Base-RPR-6L
DEEP48 = "gpkd-wmt14-ende-48L"  # Deep-RPR-48L, trained without GP
CONVERGED = "gpkd-wmt14-ende-48L-converged"  # two-stage training, stage 1
SSL = "gpkd-wmt14-ende-48L-ssl"  # + Skipping Sub-Layer (two-stage)
CONTROL = "gpkd-wmt14-ende-48L-continued"  # its matched control: the same stage 2 without skipping
DESDAR_48_3, DESDAR_48_1 = "gpkd-wmt14-ende-desdar-48-3", "gpkd-wmt14-ende-desdar-48-1"
SKD_48, GPKD_48 = "gpkd-wmt14-ende-48L-skd", "gpkd-wmt14-ende-48L-gpkd"  # the 48L -> 6-6 students of Table 1


def _table1() -> Table:
    base6 = single(BASE6, GPKD, "wmt14-en-de-gpkd", "rpr_base_6_6", GPKD_BASE, GPKD_EVAL,
                   "GPKD Table 1/3: Base-RPR-6L", model_flags=RPR_DROP)
    big6 = single("gpkd-wmt14-ende-big-6L", GPKD, "wmt14-en-de-gpkd", "rpr_big_6_6", GPKD_BIG, GPKD_EVAL,
                  "GPKD Table 1: Big-RPR-6L", model_flags=RPR_DROP)
    p24 = gpkd_teacher("gpkd-wmt14-ende-24L", "rpr_deep_24_6", GPKD_BASE, title="GPKD Table 1: Deep-RPR-24L (no GP)")
    p48 = gpkd_teacher(DEEP48, "rpr_deep_48_6", GPKD_BASE, title="GPKD Tables 1-5: Deep-RPR-48L (no GP)")
    p12 = gpkd_teacher("gpkd-wmt14-ende-big-12L", "rpr_big_12_6", GPKD_BIG, title="GPKD Table 1: Big-RPR-12L (no GP)")
    t24 = gpkd_teacher("gpkd-wmt14-ende-24L-teacher", "rpr_deep_24_6", GPKD_BASE, 4,
                       title="GPKD Table 1: Deep-RPR-24L GP teacher (h=4)")
    t48 = gpkd_teacher("gpkd-wmt14-ende-48L-teacher", "rpr_deep_48_6", GPKD_BASE, 8,
                       title="GPKD Table 1: Deep-RPR-48L GP teacher (h=8)")
    t12 = gpkd_teacher("gpkd-wmt14-ende-big-12L-teacher", "rpr_big_12_6", GPKD_BIG, 2,
                       title="GPKD Table 1: Big-RPR-12L GP teacher (h=2)")
    g = {}
    for tag, plain, teacher, arch, recipe, h in (
            ("24L", p24, t24, "rpr_base_6_6", GPKD_BASE, 4), ("48L", p48, t48, "rpr_base_6_6", GPKD_BASE, 8),
            ("big-12L", p12, t12, "rpr_big_6_6", GPKD_BIG, 2)):
        g[tag] = (gpkd_skd_student(f"gpkd-wmt14-ende-{tag}-skd", plain, arch, recipe, f"GPKD Table 1: {tag} -> 6-6 +SKD"),
                  gpkd_student(f"gpkd-wmt14-ende-{tag}-gpkd", teacher, arch, recipe, h, 1,
                               f"GPKD Table 1: {tag} -> 6-6 +GPKD (h={h})"))
    t48h2, prog = _progressive()
    return Table("gpkd-t1", GPKD, "Table 1: GPKD on the encoder, WMT En-De (compound-split tokenized BLEU)", (
        Row("Deep-RPR-24L (24-6)", p24, {"bleu": 29.39, "params_m": exp_params(p24)}, "trained without GP"),
        Row("Base-RPR-6L (6-6)", base6, {"bleu": 27.60, "params_m": exp_params(base6)}),
        Row("+SKD (6-6)", g["24L"][0], {"bleu": 28.50, "params_m": exp_params(g["24L"][0])}),
        Row("+GPKD (6-6)", g["24L"][1], {"bleu": 29.33, "params_m": exp_params(g["24L"][1])}),
        Row("Deep-RPR-48L (48-6)", p48, {"bleu": 30.03, "params_m": exp_params(p48)}, "trained without GP"),
        Row("Base-RPR-6L (6-6)", base6, {"bleu": 27.60, "params_m": exp_params(base6)}),
        Row("+SKD (6-6)", g["48L"][0], {"bleu": 29.01, "params_m": exp_params(g["48L"][0])}),
        Row("+GPKD (6-6)", g["48L"][1], {"bleu": 29.68, "params_m": exp_params(g["48L"][1])}),
        Row("Big-RPR-12L (12-6)", p12, {"bleu": 29.91, "params_m": exp_params(p12)}, "trained without GP"),
        Row("Big-RPR-6L (6-6)", big6, {"bleu": 29.21, "params_m": exp_params(big6)}),
        Row("+SKD (6-6)", g["big-12L"][0], {"bleu": 29.47, "params_m": exp_params(g["big-12L"][0])}),
        Row("+GPKD (6-6)", g["big-12L"][1], {"bleu": 29.88, "params_m": exp_params(g["big-12L"][1])}),
        Row("GP teacher of +GPKD from 24L (GP h=4)", t24, {"bleu": "-"}, "not in the table: the GP-trained teacher"),
        Row("GP teacher of +GPKD from 48L (GP h=8)", t48, {"bleu": "-"}, "not in the table: the GP-trained teacher"),
        Row("GP teacher of +GPKD from Big-12L (GP h=2)", t12, {"bleu": "-"}, "not in the table: the GP-trained teacher"),
        Row("GP teacher of the progressive student (48L, GP h=2)", t48h2, {"bleu": "-"}, "not in the table"),
        Row("+GPKD, progressive 48 -> 24 -> 12 -> 6 (h = 2 three times)", prog, {"bleu": "-"},
            "not in the table; the paper's alternative to h = 8"),
        Row("NIST Zh-En, WMT19 Zh-En columns", None, {"bleu": "see paper"},
            "not reproducible here: NIST OpenMT12 (LDC) and the CWMT/UN Zh-En data are not freely available"),
    ))


def _progressive() -> Tuple[str, str]:
    """Progressive compression 48 -> 24 -> 12 -> 6 with h = 2 (Sec. "Student Training"): every model that is
    compressed was GP-trained with h = 2, the h it is compressed with.  Returns (teacher, student)."""
    t48h2 = gpkd_teacher("gpkd-wmt14-ende-48L-gp2-teacher", "rpr_deep_48_6", GPKD_BASE, 2,
                         title="GPKD progressive compression: Deep-RPR-48L GP teacher (h=2)")
    skd_h2 = Ref(t48h2, "skd", "skd")
    stages = (
        ExtractStage(teacher=Ref(t48h2, "train", "model"), name="extract-24", encoder_group_size=2),
        TrainStage(arch="rpr_deep_24_6", recipe=GPKD_BASE, name="student-24", model_flags=RPR_DROP + _gp_flags(2),
                   data=skd_h2, init=("finetune", Ref(None, "extract-24", "student"))),
        ExtractStage(teacher=Ref(None, "student-24", "model"), name="extract-12", encoder_group_size=2),
        TrainStage(arch="rpr_deep_24_6", recipe=GPKD_BASE, name="student-12",
                   model_flags=RPR_DROP + ("--encoder-layers", "12") + _gp_flags(2),
                   data=skd_h2, init=("finetune", Ref(None, "extract-12", "student"))),
        ExtractStage(teacher=Ref(None, "student-12", "model"), name="extract-6", encoder_group_size=2),
        TrainStage(arch="rpr_base_6_6", recipe=GPKD_BASE, name="student-6", model_flags=RPR_DROP,
                   data=skd_h2, init=("finetune", Ref(None, "extract-6", "student"))),
    )
    prog = add(Experiment(
        name="gpkd-wmt14-ende-6-6-progressive", paper=GPKD, dataset="wmt14-en-de-gpkd", stages=stages, eval=GPKD_EVAL,
        title="GPKD: progressive compression 48 -> 24 -> 12 -> 6 (GP h = 2 and extraction h = 2, three times)",
        notes=("'progressively achieve this goal with h = 2 for three times of compression': the 48-layer teacher is "
               "GP-trained with h = 2, each intermediate student (24, 12 layers) is GP-trained with h = 2 on the "
               "teacher's SKD data and then compressed with h = 2 again; the 6-layer student trains without GP",
               "intermediate training lengths are ours (the Base schedule)")))
    return t48h2, prog


# DESDAR greedy-search claim (Sec. 'The Effect of GPKD Method'): "after knowledge distillation, the beam search
# seems like to be not important for the DESDAR systems, which can achieve a 3.2x speedup with no performance
# sacrifice with the greedy search": the same trained systems decoded again with beam 1
# (evaluate NAME --beam 1 writes results-beam1-lenpen0.6.json next to results.json)
_GREEDY = dict(eval_args="--beam 1", results="results-beam1-lenpen0.6.json")


def _table2() -> List[Table]:
    """Table 2 (DESDAR) and the text's greedy-search claim."""
    d483 = single(DESDAR_48_3, GPKD, "wmt14-en-de-gpkd", "desdar_48_3", GPKD_BASE, GPKD_EVAL,
                  "GPKD Table 2: DESDAR 48-3 (real data)", model_flags=RPR_DROP)
    d481 = single(DESDAR_48_1, GPKD, "wmt14-en-de-gpkd", "desdar_48_1", GPKD_BASE, GPKD_EVAL,
                  "GPKD Table 2: DESDAR 48-1 (real data)", model_flags=RPR_DROP)
    t48d6 = gpkd_teacher("gpkd-wmt14-ende-48L-gp-dec6-teacher", "rpr_deep_48_6", GPKD_BASE, 1, 6,
                         title="GPKD Table 2: Deep-RPR-48L GP teacher for DESDAR 48-1 (decoder h=6)",
                         notes=("'The GPKD method also fits into the decoder': GP on the 6 decoder layers (h = 6 -> one "
                                "decoder layer), the encoder trained as usual (it is not compressed)",))
    d481s = gpkd_skd_student("gpkd-wmt14-ende-desdar-48-1-skd", DEEP48, "desdar_48_1", GPKD_BASE,
                             "GPKD Table 2: DESDAR 48-1 (SKD)")
    d481g = gpkd_student("gpkd-wmt14-ende-desdar-48-1-gpkd", t48d6, "desdar_48_1", GPKD_BASE, 1, 6,
                         "GPKD Table 2: DESDAR 48-1 (GPKD, decoder h=6)")
    return [Table("gpkd-t2", GPKD, "Table 2: DESDAR (deep encoder, shallow decoder), WMT En-De", (
        Row("Zhang, Xiong, and Su (2018)", None, {"bleu": 27.33, "speedup_vs_base": 1.34}, "cited; not implemented"),
        Row("Xiao et al. (2019)", None, {"bleu": 27.69, "speedup_vs_base": 1.39}, "cited; not implemented"),
        Row("Base", BASE6, {"bleu": 27.60}),
        Row("Deep", DEEP48, {"bleu": 30.03}, "Deep-RPR-48L without GP"),
        Row("DESDAR 48-3", d483, {"bleu": 29.82, "speedup_vs_base": 1.28, "speedup_vs_deep": 1.52}),
        Row("DESDAR 48-1", d481, {"bleu": 28.31, "speedup_vs_base": 1.97, "speedup_vs_deep": 2.17}),
        Row("DESDAR 48-1 (SKD)", d481s, {"bleu": 29.70, "speedup_vs_base": 1.99, "speedup_vs_deep": 2.18}),
        Row("DESDAR 48-1 (GPKD)", d481g, {"bleu": 30.01, "speedup_vs_base": 1.99, "speedup_vs_deep": 2.18}),
        Row("GP teacher of DESDAR 48-1 (GPKD) (decoder GP h=6)", t48d6, {"bleu": "-"}, "not in the table"),
    ), note="speedup = decoding tokens/s relative to Base / Deep (measured from fairseq-generate)."),
        Table("gpkd-desdar-greedy", GPKD, "DESDAR greedy-search claim: beam 1 vs beam 4, WMT En-De (text, "
              "Sec. 'The Effect of GPKD Method')", (
            Row("Deep-RPR-48L 48-6, beam 4", DEEP48, {"bleu": 30.03}),
            Row("Deep-RPR-48L 48-6, beam 1", DEEP48, {"bleu": "-"}, "our reference point for the greedy speedup", **_GREEDY),
            Row("DESDAR 48-1 (SKD), beam 4", d481s, {"bleu": 29.70}),
            Row("DESDAR 48-1 (SKD), beam 1", d481s, {"bleu": "≈ beam 4"}, "'no performance sacrifice'", **_GREEDY),
            Row("DESDAR 48-1 (GPKD), beam 4", d481g, {"bleu": 30.01}),
            Row("DESDAR 48-1 (GPKD), beam 1", d481g, {"bleu": "≈ beam 4", "speedup_vs_deep": 3.2},
                "'3.2x speedup ... with the greedy search': the paper does not say relative to which system and beam; we "
                "read it as relative to Deep 48-6 with beam 4 (speedup vs Deep)", **_GREEDY),
        ), note="speedup vs Deep = decoding tokens/s relative to Deep-RPR-48L 48-6 with beam 4 (its results.json); the "
                "beam-1 rows read results-beam1-lenpen0.6.json of the same experiment (evaluate NAME --beam 1).")]


# Tables 3-5: skipping sub-layer, two-stage (stage 1: plain, early-stopped; stage 2: the method on, continued)
_CONTROL_NOTE = ("matched control (not in the paper): stage 2 of the two-stage runs with the method off - the same "
                 "stage 1, the same continuation, patience and 50K-update budget - so a finetune row's gain over it is "
                 "the method's, not stage 2's extra epochs on an early-stopped model (as the evidence study does on "
                 "the CPU: ssl-stage2-skip vs ssl-stage2-plain)")
_CONTROL_ROW = "matched control (not in the paper): two-stage, stage 2 without skipping"


def _gpkd_skip(name, flags, title, finetune, ev=GPKD_EVAL, notes=()):
    init = ("continue", Ref(CONVERGED, "train", "resume"))
    return single(name, GPKD, "wmt14-en-de-gpkd", "rpr_deep_48_6", GPKD_STAGE2 if finetune else GPKD_BASE, ev, title,
                  model_flags=RPR_DROP + flags, init=init if finetune else None,
                  notes=((_STAGE2_NOTE + f"; stage 1: {CONVERGED}") if finetune else _SCRATCH_NOTE,) + tuple(notes))


def _tables3to5() -> List[Table]:
    add(Experiment(
        name=CONVERGED, paper=GPKD, dataset="wmt14-en-de-gpkd",
        stages=(TrainStage(arch="rpr_deep_48_6", recipe=GPKD_STAGE1, name="train", model_flags=RPR_DROP),),
        eval=GPKD_EVAL, title="GPKD Tables 3-5: Deep-RPR-48L, two-stage training stage 1 (early-stopped, no GP)",
        notes=(_STAGE1_NOTE, "the fine-tuning runs of Tables 3-5 continue from its averaged model")))
    ssl = _gpkd_skip(SSL, ("--ssl-rate", "0.4"), "GPKD Table 3/4/5: Deep-RPR-48L + Skipping Sub-Layer "
                     "(two-stage)", True, GPKD_EVAL_T5, ("phi = 0.4 (Eq. 5), encoder sub-layers only",))
    control = _gpkd_skip(CONTROL, (), "GPKD Tables 3-5 control: Deep-RPR-48L two-stage without skipping (not in the "
                         "paper)", True, GPKD_EVAL_T5, (_CONTROL_NOTE,))
    ssl_s = _gpkd_skip("gpkd-wmt14-ende-48L-ssl-scratch", ("--ssl-rate", "0.4"),
                       "GPKD Table 4: Skipping Sub-Layer from scratch", False)
    ld_s = _gpkd_skip("gpkd-wmt14-ende-48L-layerdrop-scratch", ("--encoder-layerdrop", "0.2"),
                      "GPKD Table 4: LayerDrop from scratch", False, notes=(
                          "LayerDrop (Fan et al. 2020, fairseq's --encoder-layerdrop) with p = 0.2, their translation "
                          "value; encoder only, like the skipping sub-layer",))
    sl_s = _gpkd_skip("gpkd-wmt14-ende-48L-stochastic-scratch", ("--ssl-mode", "layer", "--ssl-rate", "0.5"),
                      "GPKD Table 4: Stochastic Layers from scratch", False, notes=(
                          "Stochastic Layers (Pham et al. 2019): whole layers, p_l = l/L * 0.5 (the linear-decay rule "
                          "with final drop rate 0.5; GPKD gives no value)",))
    ld = _gpkd_skip("gpkd-wmt14-ende-48L-layerdrop", ("--encoder-layerdrop", "0.2"), "GPKD Table 4: LayerDrop (two-stage)",
                    True, notes=("LayerDrop p = 0.2 (Fan et al. 2020)",))
    sl = _gpkd_skip("gpkd-wmt14-ende-48L-stochastic", ("--ssl-mode", "layer", "--ssl-rate", "0.5"),
                    "GPKD Table 4: Stochastic Layers (two-stage)", True, notes=("p_l = l/L * 0.5 (see scratch run)",))
    skl = _gpkd_skip("gpkd-wmt14-ende-48L-skip-layer", ("--ssl-mode", "layer", "--ssl-rate", "0.4"),
                     "GPKD Table 5: Skip Layer (two-stage)", True, GPKD_EVAL_T5, (
                         "whole layers with the paper's rate phi = 0.4 (p_l = l/L * 0.4); Table 4's Stochastic Layers "
                         "uses 0.5 - the paper does not say how the two differ (our reading)",))
    skip_ffn = _gpkd_skip("gpkd-wmt14-ende-48L-skip-ffn", ("--ssl-rate", "0.4", "--ssl-sublayers", "ffn"),
                          "GPKD Table 5: skip FFN sub-layers only (two-stage)", True, GPKD_EVAL_T5,
                          ("--ssl-sublayers ffn: only FFN sub-layers are omitted, each with its Eq. 5 rate p_l "
                           "(its position l in the 2L numbering; our reading)",))
    skip_san = _gpkd_skip("gpkd-wmt14-ende-48L-skip-san", ("--ssl-rate", "0.4", "--ssl-sublayers", "attn"),
                          "GPKD Table 5: skip self-attention sub-layers only (two-stage)", True, GPKD_EVAL_T5,
                          ("--ssl-sublayers attn: only self-attention sub-layers are omitted (our reading of p_l, "
                           "as for Skip FFN)",))
    return [Table("gpkd-t3", GPKD, "Table 3: skipping sub-layer, WMT En-De (BLEU, sacreBLEU, training time)", (
        Row("Fan, Grave, and Joulin (2020)", None, {"bleu": 30.20, "params_m": 286}, "cited (LayerDrop 12-6 big); see Table 4 rows"),
        Row("Li et al. (2020)", None, {"bleu": 30.21, "sacrebleu": 29.0, "params_m": 194, "train_hours": 11.75}, "cited"),
        Row("Wu et al. (2019b)", None, {"bleu": 29.92, "params_m": 270}, "cited"),
        Row("Ott et al. (2018)", None, {"bleu": 29.30, "sacrebleu": 28.3, "params_m": 210}, "cited"),
        Row("Wang et al. (2019)", None, {"bleu": 29.30, "params_m": 137}, "cited; see MSC Table 4's DLCL run"),
        Row("Base-RPR", BASE6, {"bleu": 27.60, "sacrebleu": 26.5, "params_m": exp_params(BASE6), "train_hours": 5.02},
            "50K updates: the setup section's Base budget ('Base/Big/Deep ... 50k/150k/50k steps on the En-De task'); "
            "Table 3 lists 100K for this row"),
        Row("Deep-RPR-48L", DEEP48, {"bleu": 30.03, "sacrebleu": 28.8, "params_m": exp_params(DEEP48), "train_hours": 16.87},
            "trained without GP; 50K updates (Table 3, setup section)"),
        Row("+ Skipping Sub-Layer", ssl, {"bleu": 30.49, "sacrebleu": 29.4, "params_m": exp_params(ssl), "train_hours": 15.41},
            "two-stage within Table 3's 50K updates in all (stage 1 gpkd-wmt14-ende-48L-converged early-stopped, "
            "stage 2 continues to update 50K); 30.49 is the paper's beam-4 score (30.63 with beam 8: evaluate.sh "
            "NAME --beam 8); train h: stage 2 only"),
        Row(_CONTROL_ROW, control, {"bleu": "-"}, "the same two stages and budget as '+ Skipping Sub-Layer', skipping "
            "off: what its gain over Deep-RPR-48L would be without the method"),
        Row("two-stage training, stage 1 (early-stopped Deep-RPR-48L)", CONVERGED, {"bleu": "-"},
            "not in the table: the converged model every fine-tuning run continues"),
        Row("NIST / WMT Zh-En columns", None, {"bleu": "see paper"}, "data not freely available"),
    )), Table("gpkd-t4", GPKD, "Table 4: training from scratch vs fine-tuning (validation PPL, BLEU)", (
        Row("Deep-RPR-48L", DEEP48, {"valid_ppl": 3.52, "bleu": 30.03}, "trained without GP"),
        Row("Scratch: Skipping Sub-Layer", ssl_s, {"valid_ppl": 3.41, "bleu": 29.82}),
        Row("Scratch: LayerDrop", ld_s, {"valid_ppl": 3.42, "bleu": 29.65}),
        Row("Scratch: Stochastic Layers", sl_s, {"valid_ppl": 3.44, "bleu": 29.75}),
        Row("Finetune: Skipping Sub-Layer", ssl, {"valid_ppl": 3.39, "bleu": 30.49}),
        Row("Finetune: LayerDrop", ld, {"valid_ppl": 3.47, "bleu": 29.77}),
        Row("Finetune: Stochastic Layers", sl, {"valid_ppl": 3.44, "bleu": 30.12}),
        Row(_CONTROL_ROW, control, {"valid_ppl": "-", "bleu": "-"}, "the finetune rows' matched control"),
    ), note="valid_ppl: the best validation perplexity in the training log (fairseq reports base-2 ppl, as the paper). "
            "Finetune = two-stage: stage 2 continues gpkd-wmt14-ende-48L-converged; both stages together train 50K "
            "updates, as every Scratch row and Deep-RPR-48L."),
        Table("gpkd-t5", GPKD, "Table 5: ablation of what is skipped (PPL, single checkpoint, average)", (
            Row("Deep-RPR-48L", DEEP48, {"valid_ppl": 3.52, "single_bleu": 29.19, "bleu": 30.03}, "trained without GP"),
            Row("Skip FFN", skip_ffn, {"valid_ppl": 3.45, "single_bleu": 29.61, "bleu": 30.22}),
            Row("Skip SAN", skip_san, {"valid_ppl": 3.45, "single_bleu": 29.71, "bleu": 30.26}),
            Row("Skip FFN or SAN", ssl, {"valid_ppl": 3.39, "single_bleu": 29.95, "bleu": 30.49}),
            Row("Skip Layer", skl, {"valid_ppl": 3.46, "single_bleu": 29.45, "bleu": 29.92}),
            Row(_CONTROL_ROW, control, {"valid_ppl": "-", "single_bleu": "-", "bleu": "-"},
                "the skipping rows' matched control (50K updates in all)"),
        ))]


# Table 6: Skipping Sub-Layer + GP teachers and their students.  Each student is extracted with the h its
# teacher was GP-trained with (h = N/M); a decoder kept whole (decoder h = 1) can come from any decoder GP, so the
# four students (encoder h, decoder h) 24-3 (2, 2), 24-1 (2, 6), 6-6 (8, 1), 6-3 (8, 2) need three teachers, and the
# (8, 2) one, the teacher of GPKD 6-6 and 6-3, is the paper's single 'Skipping Sub-Layer + GP 48-6' row.
_T6 = (("GPKD 24-3", "gpkd_student_24_3", 2, 2, 30.40, 5237), ("GPKD 24-1", "gpkd_student_24_1", 2, 6, 30.05, 8116),
       ("GPKD 6-6", "rpr_base_6_6", 8, 1, 30.16, 3817), ("GPKD 6-3", "gpkd_student_6_3", 8, 2, 29.71, 5460))
# the teacher's GP group sizes per student: the student's own, the decoder's raised to the paper row's teacher's
_T6_TEACHER = {(2, 2): (2, 2), (2, 6): (2, 6), (8, 1): (8, 2), (8, 2): (8, 2)}
_T6_PAPER_TEACHER = (8, 2)


def _table6() -> Table:
    teachers = {}
    for eh, dh in dict.fromkeys(_T6_TEACHER.values()):
        students = " and ".join(label for label, _, e, d, _, _ in _T6 if _T6_TEACHER[(e, d)] == (eh, dh))
        teachers[(eh, dh)] = gpkd_two_stage_teacher(
            f"gpkd-wmt14-ende-48L-ssl-gp-e{eh}-d{dh}-teacher", "rpr_deep_48_6", ("--ssl-rate", "0.4"), eh, dh,
            f"GPKD Table 6: Skipping Sub-Layer + GP 48-6 teacher (GP encoder h={eh}, decoder h={dh}) of {students}",
            notes=(f"teacher of {students}: GP with the group sizes they are extracted with (a student that keeps the "
                   "whole decoder, decoder h = 1, takes any decoder GP); the paper names one 'Skipping Sub-Layer + GP' "
                   f"system without its h, the h rule needs {len(set(_T6_TEACHER.values()))} teachers for its four "
                   "students",))
    paper_teacher = teachers[_T6_PAPER_TEACHER]
    rows = [
        Row("Fan, Grave, and Joulin (2020) 12-6", None, {"bleu": 30.20, "params_m": 286, "tokens_per_s": 2534}, "cited"),
        Row("Wu et al. (2019b) 8-8", None, {"bleu": 29.92, "params_m": 270, "tokens_per_s": 2044}, "cited"),
        Row("Wei et al. (2020) 18-6", "msc-wmt14-ende-big-18L", {"bleu": 30.56, "params_m": exp_params("msc-wmt14-ende-big-18L")}, "cited; our MSC reproduction"),
        Row("Skipping Sub-Layer + GP 48-6", paper_teacher,
            {"bleu": 30.59, "params_m": exp_params(paper_teacher), "tokens_per_s": 3092},
            f"the GP encoder h={_T6_PAPER_TEACHER[0]} / decoder h={_T6_PAPER_TEACHER[1]} teacher (of GPKD 6-6 and "
            "6-3) stands for this row (our choice: the paper does not give its h)"),
    ]
    for label, arch, eh, dh, bleu, speed in _T6:
        teh, tdh = _T6_TEACHER[(eh, dh)]
        name = gpkd_student(f"gpkd-wmt14-ende-{label.split()[1]}", teachers[(teh, tdh)], arch, GPKD_BASE, eh, dh,
                            f"GPKD Table 6: {label} (h encoder {eh}, decoder {dh})")
        rows.append(Row(label, name, {"bleu": bleu, "params_m": paper_params(arch), "tokens_per_s": speed},
                        f"student of {teachers[(teh, tdh)]} (GP encoder h={teh}, decoder h={tdh})"
                        + (", the row above" if (teh, tdh) == _T6_PAPER_TEACHER else "")))
    for (eh, dh), name in teachers.items():
        if (eh, dh) != _T6_PAPER_TEACHER:
            rows.append(Row(f"Skipping Sub-Layer + GP 48-6 teacher, GP h encoder {eh} / decoder {dh}", name, {"bleu": "-"},
                            "not in the table: the teacher of the student with these group sizes"))
    n = len(teachers)
    return Table("gpkd-t6", GPKD, "Table 6: overall results (BLEU, decoding tokens/s)", tuple(rows),
                 note=f"The paper reports one 'Skipping Sub-Layer + GP' teacher; extraction needs the group size h a "
                      f"teacher was GP-trained with (h = N/M), so the four students come from {n} two-stage teachers "
                      f"({n}x the paper's teacher cost): GPKD 24-3 from GP h 2/2, GPKD 24-1 from GP h 2/6, GPKD 6-6 "
                      f"and 6-3 from GP h {_T6_PAPER_TEACHER[0]}/{_T6_PAPER_TEACHER[1]} (encoder/decoder), the "
                      "teacher that stands for the paper's row. Each student row names its teacher.")


# Figures (curves from the training logs, sweeps from results.json; deepnmt-repro plot KEY)
def _figures() -> List[Table]:
    rows, lines = [], {"6-layer encoder": [], "48-layer encoder": []}
    for dec in (1, 2, 3, 6, 9, 12):
        if dec == 6:
            name = BASE6
        else:
            name = single(f"gpkd-wmt14-ende-fig5-6-{dec}", GPKD, "wmt14-en-de-gpkd", "rpr_base_6_6", GPKD_BASE, GPKD_EVAL,
                          f"GPKD Fig. 5: Base-RPR 6-{dec}", model_flags=RPR_DROP + ("--decoder-layers", str(dec)),
                          notes=("Fig. 5: BLEU and speed against decoder depth on a shallow encoder; the depth grid is ours",))
        lines["6-layer encoder"].append(Point(dec, name))
        rows.append(Row(f"6-{dec}", name, {"bleu": "fig."}))
    for dec, name in ((1, DESDAR_48_1), (3, DESDAR_48_3), (6, DEEP48)):
        lines["48-layer encoder"].append(Point(dec, name))
        rows.append(Row(f"48-{dec}", name, {"bleu": "fig."}))
    add_figure(Figure(
        "gpkd-fig2", GPKD, "GPKD Fig. 2: training and validation PPL of the shallow and the deep model (WMT En-De)",
        "curves", "updates", (("train_ppl", "training PPL"), ("valid_ppl", "validation PPL")),
        (("shallow: Base-RPR-6L", Run(((BASE6, None),))), ("deep: Deep-RPR-48L", Run(((DEEP48, None),)))),
        chosen="x = updates (the paper: 'training steps'); one panel per metric with both models, where the paper "
               "has one panel per model with both metrics"))
    add_figure(Figure(
        "gpkd-fig4", GPKD, "GPKD Fig. 4: training loss of the GPKD and the SKD student (WMT En-De, 48L -> 6-6)",
        "curves", "updates", (("train_loss", "training loss"),),
        (("GPKD", Run(((GPKD_48, "student"),))), ("SKD", Run(((SKD_48, None),)))),
        chosen="the Table 1 students of the 48-layer teacher (the paper does not say which teacher); fairseq's "
               "label-smoothed training loss (base 2)"))
    add_figure(Figure(
        "gpkd-fig5", GPKD, "GPKD Fig. 5: BLEU and translation speed against decoder depth (WMT En-De)", "sweep",
        "decoder layers", (("bleu", "BLEU"), ("tokens_per_s", "tokens/s")),
        tuple((k, tuple(v)) for k, v in lines.items()),
        chosen="decoder depths 1, 2, 3, 6, 9, 12 on the 6-layer encoder and 1, 3, 6 on the 48-layer one (Table 2's "
               "systems); speed = fairseq-generate tokens/s with the paper's beam 4 and batch 64"))
    add_figure(Figure(
        "gpkd-fig6", GPKD, "GPKD Fig. 6: validation PPL before (Deep-RPR-48L) and after the Skipping Sub-Layer (WMT En-De)",
        "curves", "updates", (("valid_ppl", "validation PPL"),),
        (("before: Deep-RPR-48L", Run(((DEEP48, None),))),
         ("after: Skipping Sub-Layer (stage 1, then stage 2)", Run(((CONVERGED, None), (SSL, None))))),
        chosen="x = updates; the 'after' curve is the early-stopped stage 1 followed by the skipping stage 2 "
               "(En-De only: the Zh-En data are not freely available)"))
    return [
        Table("gpkd-fig5", GPKD, "Figure 5: BLEU and decoding speed against decoder depth (WMT En-De)",
              tuple(rows), note="Values only in the figure; the 48-layer points are Table 2's systems."),
        Table("gpkd-fig2", GPKD, "Figure 2: training / validation PPL over training, shallow vs deep", (
            Row("shallow: Base-RPR-6L", BASE6, {"valid_ppl": "fig."}), Row("deep: Deep-RPR-48L", DEEP48, {"valid_ppl": "fig."}),
        ), note="Curves from the runs' train.log; 'Clearly, the deep model (48-layer encoder) appears to overfit.'"),
        Table("gpkd-fig4", GPKD, "Figure 4: training loss of the GPKD and SKD students", (
            Row("GPKD (48L -> 6-6)", GPKD_48, {"bleu": "fig."}), Row("SKD (48L -> 6-6)", SKD_48, {"bleu": "fig."}),
        ), note="Curves from the students' train.log ('GPKD obtains a much lower training loss than SKD')."),
        Table("gpkd-fig6", GPKD, "Figure 6: validation PPL before / after the Skipping Sub-Layer", (
            Row("before: Deep-RPR-48L", DEEP48, {"valid_ppl": 3.52}),
            Row("after, stage 1 (early-stopped)", CONVERGED, {"valid_ppl": "fig."}),
            Row("after, stage 2 (skipping)", SSL, {"valid_ppl": 3.39}),
        ), note="Validation PPL per validation from train.log; the paper's numbers are Table 4's best PPLs."),
    ]


#: the GPKD procedure: our choice next to the paper's text, where it is silent or open (docs/reproduction.md)
PROCEDURE: Tuple[Choice, ...] = (
    Choice("extraction group size",
           '"the stacking layers are first divided into M groups and every adjacent h = N/M layers form a group";'
           ' "One can compress a 48-layer teacher into a 6-layer network by setting h = 8, or progressively '
           'achieve this goal with h = 2 for three times of compression"',
           "a student is extracted with the h its teacher was GP-trained with; `deepnmt-extract-student` refuses "
           "another h (the teacher's checkpoint records `gp_group_size` / `gp_decoder_group_size`) unless "
           "`--allow-group-size-mismatch`, which is written into the student "
           "(`extra_state.gpkd_student.group_size_override`)"),
    Choice("Table 6 teachers",
           'one "Skipping Sub-Layer + GP" 48-6 system; students 24-3, 24-1, 6-6, 6-3',
           "silent on the GP h: a teacher per student's (encoder h, decoder h) where the h rule needs one, three "
           "in all (3× the paper's teacher cost): (2, 2) for 24-3, (2, 6) for 24-1, (8, 2) for 6-3 and 6-6 (which"
           " keeps the whole decoder, decoder h = 1); the (8, 2) one stands for the 30.59 row; the table names "
           "each student's teacher"),
    Choice("baselines",
           'Table 1 lists Deep-RPR-24L/48L apart from the students; Table 3 "+Skipping Sub-Layer" (30.49) and '
           'Table 6 "Skipping Sub-Layer + GP" (30.59) are different systems',
           "plain Deep-RPR-24L/48L/Big-12L without GP are the baseline rows of Tables 1-5 and the start of the "
           "skipping runs; GP teachers are rows of their own"),
    Choice("+SKD students",
           '"SKD uses the translation results of the teacher network as the gold"',
           "silent on which teacher: the plain deep model of the rows above"),
    Choice("progressive compression",
           '"progressively ... with h = 2 for three times"',
           "48L teacher GP-trained with h = 2; the 24- and 12-layer students are GP-trained with h = 2 on its SKD"
           " data before each extraction; the 6-layer student trains without GP; Base schedule per stage"),
    Choice("two-stage training, stage 1",
           '"we train the model as usual but early stop it when the model converges on the validation set"',
           "`--patience 3` (validations, one per epoch) on fairseq's validation loss, within 50K updates"),
    Choice("stage 2",
           '"apply our Skipping Sub-Layer method to the model and continue training until the model converges '
           'again"; Table 3: 50K updates',
           "starts from stage 1's averaged model (last 5 epoch checkpoints: the model the paper evaluates) with "
           "stage 1's newest Adam state, learning-rate schedule and update count, `--patience 3`, to the same 50K"
           " updates in all as Deep-RPR-48L (Table 3 gives both 50K; stage 1's early stop decides the split). A "
           "matched control (`gpkd-wmt14-ende-48L-continued`) runs the same stage 2 without skipping, so a "
           "finetune gain is the method's, not more training. fairseq's `--finetune-from-model` (and "
           "`--reset-optimizer`) restart the update count at 0, so `inverse_sqrt` warms up again to the peak "
           "rate; `--reset-lr-scheduler` alone keeps the count (the schedule is a function of it). We continue "
           "(`--continue-once` on an average written with `--keep-training-state`); `scripts/gpkd_pipeline.py "
           "--restart-schedule` gives the warm-up when asked"),
    Choice("SKD data",
           '"the teacher network translates the source inputs"',
           "from the teacher's averaged model (registry and `scripts/gpkd_pipeline.py`), beam 4, length penalty "
           "0.6"),
    Choice("student training",
           '"we begin optimizing the student network"',
           "a new run from the extracted weights (`--finetune-from-model`: its own warm-up), Base/Big schedule"),
    Choice("DESDAR greedy claim",
           '"can achieve a 3.2× speedup with no performance sacrifice with the greedy search"',
           "the same trained DESDAR 48-1 (SKD/GPKD) and Deep 48-6 decoded with beam 1 (`evaluate NAME --beam 1`);"
           " the speedup is read as relative to Deep 48-6 with beam 4 (table `gpkd-desdar-greedy`)"),
    Choice("Fig. 2, 4, 6",
           "PPL / training loss over training",
           "x = updates; Fig. 4 with the 48-layer teacher's students; Fig. 6's \"after\" curve = stage 1 then stage"
           " 2. The paper has no figure over the skipping rate φ: φ = 0.4 throughout"),
    Choice("Fig. 5",
           '"BLEU scores and translation speed against decoder depth"',
           "decoder depths 1, 2, 3, 6, 9, 12 on the 6-layer encoder; 1, 3, 6 (Table 2's systems) on the 48-layer "
           "one"),
    Choice("headline metric",
           '"case-sensitive tokenized BLEU ... multi-bleu.perl", compound splitting for En-De',
           "`tok_bleu_compound_split`; sacreBLEU beside it"),
)


def tables() -> List[Table]:
    """Add GPKD's experiments and figures; its tables (En-De columns)."""
    return [_table1(), *_table2(), *_tables3to5(), _table6(), *_figures()]
