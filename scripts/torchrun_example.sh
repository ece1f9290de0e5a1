#!/usr/bin/env bash
# Multi-GPU / multi-node training with torchrun's rendezvous and fairseq's own distributed
# engine (one process per GPU).
#
# On every node (same command, same RDZV_ID: one id per run, required with NNODES > 1):
#   NNODES=2 NPROC_PER_NODE=8 RDZV_HOST=node0 RDZV_PORT=29400 RDZV_ID=job42 \
#     bash scripts/torchrun_example.sh NAME [train.sh options] [-- fairseq-train flags]
# One node: NNODES=1 (the default) and RDZV_HOST=localhost (the default).
#
# torchrun (c10d rendezvous) starts NPROC_PER_NODE processes per node and gives each
#   WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
# `scripts/train.sh NAME --launcher torchrun` turns them into
#   --distributed-world-size WORLD_SIZE --distributed-rank RANK --device-id LOCAL_RANK
#   --distributed-init-method env:// --distributed-no-spawn
# and computes --update-freq for WORLD_SIZE GPUs (the paper's tokens per update).
# Without GPUs (a smoke test) each rank trains on the CPU with gloo and --ddp-backend legacy_ddp, asked
# for with --cpu (a rank that finds no GPU without --cpu is an error, not a silent CPU run):
#   NPROC_PER_NODE=2 bash scripts/torchrun_example.sh NAME --cpu -- --max-update 2 ...
# Non-training stages (averaging, SKD, extraction) run on rank 0, the others wait; the
# checkpoint root must be shared between nodes.
# Static rendezvous instead of c10d: replace the --rdzv-* flags by
#   --master-addr HOST --master-port PORT --node-rank K
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NAME=${1:?usage: bash scripts/torchrun_example.sh NAME [train.sh options] [-- fairseq flags]}
shift
if [[ -z "${NPROC_PER_NODE:-}" ]]; then
  NPROC_PER_NODE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  [[ "$NPROC_PER_NODE" -gt 0 ]] || NPROC_PER_NODE=1
fi
# the rendezvous id: the same on every node of one run, another for every run (a shared id lets a new
# run join the remains of an old one): several nodes must give RDZV_ID (or run under Slurm); one node
# gets its own
if [[ -z "${RDZV_ID:-}" ]]; then
  if [[ -n "${SLURM_JOB_ID:-}" ]]; then RDZV_ID="deepnmt-slurm-$SLURM_JOB_ID"
  elif [[ "${NNODES:-1}" != 1 ]]; then
    echo "[torchrun_example] NNODES=$NNODES: set RDZV_ID to one id for this run, the same on every node" >&2
    exit 2
  else RDZV_ID="deepnmt-$(hostname)-$$-$(date +%s%N)"
  fi
fi
TORCHRUN=${TORCHRUN:-torchrun}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$TORCHRUN" --nnodes "${NNODES:-1}" --nproc-per-node "$NPROC_PER_NODE" \
  --rdzv-backend c10d --rdzv-endpoint "${RDZV_HOST:-localhost}:${RDZV_PORT:-29400}" --rdzv-id "$RDZV_ID" \
  --no-python bash "$HERE/train.sh" "$NAME" --launcher torchrun "$@"
