#!/usr/bin/env bash
# Train one experiment of the papers' tables (registry: scripts/experiments.py).
#
#   scripts/train.sh NAME [--dry-run] [--gpus N] [--fp16|--bf16] [--save-dir DIR] [--data DIR]
#                    [--stage S] [--max-tokens N] [--launcher local|torchrun|slurm]
#                    [-- extra fairseq-train flags]
#
#   scripts/train.sh msc-iwslt14-deen-72L-l2 --dry-run --gpus 8   # print the exact commands
#   scripts/train.sh gpkd-wmt14-ende-48L-teacher --fp16           # teacher, then its SKD data
#
# Runs every stage in order (fairseq-train; GPKD: SKD data, student extraction), skips
# finished stages, resumes interrupted ones.  Tokens per update are the paper's on any
# number of GPUs (--update-freq from --gpus / CUDA_VISIBLE_DEVICES / nvidia-smi).
# Data: $DEEPNMT_DATA/<dataset>/bin; checkpoints: $DEEPNMT_CHECKPOINTS/NAME (defaults under
# <repo>/work).  Multi-node: scripts/slurm/train.sbatch, scripts/torchrun_example.sh.
# `python scripts/experiments.py list` shows every name; `... show NAME` its settings.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
exec "$PY" "$HERE/experiments.py" train "$@"
