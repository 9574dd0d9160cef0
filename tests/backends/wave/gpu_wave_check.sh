#!/usr/bin/env bash
# Wave conformance, per-call cost and bandwidth on an NVIDIA GPU through IREE's CUDA HAL, with
# nothing but the iree-base-runtime wheel installed there: every kernel is precompiled (sm_80)
# on a CPU machine. One folder travels ($WAVE_GPU_DIR, default .gpu/wave):
#   src/      this checkout's anysoftmax/, tests/, benchmarks/wave_latency.py, pyproject.toml
#   cache/    ANYSOFTMAX_CACHE_DIR=$PWD/cache python tests/backends/wave/test_wave_gpu.py precompile --target sm_80
#   whl/      pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                 --platform manylinux_2_28_x86_64 -d whl iree-base-runtime==3.9.0
#   before/ and before_cache/ (optional): the previous anysoftmax/ and its kernels
#             (`python -m anysoftmax.backends.wave.aot --shapes 128,512,1024,2048,4096,32768,151936
#             --ops softmax --target sm_80`), for the per-call cost before this code
#   ptx/      (optional) IREE's PTX of the plain 8x1024 fp32 kernel (iree-compile
#             --iree-hal-dump-executable-files-to=DIR), timed launched directly as a floor
# Run from the repository root on the GPU host; results go to $OUT (default ./wave_gpu_out):
# latency_wave.{json,csv,png}, latency_wave_ab.json and logs.tgz (pytest logs, per-test errors
# as JSON lines).
set -u
W=$(cd "${WAVE_GPU_DIR:-.gpu/wave}" && pwd)
OUT=${OUT:-$PWD/wave_gpu_out}
LOGS=/tmp/wave_logs
mkdir -p "$OUT" "$LOGS"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$W"/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$W/src ANYSOFTMAX_WAVE_ON_CUDA=1 ANYSOFTMAX_CACHE_DIR=$W/cache PYTHONUNBUFFERED=1
export ANYSOFTMAX_TEST_SEED=${ANYSOFTMAX_TEST_SEED:-$RANDOM$RANDOM}
cd "$W/src"
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, importlib.metadata as m; print('torch', torch.__version__, '|', torch.cuda.get_device_name(), '| iree-base-runtime', m.version('iree-base-runtime'))"
  echo "seed $ANYSOFTMAX_TEST_SEED"
} 2>&1 | tee "$LOGS/gpu.txt"

# Conformance: the plain softmax and every member of the fused family (tests/backends/wave/test_wave_gpu.py),
# zero-copy (DLPack), then a few through host copies.
ANYSOFTMAX_WAVE_RESULTS="$LOGS/results_dlpack.jsonl" timeout "${PYTEST_S:-270}" \
  python3 -m pytest -q -rfE -p no:cacheprovider -n "${WORKERS:-8}" tests/backends/wave/test_wave_gpu.py >"$LOGS/pytest_dlpack.log" 2>&1
rc=$?; [ $rc -ne 0 ] && status=$rc; echo "== pytest (dlpack): exit $rc"; tail -n 30 "$LOGS/pytest_dlpack.log"
ANYSOFTMAX_WAVE_TRANSFER=host ANYSOFTMAX_WAVE_RESULTS="$LOGS/results_host.jsonl" timeout 45 \
  python3 -m pytest -q -rfE -p no:cacheprovider tests/backends/wave/test_wave_gpu.py -k "2x128 and (softmax or float32)" \
  >"$LOGS/pytest_host.log" 2>&1
rc=$?; [ $rc -ne 0 ] && status=$rc; echo "== pytest (host copies): exit $rc"; tail -n 5 "$LOGS/pytest_host.log"

# Per call and bandwidth: the previous code (Wave's synchronous entry point) first, if carried.
before=""
if [ -d "$W/before" ]; then
  # (run from before/: `python -m` puts the current folder first on sys.path)
  (cd "$W/before" && PYTHONPATH=/tmp/site:$W/before ANYSOFTMAX_CACHE_DIR=$W/before_cache timeout 80 \
    python3 -m anysoftmax.bench.softmax --latency --providers anysoftmax:wave --calls 1000 --out "$LOGS/before" \
    >"$LOGS/latency_before.txt" 2>&1)
  before=$(ls "$LOGS"/before/*/latency.json 2>/dev/null | head -1)
fi
ptx=$(ls "$W"/ptx/*.ptx 2>/dev/null | head -1)
timeout "${BENCH_S:-180}" python3 benchmarks/wave_latency.py --out "$OUT" ${before:+--before "$before"} ${ptx:+--ptx "$ptx"} \
  2>&1 | tee "$LOGS/latency_wave.txt" | tail -n 60
# The same per-call comparison in one process, interleaved (latency_wave_ab.json).
old_vmfb=$(ls "$W"/before_cache/wave/*/cuda-sm_80/softmax_n1024_float32-float32.vmfb 2>/dev/null | head -1)
[ -n "$old_vmfb" ] && timeout 60 python3 benchmarks/wave_ab.py --before-vmfb "$old_vmfb" --out "$OUT" \
  >"$LOGS/latency_wave_ab.txt" 2>&1
tar czf "$OUT/logs.tgz" -C "$LOGS" .
exit $status
