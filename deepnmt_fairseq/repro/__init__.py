"""Reproducing the papers' tables: the experiment registry and the ``deepnmt-repro`` command.

``registry`` holds every row of the papers' tables (``EXPERIMENTS``, ``TABLES``), built on
the data model in ``spec`` and on the model code's named architectures; ``commands``
turns a registry entry into the exact commands (fairseq-train, deepnmt-skd,
deepnmt-extract-student) and runs them, ``evaluate`` averages/decodes/scores with the
papers' BLEU variants (:mod:`deepnmt_fairseq.scoring`), ``tables`` renders paper-vs-ours tables and
docs/reproduction.md, ``hydra_config`` writes the ``configs/*.yaml`` files (the corpora
registry is ``deepnmt_data.corpora``, what deepnmt-prepare-data builds), and ``cli`` is
``deepnmt-repro``'s sub-commands (its arguments: ``deepnmt_cli.repro``,
also ``python -m deepnmt_cli.repro``).

Importing ``deepnmt_fairseq`` loads fairseq (the package registers its models); the
submodules import nothing else heavy at import time.
"""
