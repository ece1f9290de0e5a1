"""Data model of the experiment registry (imports nothing from fairseq itself).

An :class:`Experiment` is one runnable job: a sequence of stages (fairseq-train,
SKD data generation, student extraction) plus how to evaluate it.  A
:class:`Row` is one row of one of the papers' tables; several rows may point
at the same experiment (e.g. GPKD's Deep-RPR-48L appears in Tables 1-5), and
rows of systems from other papers that this plugin does not implement have no
experiment (``experiment=None``) and say why.  A :class:`Figure` is one of the papers'
figures: curves from training logs (:class:`Run`) or a sweep of results (:class:`Point`).

Every value that the paper does not give carries a note (``Recipe.notes``,
``Experiment.notes``) saying where it comes from; ``docs/reproduction.md`` and
``deepnmt-repro show NAME`` print them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple, Union

from deepnmt_data.corpora import RECIPES

# Datasets written by deepnmt-prepare-data (the corpora registry, deepnmt_data.corpora): name -> (source, target).
DATASETS: Dict[str, Tuple[str, str]] = {r.name: (r.src, r.tgt) for r in RECIPES.values()}


def vaswani_lr(d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Peak of Vaswani et al. (2017) Eq. 3, lr = scale * d^-0.5 * min(t^-0.5, t * w^-1.5),
    reached at t = w: scale * d^-0.5 * w^-0.5.  fairseq's ``inverse_sqrt`` scheduler with
    ``--lr`` = this peak and ``--warmup-updates w`` is exactly that schedule (linear warm-up,
    then decay with the inverse square root of the step)."""
    return float(f"{scale * d_model ** -0.5 * warmup ** -0.5:.3g}")


@dataclass(frozen=True)
class Ref:
    """An output of a stage of an experiment (``experiment=None``: the same experiment).

    ``what``: ``dir`` (the stage directory), ``last`` (checkpoint_last.pt, with optimizer
    state), ``model`` (the stage's finished model: the average of its last checkpoints as
    its experiment's evaluation averages them), ``skd`` (binarized SKD data), ``student``
    (an extracted student checkpoint), ``resume`` (the stage's averaged model *with* the newest
    checkpoint's optimizer state, schedule and update count: a second training stage
    continues from it with ``--continue-once``, see :class:`TrainStage`)."""

    experiment: Optional[str]
    stage: str
    what: str = "model"


@dataclass(frozen=True)
class Recipe:
    """Optimisation and checkpointing of one fairseq-train stage."""

    lr: float
    warmup_updates: int
    max_update: int
    tokens_per_update: int
    adam_betas: str = "(0.9, 0.98)"
    adam_eps: float = 1e-9
    # fairseq --optimizer: "adam", or "radam" (the plugin's RAdam, deepnmt_fairseq/optim/radam.py: the
    # Admin authors' scripts); both take --adam-betas / --adam-eps / --weight-decay
    optimizer: str = "adam"
    warmup_init_lr: float = 1e-7
    clip_norm: float = 0.0
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    max_tokens: int = 4096  # per GPU and forward pass; update-freq makes up the rest
    save: str = "epoch"  # "epoch" or "updates:N"
    keep: int = 10  # checkpoints kept (--keep-last-epochs / --keep-interval-updates)
    # preemption/walltime (issue 67 §3): with save="epoch", also write checkpoint_last.pt every this many
    # updates (--save-interval-updates N --keep-interval-updates 1); the epoch checkpoints the averaging
    # reads are kept as before.  0: none (an epoch takes at most ~30 min by :func:`checkpoint_rule`).
    checkpoint_updates: int = 0
    seed: int = 1
    # early stopping: stop when the validation loss has not improved for this many validations
    # (fairseq --patience; 0 = train to max_update).  GPKD two-stage training, stage 1: "early stop
    # it when the model converges on the validation set".
    patience: int = 0
    # fairseq learning-rate scheduler: "inverse_sqrt" uses lr/warmup_updates/warmup_init_lr above; any
    # other scheduler gets ``--lr-scheduler NAME`` plus ``scheduler_flags`` (e.g. RNMT+'s tri_stage)
    lr_scheduler: str = "inverse_sqrt"
    scheduler_flags: Tuple[str, ...] = ()
    notes: Tuple[Tuple[str, str], ...] = ()

    def with_(self, **kw) -> "Recipe":
        notes = kw.pop("notes", None)
        r = replace(self, **kw)
        if notes:
            r = replace(r, notes=self.notes + tuple(notes))
        return r

    @property
    def save_interval_updates(self) -> int:
        return int(self.save.split(":")[1]) if self.save.startswith("updates:") else 0


