"""Helpers of the reproduction scripts (scripts/experiments.py, train.sh, evaluate.sh).

``spec`` holds the data model of the experiment registry, ``commands`` turns a
registry entry into the exact commands (fairseq-train, deepnmt-skd,
deepnmt-extract-student) and runs them, ``scoring`` computes the papers' BLEU
variants, ``evaluate`` averages/decodes/scores, ``hydra_config`` writes the
``configs/*.yaml`` files.  Nothing here imports fairseq at import time.
"""
