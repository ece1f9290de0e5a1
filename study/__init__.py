"""The evidence study (``python -m study``; docs/fidelity.md is its report): each paper's central
effect, measured with models that learn, with seeds.  A room of its own (issue 80, part 2): it uses
the library (deepnmt_fairseq, deepnmt_data), which never imports it; benchmarks/ holds benchmarks.

Its modules, each importing only those listed before it:

* ``plan``: presets, runs, comparisons, records (where each run's result is kept);
* ``stats``: the paired bootstrap over test sentences and the seed-level bootstrap;
* ``launcher``: how a command is started and stopped (the fork server that has imported torch and
  fairseq, a process group per command, the deadline, SIGTERM/SIGINT);
* ``report``: docs/fidelity.md (and docs/fidelity-gpu.md) from the records;
* ``retune``: issue 77's findings in words (the recipe sweeps, the pre-norm check, the retuned runs and
  their calls), generated from the records into ``findings.md`` and the README between their markers;
* ``run``: every run as stages (train, then evaluate) that the job runner
  (:class:`deepnmt_fairseq.jobs.runner.Runner`) executes through the launcher, and the order of the
  runs;
* ``cli``: the command (``python -m study``, :mod:`study.__main__`).

``evaluate.py`` is the evaluation command every run calls (``python study/evaluate.py``);
``findings.md`` is the study's prose (embedded in the report; round 4's block is generated), ``lease.sh`` the GPU preset on a lent
machine.  The records stay under ``benchmarks/results/fidelity/<preset>/``.  Not part of the wheel:
it runs from a checkout.
"""