@dataclass(frozen=True)
class TrainStage:
    """One ``fairseq-train`` run."""

    arch: str
    recipe: Recipe
    name: str = "train"
    model_flags: Tuple[str, ...] = ()
    criterion: str = "label_smoothed_cross_entropy"
    criterion_flags: Tuple[str, ...] = ()
    data: Optional[Ref] = None  # None: the experiment's dataset; else an SKD corpus
    # ("finetune", ref): --finetune-from-model (weights only, fresh optimizer and schedule);
    # ("continue", ref): --continue-once (weights, optimizer, schedule and update count); with a
    # ``resume`` ref: the averaged weights of a finished stage, its last optimizer state and update
    # count, so the learning rate goes on along its schedule (no second warm-up).
    init: Optional[Tuple[str, Ref]] = None
    kind: str = "train"


@dataclass(frozen=True)
class SkdStage:
    """``deepnmt-skd``: the teacher translates the training split (GPKD stage 2)."""

    teacher: Ref
    name: str = "skd"
    beam: int = 4
    lenpen: float = 0.6
    shards: int = 10
    max_tokens: int = 8192
    kind: str = "skd"


@dataclass(frozen=True)
class ExtractStage:
    """``deepnmt-extract-student``: one layer per group (GPKD stage 3)."""

    teacher: Ref
    name: str = "extract"
    encoder_group_size: int = 1
    decoder_group_size: int = 1
    select: str = "random"
    seed: int = 1
    kind: str = "extract"


Stage = Union[TrainStage, SkdStage, ExtractStage]


@dataclass(frozen=True)
class EvalSpec:
    """How the papers decode and score."""

    beam: int
    lenpen: float
    average: int  # last K checkpoints (1 = checkpoint_last.pt as it is)
    primary: str  # results.json key compared with the paper's BLEU
    batch_size: int = 128
    mode: str = "average"  # "average": one averaged model; "mean": mean score of the last K
    lowercase: bool = False  # IWSLT: case-insensitive BLEU
    also_single: bool = False  # also score checkpoint_last.pt alone (GPKD Table 5 "Single")
    stage: Optional[str] = None  # default: the last train stage
    notes: Tuple[str, ...] = ()
    # summarization (MSC Appendix A): fairseq-generate --no-repeat-ngram-size (trigram blocking = 3)
    # and the --max-len-b values tried on the validation set (the best one decodes the test set)
    no_repeat_ngram_size: int = 0
    max_len_b: Tuple[int, ...] = ()


@dataclass(frozen=True)
class Experiment:
    name: str
    paper: str
    dataset: str
    stages: Tuple[Stage, ...]
    eval: EvalSpec
    title: str = ""
    notes: Tuple[str, ...] = ()

    def __post_init__(self):
        if self.dataset not in DATASETS:
            raise ValueError(f"{self.name}: unknown dataset {self.dataset!r}")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate stage names {names}")
        if not self.train_stages:
            raise ValueError(f"{self.name}: no training stage")

    @property
    def multi_stage(self) -> bool:
        return len(self.stages) > 1

    @property
    def train_stages(self) -> List[TrainStage]:
        return [s for s in self.stages if s.kind == "train"]

    @property
    def eval_stage(self) -> TrainStage:
        if self.eval.stage:
            return self.stage(self.eval.stage)
        return self.train_stages[-1]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"{self.name} has no stage {name!r} (stages: {[s.name for s in self.stages]})")

    @property
    def lang_pair(self) -> Tuple[str, str]:
        return DATASETS[self.dataset]

    def refs(self) -> List[Ref]:
        out = []
        for s in self.stages:
            if s.kind == "train":
                if s.data is not None:
                    out.append(s.data)
                if s.init is not None:
                    out.append(s.init[1])
            else:
                out.append(s.teacher)
        return out


@dataclass(frozen=True)
class Row:
    """One row of a paper's table.

    ``paper``: the paper's numbers by results.json key: ``bleu`` (compared with the
    experiment's primary metric), ``sacrebleu``, ``tokens_per_s``, ``train_hours``,
    ``params_m``, ``valid_ppl``, ``single_bleu``; a string such as ``"failed"`` or
    ``"-"`` where the paper reports no number."""

    label: str
    experiment: Optional[str]
    paper: Dict[str, Union[float, str]] = field(default_factory=dict)
    note: str = ""
    # a second evaluation of the same trained experiment (e.g. GPKD's greedy-search claim): extra
    # ``evaluate`` flags and the results file they write (evaluate.py names it from the beam/lenpen)
    eval_args: str = ""
    results: str = "results.json"


@dataclass(frozen=True)
class Table:
    key: str  # e.g. "msc-t2"
    paper: str
    title: str
    rows: Tuple[Row, ...]
    note: str = ""


@dataclass(frozen=True)
class Choice:
    """A setting a paper leaves open or gives in words: ``what``, ``paper`` (its text) and ``ours`` (what the
    registry does), a row of a paper's procedure table in docs/reproduction.md (registry ``PROCEDURES``)."""

    what: str
    paper: str
    ours: str


