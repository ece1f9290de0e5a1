#!/usr/bin/env bash
# Quickstart: set up the environment, then train and evaluate a small MSC model on the
# embedded LibreOffice-help corpus (en->de) on the CPU.  It prints its expected time first
# (from the measured times in deepnmt_fairseq/quickstart_times.json).
#
#   bash scripts/quickstart.sh [options of scripts/quickstart.py]
#
# Re-running skips finished steps and never destroys earlier results.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
setup_start=$SECONDS
bash "$HERE/scripts/setup_env.sh"
# the set-up's share of a run from a fresh clone, for the time record the quickstart writes
export DEEPNMT_SETUP_SECONDS=$((SECONDS - setup_start))
VENV="${VENV:-$HERE/.venv}"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
exec python "$HERE/scripts/quickstart.py" "$@"
