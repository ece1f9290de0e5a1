#!/usr/bin/env bash
# The evidence study's GPU preset on a GPU machine lent without network for short leases (the
# `device` tool of this project's workplace: Python 3.12 with a CUDA torch, no fairseq, commands of
# at most 10 minutes, nothing kept after the lease).  On your own GPU node you need none of this:
#     python scripts/build_evidence_corpus.py --download
#     python -m study --preset gpu --jobs 4
#
#   bash study/lease.sh pack                 # here: corpus, data, wheels -> .gpucarry, .whl
#   # on the machine (carry .whl .gpucarry work/evidence-corpus):
#   bash study/lease.sh setup                # install fairseq + this package, place the data
#   bash study/lease.sh launch JOBS MINUTES [PATTERN...]  # the study (or the runs matching
#                                                         # --runs PATTERN) in the background, stopped at MINUTES
#   bash study/lease.sh status               # updates per run
#   bash study/lease.sh pause RUN...         # SIGSTOP runs that cannot finish in the lease
#   bash study/lease.sh collect              # new records + logs (no checkpoints) -> $OUT/<preset>.tgz
#   # back here: tar xzf gpu.tgz; copy work/gpu-records/*.json to benchmarks/results/fidelity/gpu/, and
#   # work/gpu-records/partial/*.json (the valid curves of the runs the deadline stopped) to its partial/
#   # (FIDELITY_PRESET=cpu, exported before setup: tar xzf cpu.tgz writes the records where they belong)
#
# The GPU preset's records are written to work/gpu-records (ignored), not into the repository's
# records directory, because each call re-sends the working tree (the cpu preset's go into its
# records directory, and collect brings back only those written after the launch).  A run that has not finished when the
# lease ends is lost with its checkpoints (they are too large to bring back), so launch only as many
# runs as can finish: measured on an H100 (docs/fidelity.md), 12 six-layer runs at once train at
# 4.7 updates/s each, 4 at once at about 9; the cpu preset's 24-layer runs, 5 at once on an H200,
# at about 5.7 each (the small kernels keep the GPU busy), so none of those finishes in 8 minutes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# FIDELITY_PRESET=cpu: the CPU preset's float32 runs on the lent GPU (python -m study --cuda), for the
# runs that a 2-core machine needs hours for.  Its records are written where the repository keeps
# them (the runs of phases 2 and 3 need the finished ones to be planned), and collect brings back
# those the launch wrote.
PRESET=${FIDELITY_PRESET:-gpu}
WORK=${FIDELITY_WORK:-work/fidelity/$PRESET}  # the preset's work directory (a test points it elsewhere)
LOG=${FIDELITY_LOG:-work/$PRESET.log}
if [[ $PRESET == gpu ]]; then RECORDS=${FIDELITY_RECORDS:-work/gpu-records}; CUDA=()
else RECORDS=${FIDELITY_RECORDS:-benchmarks/results/fidelity/$PRESET}; CUDA=(--cuda); fi
PY=${PYTHON:-python3}

case "${1:-}" in
  pack)
    PY=${PYTHON:-.venv/bin/python}
    [[ -d work/evidence-corpus/en-de ]] || "$PY" scripts/build_evidence_corpus.py --download
    "$PY" -m study --preset "$PRESET" --work-dir "$WORK" --records "benchmarks/results/fidelity/$PRESET" --prepare-only
    for d in /.whl/ /.gpucarry/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
    rm -rf .gpucarry && mkdir -p .gpucarry/tok
    cp -a "$WORK/data-bin" .gpucarry/
    # what the evaluation reads (references, BPE of the held-out splits and the training sample)
    cp -a "$WORK"/tok/{bpe.codes,test.bpe.*,test.raw.*,valid.bpe.*,valid.raw.*,trainsample.*} .gpucarry/tok/
    mkdir -p .whl
    plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    "$PY" -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl ve-fairseq==0.12.3 \
      hydra-core==1.3.2 omegaconf==2.3.0 bitarray subword-nmt sacremoses
    "$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # sdist only
    du -sh .whl .gpucarry work/evidence-corpus ;;
  setup)
    "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
    mkdir -p "$WORK" && cp -a .gpucarry/data-bin .gpucarry/tok "$WORK"/
    "$PY" -W ignore -c "import torch, fairseq, deepnmt_fairseq; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'fairseq', fairseq.__version__)" ;;
  launch)
    jobs=${2:?JOBS}; minutes=${3:?MINUTES}; shift 3
    # without the carried data each launch would build it, and two launches at once collide
    [[ -e $WORK/data-bin/.done ]] || { echo "no data in $WORK/data-bin: run setup with the same FIDELITY_PRESET ($PRESET)" >&2; exit 2; }
    mkdir -p "$RECORDS" && touch "$RECORDS/.launched"  # collect: what this launch recorded
    (PYTHONUNBUFFERED=1 setsid nohup "$PY" -W ignore -m study --preset "$PRESET" "${CUDA[@]}" \
       --jobs "$jobs" --order short-first --deadline-minutes "$minutes" --records "$RECORDS" ${1:+--runs "$@"} \
       --report "$WORK/report.md" > "$LOG" 2>&1 < /dev/null &)
    echo "started: tail $LOG" ;;
  status)
    for d in "$WORK"/runs/*/; do
      [[ -f $d/train.log ]] || continue
      echo "$(basename "$d"): $(grep -o '"num_updates": "[0-9]*"' "$d/train.log" | tail -1) $( [[ -f $d/done.json ]] && echo done)"
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader || true
    tail -n 5 "$LOG" 2>/dev/null || true ;;
  pause)
    shift
    for r in "$@"; do
      for p in /proc/[0-9]*; do
        if ls -l "$p/fd" 2>/dev/null | grep -q "runs/$r/train.log"; then kill -STOP "${p#/proc/}"; echo "paused $r (${p#/proc/})"; fi
      done
    done ;;
  collect)
    # no checkpoint: neither the saved ones (*.pt) nor the one fairseq is writing when the deadline
    # stops it (.checkpoint_last.pt.<random>.tmp, 150 MB for a 6-layer run: it once pushed the
    # archive past the 16 MiB a file the lent machine sends back)
    # and of the records, those the launch wrote (the cpu preset's directory holds the committed ones)
    if [[ -e $RECORDS/.launched ]]; then find "$RECORDS" -name '*.json' -newer "$RECORDS/.launched"
    else find "$RECORDS" -name '*.json'; fi > "$WORK/.collect"
    # the runs' logs unpack into <work>/lease-runs, not runs/: a run dir with a log and .elapsed but no
    # checkpoint would make the run here count the lease's seconds as its own
    tar czf "${OUT:?OUT: where the archive goes}/$PRESET.tgz" --exclude='*.pt' --exclude='*.pt.*' \
      --transform 's,\(^\|/\)runs\(/\|$\),\1lease-runs\2,' "$LOG" -T "$WORK/.collect" "$WORK/runs"
    ls -l "$OUT/$PRESET.tgz"; cat "$WORK/.collect" ;;
  *)
    sed -n '2,22p' "$0"; exit 2 ;;
esac
