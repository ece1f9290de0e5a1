#!/usr/bin/env bash
# Evaluate one experiment as its paper does and write <save-dir>/results.json
# (`deepnmt-repro evaluate` with this checkout's work/ as default data/checkpoint root).
#
#   scripts/evaluate.sh NAME [--checkpoint-dir DIR] [--dry-run] [--average K] [--beam B --lenpen L]
#                       [-- extra fairseq-generate flags]
#
# 1. average the last K checkpoints with deepnmt-average-checkpoints (K as the paper: 5 / 20;
#    Bapna et al.: mean score of the last 21 checkpoints instead);
# 2. fairseq-generate on the test split with the paper's beam / length penalty and
#    --required-batch-size-multiple 1 (no sentence dropped);
# 3. tokenized BLEU as multi-bleu.perl (lowercased for IWSLT), compound-split BLEU for En->De,
#    detokenized sacreBLEU with its signature, decoding tokens/s, parameters, training hours.
# References: $DEEPNMT_DATA/<dataset>/{tok,raw}/test.<tgt>.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
# the checkout's work/ unless the environment says otherwise (deepnmt-repro alone: ./work)
export DEEPNMT_DATA="${DEEPNMT_DATA:-$(dirname "$HERE")/work/data}"
export DEEPNMT_CHECKPOINTS="${DEEPNMT_CHECKPOINTS:-$(dirname "$HERE")/work/checkpoints}"
exec "$PY" -m deepnmt_cli.repro evaluate "$@"
