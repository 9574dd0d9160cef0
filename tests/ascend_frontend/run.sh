#!/usr/bin/env bash
# Front-end check of the triton_ascend kernels: builds a venv with triton-ascend==3.2.0 in place
# of stock triton (CPU torch, no torch_npu, no CANN) and runs tests/ascend_frontend in it.
# About 35 s of tests on two workers plus the venv (reused when it exists). Venv: $ASCEND_FRONTEND_VENV or
# .venv-ascend-frontend beside the repo's other venvs (git-ignored).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${ASCEND_FRONTEND_VENV:-$repo/.venv-ascend-frontend}"
python="${PYTHON:-python3.11}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import triton.backends.ascend" 2>/dev/null; then
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q torch==2.13.0
    # pybind11: triton-ascend needs it but does not declare it. No torch_npu: without CANN it
    # breaks `import torch`.
    "$venv/bin/pip" install -q triton-ascend==3.2.0 pybind11 pyyaml pytest pytest-xdist numpy
fi
# (a venv made before the tests ran on two workers)
"$venv/bin/python" -c "import xdist" 2>/dev/null || "$venv/bin/pip" install -q pytest-xdist
cd "$repo"
# --confcutdir: tests/conftest.py would switch on the Triton interpreter.
PYTHONPATH="$repo" exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "${ASCEND_FRONTEND_WORKERS:-auto}" \
    --confcutdir=tests/ascend_frontend tests/ascend_frontend "$@"
