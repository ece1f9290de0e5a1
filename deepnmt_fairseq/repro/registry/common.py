"""What every paper's module of the registry shares: the registries being filled, the one lookup of
the model code's named architectures, the papers' parameter counts, and the helpers that add
experiments and figures.

Architecture names, CAD defaults and the papers' parameter counts are the model code's
(:mod:`deepnmt_fairseq.models.architectures`): a family's name is looked up in its ``ARCHS``
table through :func:`arch_name` (and back through :func:`arch_key`), never rebuilt here, and a
row's ``params_m`` is the architecture's paper count (:func:`paper_params`) except where a table
reports another number for the same architecture (``deep_decoder.OWN_PARAM_COUNTS`` says why).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ...models.architectures import ARCHS, PAPER_ROWS
from ..spec import EvalSpec, Experiment, Figure, Recipe, TrainStage

MSC = "Wei et al. 2020, Multiscale Collaborative Deep Models for NMT (MSC)"
BAPNA = "Bapna et al. 2018, Training Deeper NMT Models with Transparent Attention"
DD = "What Works and Doesn't Work, A Deep Decoder for NMT (CAD/CRT)"
GPKD = "Li et al. 2021, Learning Light-Weight Translation Models from Deep Transformer (GPKD)"
DEEPNET = "Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers (DeepNorm)"
ADMIN = "Liu et al. 2020, Very Deep Transformers for Neural Machine Translation (Admin)"

EXPERIMENTS: Dict[str, Experiment] = {}
FIGURES: Dict[str, Figure] = {}

# the collapse-reducing criterion (DDR, ALD, encoder L2: criterions/collapse_reducing.py)
CR = "collapse_reducing"


def arch_name(*key) -> str:
    """The registered architecture of a family: ``models.architectures.ARCHS[key]``, e.g.
    ``arch_name("dd", "base", 15, 15, True)`` -> ``"dd_base_15_15_cad"``.  The registry's only way
    to a family's architecture name (the model code registers the names; nothing here builds one)."""
    try:
        return ARCHS[key]
    except KeyError:
        raise KeyError(f"no named architecture {key} in deepnmt_fairseq.models.architectures.ARCHS") from None


def arch_key(arch: str) -> Optional[Tuple]:
    """The family key of a registered architecture name (the inverse of :func:`arch_name`), None for a
    name no family lists (e.g. ``deep_transformer`` with flags)."""
    for key, name in ARCHS.items():
        if name == arch:
            return key
    return None


def paper_params(arch: str) -> float:
    """The paper's parameter count (millions) of a named architecture (architectures.PAPER_ROWS)."""
    params = PAPER_ROWS[arch][2]
    if params is None:
        raise ValueError(f"{arch} has no paper parameter count in PAPER_ROWS")
    return params


def exp_params(name: str) -> float:
    """paper_params of the architecture an experiment evaluates."""
    return paper_params(EXPERIMENTS[name].eval_stage.arch)


def add(exp: Experiment) -> str:
    if exp.name in EXPERIMENTS:
        raise ValueError(f"duplicate experiment name {exp.name}")
    EXPERIMENTS[exp.name] = exp
    return exp.name


def single(name, paper, dataset, arch, recipe, ev, title, model_flags=(), criterion="label_smoothed_cross_entropy",
           criterion_flags=(), notes=(), init=None, data=None) -> str:
    """Add a one-stage experiment; returns its name."""
    stage = TrainStage(arch=arch, recipe=recipe, model_flags=tuple(model_flags), criterion=criterion,
                       criterion_flags=tuple(criterion_flags), init=init, data=data)
    return add(Experiment(name=name, paper=paper, dataset=dataset, stages=(stage,), eval=ev, title=title,
                          notes=tuple(notes)))


def add_figure(fig: Figure) -> Figure:
    if fig.key in FIGURES:
        raise ValueError(f"duplicate figure {fig.key}")
    FIGURES[fig.key] = fig
    return fig


VASWANI_NOTES = (
    ("adam_eps", "1e-9 as Vaswani et al. 2017 (not in the paper)"),
    ("clip_norm", "0 = no clipping (Vaswani et al. 2017; not in the paper)"),
    ("weight_decay", "0 (not in the paper)"),
    ("warmup_init_lr", "1e-7, fairseq's usual start of the linear warm-up (not in the paper)"),
    ("max_tokens", "4096 per GPU and forward pass (not in the paper); --update-freq keeps tokens_per_update"),
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


# Wang et al. (2019a), 'Learning Deep Transformer Models for MT': their released run script for the pre-norm
# (DLCL) WMT En-De models.  MSC Table 4 cites their 29.3 (trained so); GPKD 'followed the hyper-parameters used in
# Wang et al. (2019)' with its own update budgets (gpkd.GPKD_BASE replaces max_update and the notes).
WANG_2019A = Recipe(
    lr=0.002, warmup_updates=16000, max_update=0, tokens_per_update=65536, adam_betas="(0.9, 0.997)",
    adam_eps=1e-8, warmup_init_lr=1e-7, save="epoch", keep=10,
    notes=(("recipe", "Wang et al. (2019a)'s released run script for the pre-norm DLCL model: lr 2e-3 after a "
                      "16K-update linear warm-up from 1e-7 (inverse sqrt), Adam (0.9, 0.997), 8 GPUs x 4096 tokens "
                      "x update-freq 2 = 65,536 tokens per update, 20 epochs (--max-epoch 20; --max-update 0 = no "
                      "update limit), the last 5 epoch checkpoints averaged"),
           ("adam_eps/clip_norm/weight_decay", "not set by the script: fairseq's eps 1e-8, no clipping, no weight "
                                               "decay"),
           ("dropout", "0.1 residual, 0.1 attention and ReLU dropout (Wang et al. 2019a's setting)")),
)
# what a Wang et al. (2019a) run adds to the command line: the epoch budget and the attention/ReLU dropout
WANG_2019A_EPOCHS = ("--max-epoch", "20")
WANG_2019A_DROPOUT = ("--attention-dropout", "0.1", "--activation-dropout", "0.1")
