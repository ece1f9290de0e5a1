"""The one job model (docs/architecture.md): plan -> stages -> runner -> fairseq.

* :mod:`.stage`: :class:`~.stage.Stage`, a step as data (argv, inputs, outputs, done-marker, which
  ranks run it) and the one timestamped log line (:func:`~.stage.make_log`);
* :mod:`.runner`: :class:`~.runner.Runner`, which executes a list of stages for everyone (skip
  when done, resume, settings guard, tee to log, progress, rank-0 steps awaited with a timeout);
* :mod:`.fairseq_argv`: the one ``fairseq-train`` / ``fairseq-generate`` command builder and
  ``--user-dir`` lookup;
* :mod:`.decode`: the one decode path (fairseq-generate with named search settings into an output that
  appears only when complete; scoring: :mod:`deepnmt_fairseq.scoring`);
* :mod:`.cluster`: the one cluster policy (device detection, launches, distributed flags, the
  DDP backend from the model's options, the loud failures of the GPU path, the dataset check).

The registry (:mod:`deepnmt_fairseq.repro.commands`), ``deepnmt-distill``
(:mod:`deepnmt_fairseq.distill`), the quickstart and the study only plan stages.  Nothing here
imports fairseq at import time.
"""
