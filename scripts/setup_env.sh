#!/usr/bin/env bash
# Set up (or check) the Python environment of deepnmt-fairseq.
#
#   bash scripts/setup_env.sh                 # .venv in the repository (created if missing)
#   VENV=/path/to/env bash scripts/setup_env.sh
#   bash scripts/setup_env.sh --current       # use the active environment (e.g. your CUDA torch)
#
# What it installs, in this order, so that a CPU machine never downloads a CUDA torch:
#   1. torch: kept if the environment already has one (your own CUDA build on a GPU node);
#      otherwise TORCH_SPEC (default torch==2.13.0): first from local wheels (pip's find-links),
#      then, on machines without an NVIDIA driver, from PyTorch's CPU index, and only on
#      GPU machines from PyPI (CUDA build).
#   2. a constraints file pinning exactly that torch, used for every later pip call:
#      no dependency can replace it.
#   3. fairseq 0.12.3 that works on modern Python: ve-fairseq (binary wheels, CPython
#      3.11/3.12) or fairseq-fixed built with --no-build-isolation (other versions).
#   4. this package, editable, with its test and deploy extras (deploy = CTranslate2, which
#      depends on numpy and pyyaml only; the constraints file keeps torch as it is).
# It is idempotent: a second run only checks.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$HERE/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PYTHON="${PYTHON:-python3}"
USE_CURRENT=0
[[ "${1:-}" == "--current" ]] && USE_CURRENT=1

log() { printf '[setup] %s\n' "$*" >&2; }

if [[ $USE_CURRENT == 0 ]]; then
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating virtual environment $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  # shellcheck disable=SC1091
  source "$VENV/bin/activate"
fi
PY="$(command -v python)"
PIP=("$PY" -m pip --disable-pip-version-check)
STAMP="$("$PY" -c 'import sys; print(sys.prefix)')/.deepnmt-setup-ok"
# the stamp names pyproject.toml's checksum: a new dependency or console script reinstalls
PROJECT_SUM="$(cksum < "$HERE/pyproject.toml" | cut -d' ' -f1)"
PYVER="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
log "python $PYVER at $PY"

have_torch() { "$PY" -c 'import torch' >/dev/null 2>&1; }

if have_torch; then
  log "keeping the installed torch $("$PY" -W ignore -c 'import torch; print(torch.__version__)')"
else
  log "installing $TORCH_SPEC"
  if "${PIP[@]}" install -q --no-index --no-deps "$TORCH_SPEC" 2>/dev/null; then
    log "torch from local wheels; its dependencies from the package index"
    "${PIP[@]}" install -q "$TORCH_SPEC"
  elif ! command -v nvidia-smi >/dev/null 2>&1; then
    log "no NVIDIA driver: CPU build from https://download.pytorch.org/whl/cpu"
    "${PIP[@]}" install -q "$TORCH_SPEC" --index-url https://download.pytorch.org/whl/cpu
  else
    log "NVIDIA driver found: CUDA build from PyPI"
    "${PIP[@]}" install -q "$TORCH_SPEC"
  fi
fi
TORCH_VERSION="$("$PY" -W ignore -c 'import torch; print(torch.__version__)')"
CONSTRAINTS="$("$PY" -c 'import sys; print(sys.prefix)')/deepnmt-constraints.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
PIPC=("${PIP[@]}" install -q -c "$CONSTRAINTS")

if [[ -f "$STAMP" ]] && "$PY" -c 'import deepnmt_fairseq' >/dev/null 2>&1 \
   && [[ "$(cat "$STAMP")" == "$TORCH_VERSION $HERE $PROJECT_SUM" ]]; then
  log "environment already set up (torch $TORCH_VERSION)"
  exit 0
fi

if ! "$PY" -c 'import fairseq' >/dev/null 2>&1; then
  case "$PYVER" in
    3.11|3.12)
      log "installing ve-fairseq==0.12.3 (binary wheel)"
      "${PIPC[@]}" "ve-fairseq==0.12.3" ;;
    *)
      log "building fairseq-fixed==0.12.3.1 without build isolation (2-4 minutes)"
      "${PIPC[@]}" cython "numpy>=1.21" setuptools wheel
      "${PIPC[@]}" --no-build-isolation "fairseq-fixed==0.12.3.1" ;;
  esac
fi

log "installing deepnmt-fairseq (editable) with its test and deploy (CTranslate2) extras"
"${PIPC[@]}" -e "$HERE[test,deploy]"

AFTER="$("$PY" -W ignore -c 'import torch; print(torch.__version__)')"
if [[ "$AFTER" != "$TORCH_VERSION" ]]; then
  log "ERROR: torch changed from $TORCH_VERSION to $AFTER during setup"; exit 1
fi
"$PY" -c 'import deepnmt_fairseq, fairseq; print("[setup] fairseq", fairseq.__version__, "| plugin", deepnmt_fairseq.__version__, "| --user-dir", deepnmt_fairseq.USER_DIR)' 2>&1 | grep -v tensorboardX >&2
echo "$TORCH_VERSION $HERE $PROJECT_SUM" > "$STAMP"
log "done. Activate with: source $VENV/bin/activate"
