#!/usr/bin/env bash
# Train one experiment of the papers' tables: `deepnmt-repro train` (registry:
# deepnmt_fairseq/repro/registry/) with this checkout's work/ as default data/checkpoint root.
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
# `deepnmt-repro list` shows every name; `deepnmt-repro show NAME` its settings.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# the environment's python: $PYTHON, else the active virtual environment's or conda environment's, else
# this checkout's .venv (scripts/setup_env.sh), else python on PATH
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then PY="$VIRTUAL_ENV/bin/python"
elif [ -n "${CONDA_PREFIX:-}" ] && [ -x "$CONDA_PREFIX/bin/python" ]; then PY="$CONDA_PREFIX/bin/python"
elif [ -x "$(dirname "$HERE")/.venv/bin/python" ]; then PY="$(dirname "$HERE")/.venv/bin/python"
else PY="$(command -v python || command -v python3)"
fi
# the checkout's work/ unless the environment says otherwise (deepnmt-repro alone: ./work)
export DEEPNMT_DATA="${DEEPNMT_DATA:-$(dirname "$HERE")/work/data}"
export DEEPNMT_CHECKPOINTS="${DEEPNMT_CHECKPOINTS:-$(dirname "$HERE")/work/checkpoints}"
exec "$PY" -m deepnmt_cli.repro train "$@"
