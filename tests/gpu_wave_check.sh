#!/usr/bin/env bash
# Wave conformance and timings on an NVIDIA GPU through IREE's CUDA path, with nothing but the
# iree-base-runtime wheel installed: the kernels are precompiled (sm_80) into .wave_gpu/cache.
#
# Prepare on a machine with the `wave` extra (from the repository root):
#   ANYSOFTMAX_CACHE_DIR=$PWD/.wave_gpu/cache python tests/test_wave_gpu.py precompile --target sm_80
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .wave_gpu iree-base-runtime==3.9.0
# Then run this from the repository root on the GPU host; logs go to $OUT (default ./wave_gpu_out).
set -u
OUT=${OUT:-$PWD/wave_gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .wave_gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export ANYSOFTMAX_WAVE_ON_CUDA=1 ANYSOFTMAX_CACHE_DIR=$PWD/.wave_gpu/cache PYTHONUNBUFFERED=1

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 - <<'PY'
import torch, iree.runtime as rt
from anysoftmax.backends.wave import WaveBackend, diskcache
print("torch", torch.__version__, "|", torch.cuda.get_device_name(), "| uuid", torch.cuda.get_device_properties(0).uuid)
print("iree cuda devices:", rt.get_driver("cuda").query_available_devices())
print("cache:", diskcache.vmfb_path.__module__, diskcache.cache_dir(), "kernels:", diskcache.has_kernels("cuda-sm_80"))
print("is_available:", WaveBackend().is_available())
PY
} 2>&1 | tee "$OUT/gpu.txt"

status=0
for mode in dlpack host; do
  rm -f "$OUT/results_$mode.jsonl"
  ANYSOFTMAX_WAVE_TRANSFER=$mode ANYSOFTMAX_WAVE_RESULTS="$OUT/results_$mode.jsonl" \
    timeout 170 python3 -m pytest -q -rfEs -p no:cacheprovider tests/test_wave_gpu.py >"$OUT/pytest_$mode.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=$rc
  echo "== pytest ($mode transfer): exit $rc"; tail -n 25 "$OUT/pytest_$mode.log"
done
timeout 120 python3 tests/test_wave_gpu.py bench 2>&1 | tee "$OUT/bench.txt"
exit $status
