#!/usr/bin/env bash
# One GPU session's stages, each logging under $OUT (or ./out/gpu): the checks and measurements
# behind the README's numbers. Run from the repository root on a CUDA host whose python3 has
# torch and triton:
#   bash benchmarks/gpu_run.sh smoke      # a few requests per kernel path + the latency benchmark
#   bash benchmarks/gpu_run.sh tests      # pytest -m gpu (the whole GPU suite)
#   bash benchmarks/gpu_run.sh fwd|bwd    # the bandwidth benchmark (peers that import are included)
# Optional peers (liger-kernel, quack-kernels) are used when importable (PYTHONPATH).
set -uo pipefail
OUT="${OUT:-out/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PY:-python3}"
stage="${1:-smoke}"
shift || true
case "$stage" in
  smoke)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    "$PY" - <<'EOF' 2>&1 | tee "$OUT/smoke.txt"
import torch, anysoftmax
from anysoftmax.core import SoftmaxSpec, compare
cases = [((8, 1024), 1), ((4096, 4096), 1), ((64, 1 << 20), 1), ((8192, 8192), 0), ((1823, 781), 0), ((3, 262144), 1)]
for shape, dim in cases:
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(shape, device="cuda") * 3).to(dtype)
        for _ in range(3):  # first call compiles; later ones take the fast launch path
            y = anysoftmax.softmax(x, dim)
        c = compare(y, x, SoftmaxSpec.from_tensor(x, dim), device="cuda")
        g = torch.randn_like(y)
        dx = anysoftmax.softmax_backward(y, g, dim)
        ref = torch._softmax_backward_data(g.double(), y.double(), dim, torch.float64)
        print(shape, dim, dtype, "fwd ok" if c.ok else f"FWD WRONG {c.detail}",
              "bwd err %.2e" % float((dx.double() - ref).abs().max()))
EOF
    "$PY" -m anysoftmax.bench.softmax --latency --out "$OUT/results" 2>&1 | tee "$OUT/latency.txt"
    ;;
  profile)
    "$PY" benchmarks/profile_hit_path.py 2>&1 | tee "$OUT/profile.txt"
    ;;
  tests)
    [ $# -eq 0 ] && set -- tests
    "$PY" -m pytest -m gpu -q -p no:cacheprovider --timeout=900 "$@" 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
    ;;
  fwd|bwd)
    flag=""; [ "$stage" = bwd ] && flag="--bwd"
    "$PY" -m anysoftmax.bench.softmax $flag --out "$OUT/results" "$@" 2>&1 | tee "$OUT/bench_$stage.txt" | tail -60
    ;;
  *) echo "usage: bash benchmarks/gpu_run.sh smoke|tests|fwd|bwd" >&2; exit 2 ;;
esac
