#!/usr/bin/env bash
# benchmarks/gpu_check.py on a GPU machine lent without network (the `device` tool of this project's
# workplace: Python 3.12 with a CUDA torch, no fairseq, commands of at most 10 minutes, 64 MiB carried).
# On your own GPU node none of this is needed: `python benchmarks/gpu_check.py`.
#
#   bash benchmarks/gpu_check_lease.sh pack    # here, once: the wheels the check needs -> .whl/ (~61 MiB)
#   # one call on the machine (carry [".whl"], timeout_s 560), which leaves a few minutes for a rerun:
#   bash benchmarks/gpu_check_lease.sh setup && timeout 520 python3 benchmarks/gpu_check.py --budget 450 --out-root "$OUT"
#   # back here: copy <files_at>/<date>-<gpu-name>/ to benchmarks/results/gpu/ and commit it; a rerun of
#   # what was skipped or failed: ... gpu_check.py --sections ddp health --budget 150 --out-root "$OUT"
#
# The wheels: ve-fairseq 0.12.3 (cp312, binary) with hydra-core, omegaconf, antlr4, bitarray; ctranslate2
# (its CUDA build is the PyPI wheel) and pyyaml.  No pytest: the check reads the invariant tests' tables
# with a stand-in for its decorators.  setup installs them without the index, then this checkout (-e, no deps).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY=${PYTHON:-python3}
case "${1:-}" in
  pack)
    PY=${PYTHON:-.venv/bin/python}
    mkdir -p .whl
    plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    "$PY" -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl ve-fairseq==0.12.3 \
      hydra-core==1.3.2 omegaconf==2.3.0 bitarray ctranslate2==4.8.5 pyyaml
    "$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # sdist only
    du -sh .whl ;;
  setup)
    "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
    "$PY" -W ignore -c "import torch, fairseq, deepnmt_fairseq, ctranslate2; print('torch', torch.__version__, 'cuda', \
torch.cuda.is_available(), 'fairseq', fairseq.__version__, 'ctranslate2 cuda devices', ctranslate2.get_cuda_device_count())" ;;
  *)
    sed -n '2,14p' "$0"; exit 2 ;;
esac
