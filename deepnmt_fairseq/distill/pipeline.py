"""Train deep, serve shallow: from a trained teacher to a served CTranslate2 student, planned.

:func:`plan_distillation` checks everything that can be checked before any work (the teacher
exists and was trained on this data's dictionary, the student can be extracted from it, the
student's model can be exported exactly) and returns the stages of :mod:`.plan`:

  teacher average (a checkpoint directory) -> SKD data -> student initialisation (extraction
  with the teacher's GP h, or none) -> student training -> student average -> export -> report.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from .teacher_row import RowTeacher
from .plan import (DEFAULT_TRAIN_ARGS, PlanError, Stage, average_stage, averaged_path, export_refusals,
                   export_stage, extract_stage, extraction_group_sizes, skd_stage, student_flags_of, train_stage,
                   transfer_init)

# the scratch student's default depth cap: a student deeper than this is not "shallow"
SCRATCH_MAX_LAYERS = 6


@dataclass
class DistillConfig:
    work: Path
    data: Path
    teacher: Path
    average: int = 5
    student_init: str = "auto"  # auto | extract | teacher | scratch
    student_arch: Optional[str] = None
    encoder_layers: Optional[int] = None
    decoder_layers: Optional[int] = None
    #: a depth not given is the teacher's, capped at this (None: not capped, e.g. DESDAR's whole encoder)
    depth_cap: Optional[int] = SCRATCH_MAX_LAYERS
    dim: Optional[int] = None
    ffn_dim: Optional[int] = None
    heads: Optional[int] = None
    student_args: Sequence[str] = ()
    train_args: Sequence[str] = tuple(shlex.split(DEFAULT_TRAIN_ARGS))
    student_updates: int = 50000
    save_interval_updates: int = 0  # 0: student_updates // 16
    select: str = "random"
    seed: int = 1
    skd_args: Sequence[str] = ()
    quantization: str = "int8"
    #: the export carries a vocabulary shortlist (deepnmt-export-ct2 --vmap, added here): its own directory
    shortlist: bool = False
    export_args: Sequence[str] = ()
    cpu: bool = False
    #: ``--teacher-row``: a registry row trained first (``teacher`` is then its last stage's directory)
    teacher_row: Optional["RowTeacher"] = None


@dataclass
class DistillPlan:
    stages: List[Stage]
    teacher_model: Path
    student_model: Path
    ct2_model: Path
    init: str  # "extract" or "scratch"
    group_sizes: tuple
    student_arch: str
    student_flags: List[str]
    vocab_size: int
    notes: List[str] = field(default_factory=list)


def _teacher_file(teacher: Path) -> Path:
    """The checkpoint whose config and dictionary stand for ``--teacher`` (a file, or the newest of a
    directory)."""
    if not teacher.exists():
        raise PlanError(f"--teacher {teacher}: no such file or directory")
    if teacher.is_dir():
        last = teacher / "checkpoint_last.pt"
        if not last.is_file():
            raise PlanError(f"--teacher {teacher}: a directory without checkpoint_last.pt (give a checkpoint file, "
                            f"or fairseq-train's --save-dir)")
        return last
    return teacher


def check_dictionary(state: dict, teacher: Path, data: Path) -> int:
    """The teacher's vocabularies against the dictionaries of ``--data``; returns the target
    vocabulary size.  Refused: a size that differs from the embedding rows, or a dictionary file
    recorded by the teacher's own data directory that differs from the one in ``--data``."""
    from fairseq.data import Dictionary

    from .skd import language_pair

    try:
        src, tgt = language_pair(str(data))
    except ValueError as err:
        raise PlanError(f"--data {data}: {err}") from None
    cfg = state.get("cfg") or {}
    task = cfg.get("task") if isinstance(cfg, dict) else None
    if isinstance(task, dict):
        recorded = task.get("data")
    else:
        recorded = getattr(task if task is not None else state.get("args"), "data", None)
    sizes = {}
    for side, lang in (("encoder", src), ("decoder", tgt)):
        path = data / f"dict.{lang}.txt"
        if not path.is_file():
            raise PlanError(f"--data {data}: {path.name} missing")
        n = len(Dictionary.load(str(path)))
        sizes[side] = n
        rows = state["model"].get(f"{side}.embed_tokens.weight")
        if rows is not None and rows.shape[0] != n:
            raise PlanError(f"--teacher {teacher}: its {side} vocabulary has {rows.shape[0]} entries, {path} has {n}: "
                            f"the teacher was trained with another dictionary than --data's")
        if recorded:
            theirs = Path(str(recorded).split(os.pathsep)[0]) / f"dict.{lang}.txt"
            if theirs.is_file() and theirs.resolve() != path.resolve() and theirs.read_bytes() != path.read_bytes():
                raise PlanError(f"--teacher {teacher}: it was trained with {theirs}, which differs from {path} of "
                                f"--data (same size, other words or order)")
    return sizes["decoder"]