# ------------------------------------------------------------------------------ figures
# A paper's figure as registry data (``registry.FIGURES``); ``figures.py`` reads the runs' logs and
# results for it and plots them (``deepnmt-repro plot KEY``).
@dataclass(frozen=True)
class Run:
    """Training logs of one curve: (experiment, train stage) pairs read one after the other (a
    two-stage run is its stage 1 followed by its stage 2); stage None = the experiment's
    evaluation stage."""

    logs: Tuple[Tuple[str, Optional[str]], ...]


@dataclass(frozen=True)
class Point:
    """One point of a sweep: an experiment's result (``results`` file) at position ``x``."""

    x: float
    experiment: str
    results: str = "results.json"


@dataclass(frozen=True)
class Figure:
    key: str
    paper: str
    title: str
    kind: str  # "curves" | "sweep"
    x_label: str
    panels: Tuple[Tuple[str, str], ...]  # (metric, y label): one subplot each
    lines: Tuple[Tuple[str, Tuple], ...]  # (line label, runs (curves: one Run) / points (sweep))
    chosen: str = ""  # what the paper does not state and we chose

    def __post_init__(self):
        if self.kind not in ("curves", "sweep"):
            raise ValueError(f"{self.key}: unknown kind {self.kind}")


def experiments_of(fig: Figure) -> List[str]:
    """The experiments behind a figure, in the order its lines name them."""
    names: List[str] = []
    for _, item in fig.lines:
        for name in ([e for e, _ in item.logs] if isinstance(item, Run) else [p.experiment for p in item]):
            if name not in names:
                names.append(name)
    return names


# ------------------------------------------------------------------------------ preemption
#: The save-interval rule's machine (issue 67 §3): one node of 8 GPUs (scripts/slurm/train.sbatch's
#: default) sustaining 20 TFLOP/s each on these models in mixed precision, a conservative figure (V100s
#: train fairseq transformers at about 30-40, A100s faster): a slower node saves less often than every
#: 30 minutes, a faster one more often.
RULE_NODE_FLOPS = 8 * 20e12
#: Training tokens per epoch (target side, after BPE), rounded up: corpus pairs x mean length.
EPOCH_TOKENS: Dict[str, float] = {
    "iwslt14-de-en": 4.2e6, "iwslt14-en-de": 4.2e6, "iwslt14-de-en-fairseq": 4.2e6,  # 160k pairs x ~26
    "iwslt17-en-fr": 6.6e6,  # 236k x ~28
    "wmt14-en-de": 140e6, "wmt14-en-de-dd": 140e6, "wmt14-en-de-gpkd": 140e6,  # 4.5M x ~31
    "wmt14-en-fr": 1.2e9,  # 36M x ~33
    "wmt15-cs-en": 28e6,  # ~1M x ~28 (no CzEng)
    "cnndm": 184e6,  # 287k articles x 640 source tokens (batches are filled by the longer side)
}
RULE_MAX_SECONDS = 1800.0
RULE_STEPS = (100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000)


def seconds_per_update(params: int, tokens_per_update: int, node_flops: float = RULE_NODE_FLOPS) -> float:
    """6 FLOPs per parameter and token (forward + backward) on the rule's node."""
    return 6.0 * params * tokens_per_update / node_flops


def checkpoint_rule(params: int, tokens_per_update: int, dataset: str) -> Tuple[float, float, int]:
    """(seconds per update, seconds per epoch, the largest of :data:`RULE_STEPS` whose updates take at
    most 30 minutes) for a model of ``params`` parameters under the rule's node."""
    t = seconds_per_update(params, tokens_per_update)
    epoch = t * EPOCH_TOKENS[dataset] / tokens_per_update
    fits = [n for n in RULE_STEPS if n * t <= RULE_MAX_SECONDS]
    return t, epoch, max(fits) if fits else 1


def update_freq(tokens_per_update: int, max_tokens: int, world_size: int) -> int:
    """ceil(tokens_per_update / (max_tokens * world_size)): gradient accumulation that keeps
    the paper's tokens per update on any number of GPUs."""
    if min(tokens_per_update, max_tokens, world_size) < 1:
        raise ValueError("tokens per update, max tokens and world size must be >= 1")
    return max(1, math.ceil(tokens_per_update / (max_tokens * world_size)))


def batch_plan(tokens_per_update: int, max_tokens: int, world_size: int,
               min_max_tokens: int = 1024) -> Tuple[int, int, int]:
    """(update_freq, max_tokens per GPU, effective tokens per update).

    update_freq = ceil(T / (max_tokens * W)); then max_tokens is lowered to
    ceil(T / (W * update_freq)) so that W * update_freq * max_tokens stays at T (up to
    rounding) instead of overshooting it on many GPUs (64 GPUs x 4096 = 262k > 65k).
    It never goes below ``min_max_tokens`` (a long sentence pair must fit a batch);
    then the effective batch is larger than T and the caller warns."""
    uf = update_freq(tokens_per_update, max_tokens, world_size)
    mt = max(min(max_tokens, math.ceil(tokens_per_update / (world_size * uf))), min(min_max_tokens, max_tokens))
    return uf, mt, uf * mt * world_size
