#!/usr/bin/env bash
# The README's two commands, working on a fresh clone:
#   bash run.sh matrix [CONFIG] [OPTIONS]   the default device matrix on whatever hardware is here
#   bash run.sh test [PYTEST OPTIONS]       the test suite
#   bash run.sh docs                        the documentation site, built strictly (site/)
#
# On first use it makes .venv with torch==2.13.0 and installs anysoftmax with the extras the
# command needs, no more:
#   matrix: triton,plot (the CPU torch of .venv runs CPU cells only, the Triton ones through the
#           interpreter: IREE, Ray, CuTe would be dead weight; ANYSOFTMAX_EXTRAS=wave adds Wave)
#   test:   triton,test,wave,ray,plot,hf,cute (what the suite exercises: Wave and CuTe compile on a CPU)
#   docs:   docs (mkdocs, mkdocs-material)
# torch comes from pip's own configuration: where that holds a CPU wheel of 2.13.0 it is taken;
# from PyPI on Linux an unpinned or pinned torch is the CUDA build (several GB). Elsewhere set
# ANYSOFTMAX_TORCH_INDEX=https://download.pytorch.org/whl/cpu to take the CPU build from PyTorch's index.
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
  matrix) need="triton,plot" ;;
  test)   need="triton,test,wave,ray,plot,hf,cute" ;;
  docs)   need="docs" ;;
  *) echo "usage: bash run.sh matrix [CONFIG] | bash run.sh test [PYTEST OPTIONS] | bash run.sh docs" >&2; exit 2 ;;
esac
need="$need${ANYSOFTMAX_EXTRAS:+,$ANYSOFTMAX_EXTRAS}"

if [ -n "${ANYSOFTMAX_PYTHON:-}" ]; then
  PY="$ANYSOFTMAX_PYTHON"
  if ! command -v "$PY" >/dev/null 2>&1; then
    echo "run.sh: ANYSOFTMAX_PYTHON=$PY is not an interpreter found on PATH" >&2; exit 2
  fi
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "run.sh: ANYSOFTMAX_PYTHON=$PY has no torch; install the torch build for this machine into it" \
         "(pip install torch --index-url https://download.pytorch.org/whl/cpu on a CPU machine)," \
         "or unset ANYSOFTMAX_PYTHON to let run.sh make .venv" >&2
    exit 2
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  PY=.venv/bin/python
  # pip's own output goes to .venv/pip.log (setuptools' editable-install banner included) and
  # is shown only when an install fails.
  quiet_pip() {
    if ! "$PY" -m pip install -q "$@" >>.venv/pip.log 2>&1; then
      echo "run.sh: pip install $* failed; its output (.venv/pip.log):" >&2
      tail -n 40 .venv/pip.log >&2
      exit 1
    fi
  }
  if [ ! -x "$PY" ]; then
    python3 -m venv .venv
    echo "run.sh: making .venv with torch 2.13.0" >&2
    quiet_pip --upgrade pip
    quiet_pip torch==2.13.0 ${ANYSOFTMAX_TORCH_INDEX:+--index-url "$ANYSOFTMAX_TORCH_INDEX"}
  fi
  # The extras installed so far (one per line in .venv/.extras); install what is missing.
  touch .venv/.extras
  missing=$(tr ',' '\n' <<<"$need" | sed '/^$/d' | sort -u | comm -23 - <(sort -u .venv/.extras))
  if [ -n "$missing" ] || [ ! -f .venv/.installed ]; then
    all=$(cat .venv/.extras - <<<"$missing" | sed '/^$/d' | sort -u | paste -sd, -)
    echo "run.sh: installing anysoftmax[$all] into .venv" >&2
    quiet_pip -e ".[$all]"
    tr ',' '\n' <<<"$all" > .venv/.extras
    touch .venv/.installed
  fi
  # A backend whose extra this .venv lacks names the run.sh way to add it (ANYSOFTMAX_EXTRAS).
  if [ "$cmd" = matrix ]; then export ANYSOFTMAX_RUN_SH=matrix; fi
  if command -v nvidia-smi >/dev/null 2>&1 || [ -e /dev/kfd ]; then
    echo "run.sh: a GPU is here, but .venv has the CPU build of torch: GPU entries are skipped." \
         "Use ANYSOFTMAX_PYTHON=python3 with a CUDA/ROCm torch to run them." >&2
  fi
fi

case "$cmd" in
  matrix) exec "$PY" -m anysoftmax matrix "$@" ;;
  # One worker per core (pytest-xdist), a test file per worker at a time (files share fixtures
  # and module-level state), handed out in collection order, the longest files first
  # (tests/conftest.py; xdist would otherwise order them by their number of tests);
  # ANYSOFTMAX_TEST_WORKERS=0 runs in this process. Quiet (-q) unless
  # the arguments set a verbosity of their own (-v, -vv, -q, --verbose): run.sh's -q would add to it.
  test)   quiet=-q
          for arg in "$@"; do
            case "$arg" in --quiet|--verbose|--verbosity*|-[qv]*|-[!-]*[qv]*) quiet= ;; esac
          done
          exec "$PY" -m pytest $quiet -n "${ANYSOFTMAX_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder "$@" ;;
  docs)   NO_MKDOCS_2_WARNING=1 exec "$PY" -m mkdocs build --strict --site-dir site "$@" ;;
esac