def _scratch_flags(cfg_model, c: DistillConfig) -> List[str]:
    def teacher(name, default=None):
        v = getattr(cfg_model, name, None)
        return default if v is None else v

    def depth(given, name):
        if given:
            return given
        theirs = int(teacher(name, 6))
        return theirs if c.depth_cap is None else min(theirs, c.depth_cap)

    enc, dec = depth(c.encoder_layers, "encoder_layers"), depth(c.decoder_layers, "decoder_layers")
    dim = c.dim or int(teacher("encoder_embed_dim", 512))
    ffn = c.ffn_dim or int(teacher("encoder_ffn_embed_dim", 4 * dim))
    heads = c.heads or int(teacher("encoder_attention_heads", 8))
    flags = ["--encoder-layers", enc, "--decoder-layers", dec, "--encoder-embed-dim", dim, "--decoder-embed-dim", dim,
             "--encoder-ffn-embed-dim", ffn, "--decoder-ffn-embed-dim", ffn, "--encoder-attention-heads", heads,
             "--decoder-attention-heads", heads, "--dropout", teacher("dropout", 0.1)]
    if teacher("share_all_embeddings", False):
        flags.append("--share-all-embeddings")
    elif teacher("share_decoder_input_output_embed", False):
        flags.append("--share-decoder-input-output-embed")
    return [str(f) for f in flags]


