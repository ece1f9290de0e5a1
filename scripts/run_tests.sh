#!/usr/bin/env bash
# The whole test suite, installing what it needs first (the README's test command).
#
#   bash scripts/run_tests.sh [pytest args...]      e.g.  -m "not slow"   or   -k msc
#
# Test files run in parallel (pytest-xdist, one file per worker at a time, each worker
# single-threaded): PYTEST_WORKERS=N sets the number of workers (default: the number of
# cores, at most 4); PYTEST_WORKERS=1 runs everything in one process.
#
# Sets up .venv with scripts/setup_env.sh (CPU torch, fairseq 0.12.3, this package),
# then runs pytest.  Exit code 5 from pytest (no tests collected) is an error here:
# it means the suite did not load, not that everything passed.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$HERE/scripts/setup_env.sh" || { echo "[tests] environment setup failed" >&2; exit 1; }
VENV="${VENV:-$HERE/.venv}"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
cd "$HERE"
# cores this process may use (nproc would answer OMP_NUM_THREADS, set just below)
WORKERS="${PYTEST_WORKERS:-$(python -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || echo 1)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
start=$(date +%s)

(( WORKERS > 4 )) && WORKERS=4
PARALLEL=()
if (( WORKERS > 1 )) && python -c "import xdist" 2>/dev/null; then
  PARALLEL=(-n "$WORKERS" --dist loadfile)
fi
# -rs: every skipped test is listed with its reason (e.g. the browser test where Chromium is missing)
python -m pytest -q -p no:cacheprovider -rs --durations=15 "${PARALLEL[@]}" "$@"
rc=$?
echo "[tests] pytest exit code $rc after $(( $(date +%s) - start )) s" >&2
if [[ $rc -eq 5 ]]; then
  echo "[tests] ERROR: pytest collected no tests" >&2
  exit 1
fi
exit $rc
