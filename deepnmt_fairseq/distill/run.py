"""Running a distillation plan: the project's one runner (:mod:`deepnmt_fairseq.jobs.runner`) -
each stage skipped when its output exists, its command's progress shown and logged, the work
directory tied to the settings it was made with.  Kept as this module's names for its callers."""

from ..jobs.runner import IN_PROCESS, PROGRESS, Runner, RunError, settings_guard  # noqa: F401

__all__ = ["IN_PROCESS", "PROGRESS", "Runner", "RunError", "settings_guard"]