def plan_distillation(c: DistillConfig) -> DistillPlan:
    """Check, then plan (module doc).  Raises :class:`PlanError` naming the flag or file."""
    import deepnmt_fairseq  # noqa: F401  (registers the plugin, allow-lists fairseq's classes)

    from ..checkpoint_safety import load_checkpoint
    from ..modules.student_extraction import extract, model_args as _model_args

    work, data, row = Path(c.work), Path(c.data), c.teacher_row
    teacher = Path(row.directory if row is not None else c.teacher)
    if not data.is_dir():
        raise PlanError(f"--data {data}: no such directory" + (f" (the data of --teacher-row {row.name}: prepare it, "
                                                                 f"or give --data)" if row is not None else ""))
    untrained = row is not None and not row.trained()
    tfile = teacher / "checkpoint_last.pt" if row is not None else _teacher_file(teacher)
    try:
        state = row.untrained_state(data) if untrained else load_checkpoint(str(tfile))
        t_cfg = _model_args(state)
    except (ValueError, RuntimeError, OSError) as err:
        raise PlanError(f"--teacher{'-row ' + row.name if row is not None else ''} {tfile}: {err}") from None
    vocab = check_dictionary(state, tfile, data)
    t_arch = str(getattr(t_cfg, "arch", None) or getattr(t_cfg, "_name", ""))
    h_enc, h_dec = extraction_group_sizes(t_cfg)
    gp_trained = h_enc > 1 or h_dec > 1
    if c.student_init not in ("auto", "extract", "teacher", "scratch"):
        raise PlanError(f"--student-init {c.student_init}: choose auto, extract, teacher or scratch")
    init = c.student_init if c.student_init != "auto" else ("extract" if gp_trained else "teacher")
    notes = []
    if row is not None:
        notes.append(f"teacher: registry row {row.name}, {'trained earlier' if not untrained else 'trained first'} in "
                     f"{teacher} (deepnmt-repro train; its data {data})")
    if init == "extract":
        if not gp_trained:
            raise PlanError(f"--student-init extract: the teacher {tfile} was trained without group permutation "
                            f"(--gp-group-size 1), so no layer stands in for a group and there is nothing to extract "
                            f"(Li et al. 2021); use --student-init scratch, or GP-train the teacher")
        given = [f for f, v in (("--student-encoder-layers", c.encoder_layers), ("--student-decoder-layers",
                 c.decoder_layers), ("--student-dim", c.dim), ("--student-ffn-dim", c.ffn_dim), ("--student-heads",
                 c.heads), ("--student-arch", c.student_arch)) if v]
        if given:
            raise PlanError(f"{', '.join(given)}: an extracted student has the teacher's architecture with N/h layers "
                            f"(h = the teacher's GP group size {h_enc}/{h_dec}); use --student-init scratch to choose it")
        try:
            s_state = extract(state, h_enc, h_dec, c.select, c.seed)
        except ValueError as err:
            raise PlanError(f"--student-init extract: the student cannot be extracted from {tfile}: {err}") from None
        s_cfg = _model_args(s_state)
        arch = t_arch
        flags = student_flags_of(s_cfg, arch)  # the student is a plain model of the new depth (no GP, no skipping)
        notes.append(f"student: one layer per group of the teacher (h = {h_enc} encoder, {h_dec} decoder, "
                     f"--select {c.select}), {s_cfg.encoder_layers}-{s_cfg.decoder_layers} layers")
    else:
        arch = c.student_arch or "deepnmt_transformer"
        flags = _scratch_flags(t_cfg, c)
        how = ("initialised with the teacher's tensors of the same name and shape" if init == "teacher"
               else "trained from scratch")
        notes.append(f"student: {arch} ({' '.join(_scratch_flags(t_cfg, c))}) {how}, on the SKD data")
    flags = [*flags, *c.student_args]
    try:
        why = export_refusals(arch, flags, vocab)
    except (ValueError, TypeError, AttributeError) as err:
        raise PlanError(f"the student ({arch} {' '.join(flags)}) cannot be built: {err}") from None
    if why:
        fix = ("use --student-init scratch (a pre-norm deepnmt_transformer)" if init == "extract"
               else "change --student-arch/--student-args")
        raise PlanError("the student cannot be exported to CTranslate2 exactly, refused before any training:\n  - "
                        + "\n  - ".join(why) + f"\n{fix}")

    device = ["--cpu"] if c.cpu else []
    stages: List[Stage] = [row.stage] if row is not None else []
    teacher_model = tfile
    if (row is not None or teacher.is_dir()) and c.average > 1:
        from ..checkpoint_averaging import newest_checkpoints

        try:
            if not untrained:
                newest_checkpoints(str(teacher), c.average)
        except (ValueError, FileNotFoundError) as err:
            raise PlanError(f"--teacher {teacher} --average {c.average}: {err} (save more checkpoints, lower --average, "
                            f"or give one checkpoint file)") from None
        avg = average_stage("teacher-average", teacher, c.average, out=work / f"teacher-avg{c.average}.pt",
                            by=row.average_by if row is not None else "any")
        if avg is not None:
            stages.append(avg)
            teacher_model = avg.output
    skd = work / "skd-bin"
    stages.append(skd_stage(data, teacher_model, skd, device, c.skd_args))
    extra: List[str] = []
    if init == "extract":
        st = extract_stage(teacher_model, h_enc, h_dec, work / "student-init.pt", c.select, c.seed)
        stages.append(st)
        extra = ["--finetune-from-model", str(st.output)]
    elif init == "teacher":
        out = work / "student-init.pt"
        tm = teacher_model
        stages.append(Stage("transfer", [], out, what="student initialised with the teacher's matching tensors",
                            call=lambda: transfer_init(tm, arch, flags, data, out)))
        extra = ["--finetune-from-model", str(out)]
    k = max(1, c.average)
    every = c.save_interval_updates or max(1, c.student_updates // 16)
    common = [*c.train_args, "--seed", str(c.seed), "--save-interval-updates", str(every),
              "--keep-interval-updates", str(k), "--keep-last-epochs", str(k),
              # validation only where the averaged checkpoints are (the student is not early-stopped)
              "--validate-after-updates", str(max(0, c.student_updates - k * every)),
              "--log-format", "simple", "--log-interval", str(max(1, min(100, every))),
              "--skip-invalid-size-inputs-valid-test", *(["--cpu", "--num-workers", "0"] if c.cpu else [])]
    s_dir = work / "student"
    stages.append(train_stage("student", skd, s_dir, arch, flags, c.student_updates, common, extra))
    avg = average_stage("student-average", s_dir, k, out=s_dir / f"checkpoint_avg{k}.pt")
    if avg is not None:
        stages.append(avg)
    student_model = avg.output if avg is not None else averaged_path(s_dir, k)
    ct2 = work / f"ct2-{c.quantization}{'-vmap' if c.shortlist else ''}"
    stages.append(export_stage(student_model, ct2, data, c.quantization,
                               [*c.export_args, *(["--vmap"] if c.shortlist else [])]))
    return DistillPlan(stages, Path(teacher_model), Path(student_model), ct2, init, (h_enc, h_dec), arch, flags, vocab,
                       notes)
