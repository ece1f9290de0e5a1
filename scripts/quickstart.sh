#!/usr/bin/env bash
# Quickstart: set up the environment, then train and evaluate a small MSC model on the
# embedded LibreOffice-help corpus (en->de) on the CPU.  About 15 minutes on 2 cores.
#
#   bash scripts/quickstart.sh [options of scripts/quickstart.py]
#
# Re-running skips finished steps and never destroys earlier results.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$HERE/scripts/setup_env.sh"
VENV="${VENV:-$HERE/.venv}"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
exec python "$HERE/scripts/quickstart.py" "$@"
