#!/usr/bin/env bash
# The cute backend's GPU session, on a CUDA host without network access. The CuTe DSL, QuACK
# and their needs travel as unpacked cp312 wheels in two archives (a lent machine takes at
# most 64 MiB a call): `dsl` holds the DSL's 190 MB compiler library (xz; the cu13 flavour,
# nvidia-cutlass-dsl-libs-cu13 4.8.1, for the CUDA 13 driver and torch), `site` the rest
# (and any wheel beside it: Liger).
#   bash benchmarks/cute_gpu_run.sh dsl DIR     # unpack DIR/ir.so.xz into $SITE (first call)
#   bash benchmarks/cute_gpu_run.sh site DIR    # unpack DIR/site.tar.xz into $SITE
#   bash benchmarks/cute_gpu_run.sh tests       # pytest tests/backends/cute/test_cute_gpu.py
#   bash benchmarks/cute_gpu_run.sh sweep       # benchmarks/cute_sweep.py (tuning candidates)
#   bash benchmarks/cute_gpu_run.sh bench fwd|bwd [PROVIDERS]   # the softmax benchmark
#   bash benchmarks/cute_gpu_run.sh select      # the selection table from the bench results
#   bash benchmarks/cute_gpu_run.sh native      # benchmarks/native_launch_bench.py (needs `site`)
#     (SELECTION=anysoftmax/configs/selection puts it where the automatic choice reads it)
# Logs and results go to $OUT (default out/gpu). Run from the repository root.
set -uo pipefail
OUT="${OUT:-out/gpu}"
SITE="${SITE:-/tmp/site}"
mkdir -p "$OUT" "$SITE"
export PYTHONPATH="$PWD:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PY:-python3}"
stage="${1:-tests}"
shift || true
IR="$SITE/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so"
case "$stage" in
  dsl)
    mkdir -p "$(dirname "$IR")"
    "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" \
      "$1/ir.so.xz" "$IR" && ls -la "$IR"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    "$PY" -m pip list 2>/dev/null | grep -i -E "^(cuda|cupy|torch|triton|protobuf|typing|pytest)" | tee "$OUT/pip.txt"
    ;;
  site)
    tar xJf "$1/site.tar.xz" -C "$SITE" && echo "unpacked $(du -sh "$SITE" | cut -f1) into $SITE"
    for w in "$1"/*.whl; do [ -e "$w" ] && "$PY" -m zipfile -e "$w" "$SITE" && echo "unpacked $(basename "$w")"; done
    "$PY" -c "import cutlass.cute, tvm_ffi, quack.softmax; print('DSL, TVM-FFI and QuACK import')" 2>&1 | tail -3
    ;;
  tests)
    [ $# -eq 0 ] && set -- tests/backends/cute/test_cute_gpu.py
    # --timeout (pytest-timeout): a kernel that hangs fails its test instead of the whole stage.
    "$PY" -m pytest -m gpu -q -p no:cacheprovider --maxfail=30 --timeout=120 "$@" 2>&1 | tee "$OUT/cute_gpu_tests.txt" | tail -30
    ;;
  sweep)
    "$PY" benchmarks/cute_sweep.py --out "$OUT" "$@" 2>&1 | tee "$OUT/cute_sweep.txt" | tail -80
    ;;
  bench)  # results under $RESULTS (default $OUT/results): point it outside $OUT to keep them between calls
    dir="$1"; shift
    flag=""; [ "$dir" = bwd ] && flag="--bwd"
    providers="${1:-copy,anysoftmax:cute,anysoftmax:triton,quack,torch.compile}"
    shift || true
    "$PY" -m anysoftmax.bench.softmax $flag --providers "$providers" --out "${RESULTS:-$OUT/results}" "$@" 2>&1 \
      | tee "$OUT/bench_$dir.txt" | tail -45
    ;;
  select)  # the selection table from $RESULTS into $SELECTION (default $OUT/selection)
    "$PY" -m anysoftmax.cli select $(ls "${RESULTS:-$OUT/results}"/*/softmax_{fwd,bwd}.json 2>/dev/null) \
      --out "${SELECTION:-$OUT/selection}" 2>&1 | tee "$OUT/select.txt" | tail -40
    ;;
  native)  # the native launcher against Triton's: correctness, then us per call
    "$PY" benchmarks/native_launch_bench.py --out "$OUT/native_launch.json" "$@" 2>&1 | tee "$OUT/native_launch_run.txt" | tail -40
    ;;
  *) echo "usage: bash benchmarks/cute_gpu_run.sh dsl DIR|site DIR|tests|sweep|bench fwd|bwd|select|native" >&2; exit 2 ;;
esac
