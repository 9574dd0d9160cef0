#!/usr/bin/env bash
# The README's two commands, working on a fresh clone:
#   bash run.sh matrix [CONFIG] [OPTIONS]   the default device matrix on whatever hardware is here
#   bash run.sh test [PYTEST OPTIONS]       the test suite
#   bash run.sh docs                        the documentation site, built strictly (site/)
#
# On first use it makes .venv with the CPU build of torch 2.13.0 (the exact pin takes a local
# wheel; an unpinned torch pulls several GB of CUDA packages) and installs anysoftmax with the
# extras the command needs, no more:
#   matrix: `plot` (the CPU torch of .venv runs CPU cells only: IREE, Ray, CuTe would be dead weight)
#   test:   test,wave,ray,plot,hf,cute (what the suite exercises: Wave and CuTe compile on a CPU)
#   docs:   docs (mkdocs, mkdocs-material)
# ANYSOFTMAX_EXTRAS=wave,ray adds extras to any command. Extras installed once stay installed.
# ANYSOFTMAX_PYTHON=python3 uses an existing interpreter that has torch (a GPU host) as it is:
# nothing is installed then.
# Matrix reports go to $ANYSOFTMAX_RESULTS_DIR/matrix/<name>/, here out/matrix/<name>/.
set -euo pipefail
cd "$(dirname "$0")"
export ANYSOFTMAX_RESULTS_DIR="${ANYSOFTMAX_RESULTS_DIR:-$PWD/out}"

cmd="${1:-}"
shift || true
case "$cmd" in
  matrix) need="plot" ;;
  test)   need="test,wave,ray,plot,hf,cute" ;;
  docs)   need="docs" ;;
  *) echo "usage: bash run.sh matrix [CONFIG] | bash run.sh test [PYTEST OPTIONS] | bash run.sh docs" >&2; exit 2 ;;
esac
need="$need${ANYSOFTMAX_EXTRAS:+,$ANYSOFTMAX_EXTRAS}"

if [ -n "${ANYSOFTMAX_PYTHON:-}" ]; then
  PY="$ANYSOFTMAX_PYTHON"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  PY=.venv/bin/python
  if [ ! -x "$PY" ]; then
    python3 -m venv .venv
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q torch==2.13.0
  fi
  # The extras installed so far (one per line in .venv/.extras); install what is missing.
  touch .venv/.extras
  missing=$(tr ',' '\n' <<<"$need" | sed '/^$/d' | sort -u | comm -23 - <(sort -u .venv/.extras))
  if [ -n "$missing" ] || [ ! -f .venv/.installed ]; then
    all=$(cat .venv/.extras - <<<"$missing" | sed '/^$/d' | sort -u | paste -sd, -)
    echo "run.sh: installing anysoftmax[$all] into .venv" >&2
    "$PY" -m pip install -q -e ".[$all]"
    tr ',' '\n' <<<"$all" > .venv/.extras
    touch .venv/.installed
  fi
  if command -v nvidia-smi >/dev/null 2>&1 || [ -e /dev/kfd ]; then
    echo "run.sh: a GPU is here, but .venv has the CPU build of torch: GPU entries are skipped." \
         "Use ANYSOFTMAX_PYTHON=python3 with a CUDA/ROCm torch to run them." >&2
  fi
fi

case "$cmd" in
  matrix) exec "$PY" -m anysoftmax matrix "$@" ;;
  test)   exec "$PY" -m pytest -q "$@" ;;
  docs)   NO_MKDOCS_2_WARNING=1 exec "$PY" -m mkdocs build --strict --site-dir site "$@" ;;
esac
