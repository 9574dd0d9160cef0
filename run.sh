#!/usr/bin/env bash
# The two entry points of the README, working on a fresh machine:
#   bash run.sh matrix [CONFIG] [OPTIONS]   the main job: a device matrix (default: configs/default.yaml)
#   bash run.sh test [PYTEST OPTIONS]        the test suite
# On first use it creates .venv with the CPU build of torch 2.13.0 (the exact pin takes a local
# wheel; an unpinned torch would pull several GB of CUDA packages) and installs anysoftmax with
# its test, bench and wave extras. Set ANYSOFTMAX_PYTHON to use an existing interpreter that
# already has torch (a GPU machine) instead; its packages are then used as they are.
set -euo pipefail
cd "$(dirname "$0")"

if [ -n "${ANYSOFTMAX_PYTHON:-}" ]; then
  PY="$ANYSOFTMAX_PYTHON"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  PY=.venv/bin/python
  if [ ! -f .venv/.installed ]; then
    python3 -m venv .venv
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q torch==2.13.0
    "$PY" -m pip install -q -e '.[test,wave,ray,plot]'
    touch .venv/.installed
  fi
fi

cmd="${1:-}"
shift || true
case "$cmd" in
  matrix) exec "$PY" -m anysoftmax matrix "$@" ;;
  test)   exec "$PY" -m pytest -q "$@" ;;
  *) echo "usage: bash run.sh matrix [CONFIG] | bash run.sh test [PYTEST OPTIONS]" >&2; exit 2 ;;
esac
