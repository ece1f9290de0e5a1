"""``deepnmt-distill --teacher-row NAME``: a registry row of ``deepnmt-repro`` as the teacher.

The row's training stages run first, as ``deepnmt-repro train NAME --stage S ... [--repro-args]``
would run them (the same recipe, launchers, data and checkpoint roots, and the same directories,
so a row trained earlier with ``deepnmt-repro`` is reused, not retrained).  The teacher is the
row's last training stage: fairseq-train's save directory, whose last ``--average`` checkpoints
are averaged (by epoch or by update, as the row's recipe saves them).  The row's own SKD stage, if
it has one, is not run: ``deepnmt-distill`` makes its own SKD data from the averaged teacher.

Everything ``deepnmt-distill`` checks before any work needs the teacher's configuration and
weights' shapes.  Before the row is trained they come from the row's own ``fairseq-train`` command
(:meth:`deepnmt_fairseq.repro.commands.Planner.train_argv`, every flag included), built with
``--data``'s dictionaries; once it is trained, from its ``checkpoint_last.pt``.
"""

from __future__ import annotations

import argparse

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from .plan import PlanError, Stage


@dataclass
class RowTeacher:
    name: str
    #: ``deepnmt-repro train NAME --stage ...``: skipped when the row's last stage has its ``.done``
    stage: Stage
    #: the row's last training stage (fairseq-train's --save-dir): the teacher's checkpoints
    directory: Path
    #: the row's binarized data (``--data`` of ``deepnmt-repro train``, else its data root's)
    data: Path
    #: how the row's checkpoints are averaged: "epoch" or "update" (plan.AVERAGE_BY)
    average_by: str
    #: the fairseq-train flags of the teacher (its --arch and everything else)
    train_argv: List[str]

    def trained(self) -> bool:
        return (self.directory / ".done").exists() and (self.directory / "checkpoint_last.pt").is_file()

    def untrained_state(self, data: Path) -> dict:
        """The teacher's config and (untrained) weights, built from the row's flags and ``data``'s
        dictionaries: what the checks before any work read while the row is not trained yet."""
        import torch
        from fairseq.data import Dictionary

        from .skd import language_pair
        from .plan import build_student

        src, tgt = language_pair(str(data))
        dicts = tuple(Dictionary.load(str(Path(data) / f"dict.{lang}.txt")) for lang in (src, tgt))
        argv = self.train_argv
        arch = argv[argv.index("--arch") + 1]
        with torch.random.fork_rng():
            model, args = build_student(arch, argv, len(dicts[1]), dicts)
        return {"model": model.state_dict(), "cfg": {"model": args}}


def row_teacher(name: str, repro: "argparse.Namespace", argv: Sequence[str], extra: Sequence[str],
                log: Optional[Path] = None) -> RowTeacher:
    """Plan the training of registry row ``name`` from its parsed ``deepnmt-repro train`` flags
    ``repro`` (``deepnmt_cli.distill`` parses ``--repro-args``; ``argv`` are those flags as given,
    ``extra`` the fairseq-train flags after ``--``).  Raises :class:`PlanError` naming
    ``--teacher-row``."""
    from ..repro.cli import train_options
    from ..repro.commands import Planner, ReproError, checkpoint_pattern
    from ..repro.registry import EXPERIMENTS

    argv, extra = list(argv), list(extra)
    try:
        exp, opts = train_options(repro, extra, EXPERIMENTS)
    except ReproError as err:
        raise PlanError(f"--teacher-row {name}: {err}") from None
    trains = [s for s in exp.stages if s.kind == "train"]
    if not trains:
        raise PlanError(f"--teacher-row {name}: the row trains no model (its stages: "
                        f"{', '.join(s.name for s in exp.stages)})")
    last = trains[-1]
    planner = Planner(EXPERIMENTS, exp, opts)
    directory = planner.stage_dir(exp, last.name)
    data = Path(planner.resolve(last.data)) if last.data else opts.paths.dataset_bin(exp, exp)
    cmd = ["deepnmt-repro", "train", name, *[w for s in trains for w in ("--stage", s.name)], *argv,
           *(["--", *extra] if extra else [])]
    stage = Stage("teacher-row", cmd, directory, marker=True,
                  log=log, what=f"train the registry row {name} ({', '.join(s.name for s in trains)}: {exp.title})")
    return RowTeacher(name, stage, directory, data, checkpoint_pattern(last.recipe), planner.train_argv(last)[0])
