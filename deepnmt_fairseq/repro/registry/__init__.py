"""The experiment registry: one entry per row of the papers' tables.

``EXPERIMENTS`` (name -> :class:`~deepnmt_fairseq.repro.spec.Experiment`), ``TABLES`` (the papers'
tables, rows pointing at experiments) and ``FIGURES`` (the papers' figures, deepnmt-repro plot).
One module per paper adds its rows: :mod:`.msc` (Wei et al. 2020), :mod:`.bapna` (Bapna et al.
2018), :mod:`.deep_decoder` (CAD/CRT), :mod:`.gpkd` (Li et al. 2021), :mod:`.residual_scaling`
(DeepNet and Admin, the deep post-norm baselines); :mod:`.common` holds what
they share.  ``deepnmt-repro`` (and the wrappers scripts/train.sh, scripts/evaluate.sh) turn an
entry into commands:

    deepnmt-repro list [--table KEY]            # names, tables, rows
    deepnmt-repro show NAME                     # settings, notes, commands
    deepnmt-repro train NAME [--dry-run] ...    # every stage (scripts/train.sh NAME)
    deepnmt-repro evaluate NAME ...             # average, decode, score (scripts/evaluate.sh NAME)

Hyper-parameters come from the papers' settings sections; where a paper is silent the
value follows its cited setup (Vaswani et al. 2017, Ott et al. 2018, Wang et al. 2019a)
and a note says so (``show NAME`` prints them; docs/reproduction.md lists them all).

Architecture names, CAD defaults and the papers' parameter counts are the model code's
(:mod:`deepnmt_fairseq.models.architectures`): names are looked up in its ``ARCHS`` through
:func:`~.common.arch_name`, never rebuilt here, and a row's ``params_m`` is the architecture's
paper count (:func:`~.common.paper_params`) except where a table reports another number for the
same architecture (:data:`OWN_PARAM_COUNTS` says why).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from ...models.architectures import cad_defaults  # noqa: F401  (the model code's, not a copy)
from ..spec import Choice, Table, experiments_of
from . import bapna, deep_decoder, gpkd, msc, residual_scaling
from .common import (  # noqa: F401
    BAPNA, CR, DD, EXPERIMENTS, FIGURES, GPKD, MSC, arch_key, arch_name, exp_params, paper_params,
)
from .deep_decoder import DD_BASE, OWN_PARAM_COUNTS  # noqa: F401
from .gpkd import GPKD_PATIENCE  # noqa: F401

# the papers in this order; a later paper's rows may point at an earlier paper's experiments
TABLES: List[Table] = [*msc.tables(), *bapna.tables(), *deep_decoder.tables(), *gpkd.tables(),
                       *residual_scaling.tables()]
#: each paper's procedure (our choices next to its text), by registry module: docs/reproduction.md's
#: ``{{ procedure: NAME }}`` lines (deepnmt_fairseq/repro/templates/reproduction.md)
PROCEDURES: Dict[str, Tuple[Choice, ...]] = {"gpkd": gpkd.PROCEDURE, "deep_decoder": deep_decoder.PROCEDURE}


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
    for fig in FIGURES.values():
        for name in experiments_of(fig):
            if name not in EXPERIMENTS:
                raise ValueError(f"figure {fig.key}: unknown experiment {name}")


check_registry()
