"""The GPKD / distillation procedure as data: stages, each a command with its inputs and output.

One planner for every caller (``deepnmt-distill``, ``scripts/gpkd_pipeline.py``, the
registry's GPKD rows, the evidence study's GPKD and skipping runs).  The procedure (Li et al.
2021, Fig. 1 and "Two-stage Training") is written here once:

* teacher stage 1: GP training (``--gp-group-size h``), early-stopped on the validation loss
  (:func:`teacher_stages`);
* teacher stage 2 (skipping sub-layer, ``--ssl-rate`` > 0): continued from stage 1's
  *averaged* model with stage 1's optimizer state, schedule and update count
  (``deepnmt-average-checkpoints --keep-training-state``, then ``fairseq-train
  --continue-once``); ``restart_schedule`` starts a fresh optimizer and warm-up instead
  (``--finetune-from-model``); ``ssl_from_scratch`` is Table 4's "Scratch": one stage with
  skipping from update 0;
* the teacher model is the average of the last K checkpoints of its last stage
  (:func:`average_stage`);
* SKD data: the *averaged* teacher translates the training set (``deepnmt-skd``,
  :func:`skd_stage`);
* the student: one layer per group with h = the teacher's own GP h, read from its checkpoint
  (:func:`extraction_group_sizes`, ``deepnmt-extract-student``), or, for a teacher trained
  without GP, a student trained from scratch (:func:`student_init`);
* student training on the SKD data (:func:`train_stage`, ``--finetune-from-model`` from the
  extracted weights), then its average.

A :class:`Stage` is skipped when its output exists (:mod:`.run`); every command it runs
resumes when interrupted (fairseq-train from ``checkpoint_last.pt``, deepnmt-skd from its
first unfinished shard, averaging and extraction write atomically).  Nothing here starts a
process: the plan can be printed, tested and run by :class:`deepnmt_fairseq.distill.run.Runner`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

# the one job model and fairseq command builder (deepnmt_fairseq/jobs): a plan is a list of Stage
from ..jobs.fairseq_argv import averaged_path, fairseq_train, gp_flags, user_dir  # noqa: F401  (re-exported)
from ..jobs.stage import Stage

def gpkd_train_args() -> str:
    """The GPKD paper's training settings (Wang et al. 2019a's), as fairseq-train flags: read from the
    registry's GPKD recipe (``repro/registry/gpkd.py``: ``GPKD_BASE``, ``RPR_DROP``), the one place
    its numbers are written, with its tokens per update on the papers' 8 GPUs.  Every stage's
    fairseq-train gets them unless the caller passes its own (``DEFAULT_TRAIN_ARGS``)."""
    from ..repro.registry.gpkd import GPKD_BASE as r, RPR_DROP
    from ..repro.spec import batch_plan

    update_freq, max_tokens, _ = batch_plan(r.tokens_per_update, r.max_tokens, 8)
    return (f"--optimizer {r.optimizer} --adam-betas {r.adam_betas.replace(' ', '')} --lr {r.lr:g} "
            f"--lr-scheduler {r.lr_scheduler} --warmup-updates {r.warmup_updates} --warmup-init-lr "
            f"{r.warmup_init_lr:g} --criterion label_smoothed_cross_entropy --label-smoothing {r.label_smoothing:g} "
            f"--max-tokens {max_tokens} --update-freq {update_freq} {' '.join(RPR_DROP)}")


def __getattr__(name: str):
    """``DEFAULT_TRAIN_ARGS``: :func:`gpkd_train_args`, read when first asked for (the registry is
    imported then, not with this module)."""
    if name == "DEFAULT_TRAIN_ARGS":
        value = globals()["DEFAULT_TRAIN_ARGS"] = gpkd_train_args()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PlanError(ValueError):
    """A plan that cannot be made; the message names the flag or file."""


def _s(values) -> List[str]:
    return [str(v) for v in values]


# ---------------------------------------------------------------- the h rule
def extraction_group_sizes(cfg_model) -> Tuple[int, int]:
    """(encoder h, decoder h) of one-layer-per-group extraction: the group sizes the teacher was
    GP-trained with, read from its own config (Li et al. 2021, 'Student Training': GP training
    with group size h makes each layer of a group stand in for the group).  (1, 1): trained
    without GP, nothing to extract."""
    from ..modules.student_extraction import teacher_group_sizes

    h = teacher_group_sizes(cfg_model)
    return h["encoder"], h["decoder"]



# ---------------------------------------------------------------- stages
def train_stage(name: str, data, save_dir: Path, arch: str, flags: Sequence, max_update: int, common: Sequence,
                extra: Sequence = ()) -> Stage:
    """fairseq-train into ``save_dir`` (resumes from its checkpoint_last.pt when re-run)."""
    save_dir = Path(save_dir)
    return Stage(name, fairseq_train(data, ["--arch", arch, *flags, "--max-update", max_update, "--save-dir", save_dir],
                                     common, extra),
                 save_dir, marker=True, log=save_dir / "train.log", what=f"train {name}", kind="train")



#: which checkpoints deepnmt-average-checkpoints counts: either kind by update, checkpoint_E_U.pt by
#: update, checkpointE.pt by epoch (a recipe that saves per epoch averages epoch checkpoints)
AVERAGE_BY = {"any": "--num-checkpoints", "update": "--num-update-checkpoints", "epoch": "--num-epoch-checkpoints"}


def average_stage(name: str, stage_dir: Path, k: int, keep_training_state: bool = False,
                  out: Optional[Path] = None, by: str = "any", label: Optional[str] = None) -> Optional[Stage]:
    """deepnmt-average-checkpoints over the last ``k`` checkpoints (None for k <= 1); ``out``:
    where the average goes (default: :func:`averaged_path`, inside ``stage_dir``); ``by``: a key
    of :data:`AVERAGE_BY`; ``keep_training_state``: the newest checkpoint's optimizer state and
    update count are kept, for ``--continue-once`` (two-stage training); ``label``: the stage's
    name in the description (default: the directory's)."""
    if k <= 1:
        return None
    out = Path(out) if out is not None else averaged_path(stage_dir, k, keep_training_state)
    return Stage(name, _s(["deepnmt-average-checkpoints", "--inputs", stage_dir, AVERAGE_BY[by], k,
                           "--output", out, *(["--keep-training-state"] if keep_training_state else [])]),
                 out, what=f"average the last {k} checkpoints of {label or Path(stage_dir).name}"
                           + (" keeping the newest one's optimizer state and update count (to continue training)"
                              if keep_training_state else ""), kind="average", rank0_only=True)


def teacher_stages(work: Path, data, arch: str, flags: Sequence, h_enc: int, h_dec: int, common: Sequence,
                   stage1_updates: int, stage2_updates: int, average: int, ssl_rate: float = 0.0,
                   ssl_from_scratch: bool = False, restart_schedule: bool = False, patience: int = 3,
                   name: str = "teacher") -> Tuple[List[Stage], Path]:
    """GP teacher training, one or two stages, and its averaged model: (stages, teacher model)."""
    if ssl_from_scratch and ssl_rate <= 0:
        raise PlanError("--ssl-from-scratch needs --ssl-rate > 0")
    if ssl_from_scratch and restart_schedule:
        raise PlanError("--restart-schedule is about stage 2; --ssl-from-scratch trains one stage")
    work = Path(work)
    early_stop = ["--patience", str(patience)] if patience > 0 else []
    gp = gp_flags(h_enc, h_dec)
    ssl = ["--ssl-rate", str(ssl_rate)] if ssl_rate > 0 else []
    s1 = work / f"{name}-stage1"
    stages = [train_stage(f"{name}-stage1", data, s1, arch, [*flags, *gp, *(ssl if ssl_from_scratch else [])],
                          stage1_updates, common, early_stop)]
    last = s1
    if ssl and not ssl_from_scratch:
        # stage 2: skipping on, GP kept, from stage 1's averaged model; the schedule goes on
        avg = average_stage(f"{name}-stage1-average", s1, average, keep_training_state=not restart_schedule)
        if avg is not None:
            stages.append(avg)
        start = averaged_path(s1, average, keep_training_state=not restart_schedule)
        init = ["--finetune-from-model", start] if restart_schedule else ["--continue-once", start]
        last = work / f"{name}-stage2"
        stages.append(train_stage(f"{name}-stage2", data, last, arch, [*flags, *gp, *ssl], stage2_updates, common,
                                  [*early_stop, *init]))
    avg = average_stage(f"{name}-average", last, average)
    if avg is not None:
        stages.append(avg)
    return stages, averaged_path(last, average)


def skd_stage(data, teacher: Path, out: Path, device: Sequence = (), extra: Sequence = ()) -> Stage:
    """deepnmt-skd: the (averaged) teacher translates the training set (its .done comes last)."""
    return Stage("skd", _s(["deepnmt-skd", "--data", data, "--teacher", teacher, "--output", out, *device, *extra]),
                 Path(out) / ".done", log=Path(str(out) + ".log"), what="SKD data from the averaged teacher", kind="skd",
                 rank0_only=True)


def extract_stage(teacher: Path, h_enc: int, h_dec: int, out: Path, select: str = "random", seed: int = 1) -> Stage:
    """deepnmt-extract-student with the teacher's own h (the CLI refuses any other)."""
    return Stage("extract", _s(["deepnmt-extract-student", "--teacher", teacher, "--encoder-group-size", h_enc,
                                "--decoder-group-size", h_dec, "--select", select, "--seed", seed, "--output", out]),
                 Path(out), what=f"one layer per group (h = {h_enc} encoder, {h_dec} decoder)", kind="extract",
                 rank0_only=True)


def export_stage(checkpoint: Path, out: Path, data, quantization: str, extra: Sequence = ()) -> Stage:
    """deepnmt-export-ct2 (``--force``: a half-written directory of an interrupted export is replaced)."""
    return Stage("export", _s(["deepnmt-export-ct2", checkpoint, out, "--quantization", quantization, "--data", data,
                               *extra, "--force"]), Path(out), marker=True, log=Path(str(out) + ".log"),
                 what=f"CTranslate2 export ({quantization})", kind="export", rank0_only=True)


# ---------------------------------------------------------------- the student's architecture
def model_flags_from_cfg(cfg_model, arch: Optional[str] = None) -> List[str]:
    """fairseq-train flags that rebuild the model of ``cfg_model`` (a checkpoint's model config):
    every model option of the architecture's parser with its recorded value."""
    import deepnmt_fairseq  # noqa: F401  (registers the plugin)
    from fairseq.models import ARCH_MODEL_REGISTRY

    arch = arch or str(getattr(cfg_model, "arch", None) or getattr(cfg_model, "_name"))
    if arch not in ARCH_MODEL_REGISTRY:
        raise PlanError(f"architecture {arch!r} of the teacher is not registered")
    parser = argparse.ArgumentParser(allow_abbrev=False, argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    flags: List[str] = []
    for action in parser._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if not long or not hasattr(cfg_model, action.dest):
            continue
        value = getattr(cfg_model, action.dest)
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                flags.append(long[0])
        elif isinstance(action, argparse._StoreFalseAction):
            if value is False:
                flags.append(long[0])
        elif value is not None and value != "" and not isinstance(value, (dict,)):
            flags += [long[0], ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    return flags


def build_student(arch: str, flags: Sequence[str], vocab_size: int, dictionaries=None):
    """The student model fairseq-train will build from ``--arch arch flags`` (a dummy vocabulary
    of the data's size, or the data's ``(source, target)`` dictionaries), and its args: what the
    exporter's refusals are asked about *before* any training."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from ..analysis.param_counts import make_dictionary

    parser = argparse.ArgumentParser(allow_abbrev=False, argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    args, unknown = parser.parse_known_args(list(flags))
    ARCH_CONFIG_REGISTRY[arch](args)
    src, tgt = dictionaries if dictionaries is not None else (make_dictionary(vocab_size),) * 2
    task = argparse.Namespace(source_dictionary=src, target_dictionary=tgt)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), args


def export_refusals(arch: str, flags: Sequence[str], vocab_size: int) -> List[str]:
    """:func:`deepnmt_fairseq.deploy.export.refusals` of the student built from its flags."""
    from ..deploy.export import refusals

    model, args = build_student(arch, flags, vocab_size)
    return refusals(model.eval(), args)


def transfer_init(teacher: Path, arch: str, flags: Sequence[str], data: Path, out: Path) -> dict:
    """``--student-init teacher``: the student fairseq-train will build, with every tensor of the
    teacher whose name and shape are the same copied in (the rest keeps fairseq's initialisation),
    written as a checkpoint for ``--finetune-from-model``.  For a teacher of the student's width
    and depths whose extra paths are separate modules (MSC's context attention and fusion gates)
    that is every weight of the student: it starts as the teacher without those paths.  Returns
    the counts (also in ``extra_state["distill_init"]``)."""
    import torch
    from fairseq.data import Dictionary

    from ..checkpoint_safety import load_checkpoint
    from ..checkpoint_averaging import save_atomic
    from .skd import language_pair

    src, tgt = language_pair(str(data))
    dicts = tuple(Dictionary.load(str(Path(data) / f"dict.{lang}.txt")) for lang in (src, tgt))
    torch.manual_seed(1)
    model, args = build_student(arch, flags, len(dicts[1]), dicts)
    state = load_checkpoint(str(teacher))
    theirs = state["model"]
    mine = model.state_dict()
    copied = [k for k, v in mine.items() if k in theirs and tuple(theirs[k].shape) == tuple(v.shape)]
    for k in copied:
        mine[k] = theirs[k].to(mine[k].dtype).clone()
    out_state = {k: v for k, v in state.items() if k not in ("model", "last_optimizer_state", "averaged_from")}
    out_state["model"] = mine
    cfg = dict(out_state.get("cfg") or {})
    cfg["model"] = args
    out_state["cfg"] = cfg
    extra = dict(out_state.get("extra_state") or {})
    extra.pop("train_iterator", None)
    info = {"teacher": str(teacher), "copied": len(copied), "tensors": len(mine),
            "not_copied": sorted(set(mine) - set(copied))}
    extra["distill_init"] = info
    out_state["extra_state"] = extra
    save_atomic(out_state, str(out))
    return info


def extracted_student_flags(student_init: Path, arch: Optional[str] = None) -> List[str]:
    """fairseq-train flags of an extracted student (``deepnmt-extract-student`` output): the
    teacher's architecture with the kept depths, GP off, no skipping (GPKD students are plain
    models of the new depth)."""
    from ..checkpoint_safety import load_checkpoint
    from ..modules.student_extraction import model_args as _model_args

    return student_flags_of(_model_args(load_checkpoint(str(student_init))), arch)


def student_flags_of(extracted_cfg, arch: Optional[str] = None) -> List[str]:
    """The flags of an extracted student's config (:func:`extracted_student_flags`; ``deepnmt-distill``
    calls it on the in-memory extraction, before any work): skipping switched off."""
    extracted_cfg.ssl_rate = 0.0
    return model_flags_from_cfg(extracted_cfg, arch)


def gpkd_stages(work: Path, data, arch: str, flags: Sequence, h_enc: int, h_dec: int, common: Sequence, *,
                stage1_updates: int, stage2_updates: int, student_updates: int, average: int, ssl_rate: float = 0.0,
                ssl_from_scratch: bool = False, restart_schedule: bool = False, patience: int = 3,
                select: str = "random", seed: int = 1, device: Sequence = (), skd_args: Sequence = (),
                student_args: Sequence = (), student_common: Optional[Sequence] = None,
                student_arch: Optional[str] = None) -> Tuple[List[Stage], dict]:
    """The whole GPKD procedure (Li et al. 2021, Fig. 1): GP teacher in one or two stages, its
    average, SKD data from the averaged teacher, one layer per group with the h the teacher was
    GP-trained with, the student trained on the SKD data from the extracted weights
    (``--finetune-from-model``: a new run with its own warm-up), and its average.  Returns
    (stages, {"teacher", "skd", "student_init", "student_dir", "student"} paths)."""
    work = Path(work)
    stages, teacher = teacher_stages(work, data, arch, flags, h_enc, h_dec, common, stage1_updates, stage2_updates,
                                     average, ssl_rate, ssl_from_scratch, restart_schedule, patience)
    skd = work / "skd-bin"
    stages.append(skd_stage(data, teacher, skd, device, skd_args))
    init = work / "student-init.pt"
    stages.append(extract_stage(teacher, h_enc, h_dec, init, select, seed))
    s_dir = work / "student"
    s_common = list(common if student_common is None else student_common)

    def student_argv() -> List[str]:
        s_arch = student_arch or arch
        return train_stage("student", skd, s_dir, s_arch, [*extracted_student_flags(init, s_arch), *student_args],
                           student_updates, s_common, ["--finetune-from-model", init]).argv

    stages.append(Stage("student", student_argv, s_dir, marker=True, log=s_dir / "train.log",
                        what="train the student on the SKD data from the extracted weights"))
    avg = average_stage("student-average", s_dir, average)
    if avg is not None:
        stages.append(avg)
    return stages, {"teacher": teacher, "skd": skd, "student_init": init, "student_dir": s_dir,
                    "student": averaged_path(s_dir, average)}
