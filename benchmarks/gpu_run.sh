#!/usr/bin/env bash
# One GPU session's stages, each logging under $OUT (or ./out/gpu): the checks and measurements
# behind the README's numbers. Run from the repository root on a CUDA host whose python3 has
# torch and triton:
#   bash benchmarks/gpu_run.sh smoke      # a few requests per kernel path + the latency benchmark
#   bash benchmarks/gpu_run.sh tests      # pytest -m gpu (the whole GPU suite)
#   bash benchmarks/gpu_run.sh tests_split  # the same in parallel groups on 2 GPUs (pytest-xdist)
#   bash benchmarks/gpu_run.sh fwd|bwd    # the bandwidth benchmark (peers that import are included)
#   bash benchmarks/gpu_run.sh fuzz BACKEND [CALLS] [CHUNK]   # the call-sequence fuzzer on cuda in runs of
#        CHUNK calls, seeds 1, 2, ...: each run a fresh process; one summary $OUT/fuzz_BACKEND.json
#        (triton_ascend on cuda needs ANYSOFTMAX_ASCEND_ON_CUDA=1)
#   bash benchmarks/gpu_run.sh pieces     # logsumexp / merge_states conformance on cuda, then their benchmark
#   bash benchmarks/gpu_run.sh sharded [RANKS] [VARIANTS]   # anysoftmax.distributed over NCCL, one GPU a
#        rank: the one-read smoke, then distributed_bench.py (CHECK=1: the conformance kit first; results under $OUT)
#   bash benchmarks/gpu_run.sh sampling_warm   # FlashInfer's JIT compile alone (minutes; a call of its own), cached
#        under $FLASHINFER_WORKSPACE_BASE (default .gpu/flashinfer, kept while the machine stays up)
#   bash benchmarks/gpu_run.sh sampling [ARGS]  # sampling_bench.py on the full grid (~5 min; FlashInfer when importable
#        and warm, else left out with the reason in its JSON); ARGS go to it (--quick, --dtypes, --batches, --vocabs)
#   bash benchmarks/gpu_run.sh sampling_sharded [RANKS] [ARGS]   # sampling_sharded_bench.py over NCCL, one GPU a rank
#   bash benchmarks/gpu_run.sh sampler_pdl   # the sampler's launches with programmatic dependent launch and the
#        runs pre-pass overlapping the collect: their GPU tests, then sampler_pdl_probe.py (graph-replay time of
#        plain, PDL and overlapping launches; results/sampler_pdl.json and .png)
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
  tests_split)  # the whole GPU suite in about 6 minutes on a host of 2 GPUs (pytest-xdist workers):
    # the conformance kit and the cross-checked backends on GPU 0, every other GPU test on GPU 1,
    # then the memory-hungry files alone (cute's tests need the DSL: cute_gpu_run.sh dsl/site)
    serial="tests/api/test_huge.py tests/api/test_memory.py tests/api/test_concurrency.py"
    first="tests/testing/test_conformance.py tests/backends/wave tests/backends/triton_ascend tests/sampling"
    rest=$(find tests -name 'test_*.py' | sort | grep -v -F -e tests/testing/test_conformance.py \
      -e tests/backends/wave/ -e tests/backends/triton_ascend/ -e tests/sampling/ -e test_huge.py -e test_memory.py \
      -e test_concurrency.py)
    run="$PY -m pytest -m gpu -v -p no:cacheprovider --timeout=300 -rfE -n ${WORKERS:-12}"
    CUDA_VISIBLE_DEVICES=0 $run $first > "$OUT/gpu_tests_first.txt" 2>&1 &
    CUDA_VISIBLE_DEVICES=${SECOND_GPU:-1} $run $rest > "$OUT/gpu_tests_rest.txt" 2>&1
    wait
    "$PY" -m pytest -m gpu -q -p no:cacheprovider --timeout=300 $serial > "$OUT/gpu_tests_serial.txt" 2>&1
    for f in "$OUT"/gpu_tests_{first,rest,serial}.txt; do echo "== $f"; grep -E "^(FAILED|ERROR)" "$f"; tail -1 "$f"; done
    ;;
  fwd|bwd)
    flag=""; [ "$stage" = bwd ] && flag="--bwd"
    "$PY" -m anysoftmax.bench.softmax $flag --out "$OUT/results" "$@" 2>&1 | tee "$OUT/bench_$stage.txt" | tail -60
    ;;
  fuzz)
    backend="$1"; calls="${2:-2000}"; chunk="${3:-500}"; runs=$(( (calls + chunk - 1) / chunk ))
    tmp=$(mktemp -d)
    until="${FUZZ_UNTIL:-$(( $(date +%s) + 86400 ))}"  # (epoch seconds: no run starts after it)
    for seed in $(seq 1 "$runs"); do
      left=$(( until - $(date +%s) )); [ "$left" -le 5 ] && break
      timeout "$left" "$PY" -m anysoftmax.testing.fuzz --backend "$backend" --device cuda --calls "$chunk" --seed "$seed" \
        --json "$tmp/$seed.json" 2>&1 | tail -20 | tee -a "$OUT/fuzz_$backend.txt"
    done
    "$PY" -c 'import json, pathlib, sys
runs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))]
total = {k: sum(r[k] for r in runs) for k in ("calls", "checked", "skipped", "seconds")}
total.update(backend=sys.argv[3], device_name=runs[0]["device_name"] if runs else None,
             failures=[f for r in runs for f in r["failures"]], seeds=[r["seed"] for r in runs], runs=runs)
json.dump(total, open(sys.argv[2], "w"), indent=1)
print({k: v for k, v in total.items() if k != "runs"})' "$tmp" "$OUT/fuzz_$backend.json" "$backend"
    ;;
  pieces)
    "$PY" -m anysoftmax conformance triton --device cuda 2>&1 | tail -15 | tee "$OUT/conformance_triton.txt"
    "$PY" -m anysoftmax.bench.lse_merge --out "$OUT/results" "$@" 2>&1 | tee "$OUT/bench_pieces.txt" | tail -40
    ;;
  sharded)
    n="${1:-2}"
    nvidia-smi topo -m 2>&1 | tee "$OUT/topo.txt"
    run="$PY -m torch.distributed.run --nproc_per_node=$n"
    timeout 240 $run benchmarks/one_read_smoke.py 2>&1 | tee "$OUT/one_read_smoke_x$n.txt"
    timeout "${BENCH_TIMEOUT:-420}" $run benchmarks/distributed_bench.py ${CHECK:+--check} --out "$OUT" \
      --one-read-variants "${2:-}" 2>&1 \
      | tee "$OUT/distributed_bench_x$n.txt"
    ;;
  sampling_warm|sampling)
    export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$PWD/.gpu/flashinfer}"
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
    [ "$cap" = 9.0 ] && cap=9.0a  # (FlashInfer's Hopper kernels need the arch-specific target)
    export FLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST:-$cap}"
    if [ "$stage" = sampling_warm ]; then
      timeout "${WARM_TIMEOUT:-570}" "$PY" benchmarks/sampling_bench.py --out "$OUT/results" --warm-flashinfer 2>&1 \
        | tee "$OUT/sampling_warm.txt"
    else
      timeout "${BENCH_TIMEOUT:-360}" "$PY" benchmarks/sampling_bench.py --out "$OUT/results" "$@" 2>&1 \
        | tee "$OUT/sampling_bench.txt" | tail -40
    fi
    ;;
  sampling_sharded)
    n="${1:-2}"
    shift || true
    timeout "${BENCH_TIMEOUT:-300}" "$PY" -m torch.distributed.run --nproc_per_node="$n" benchmarks/sampling_sharded_bench.py \
      --out "$OUT/results" "$@" 2>&1 | tee "$OUT/sampling_sharded_x$n.txt" | tail -40
    ;;
  sampler_pdl)
    # Each shape compiles its plain, PDL and overlapping kernels (minutes a process): the tests (in
    # pytest-xdist workers where importable) and the probe's shapes compile in parallel, then the
    # probe times on the warm cache alone.
    workers=""; "$PY" -c "import xdist" 2>/dev/null && workers="-n ${WORKERS:-11}"
    "$PY" -m pytest -m gpu -q -p no:cacheprovider $workers tests/backends/triton/test_sampling_pdl_gpu.py \
      > "$OUT/sampler_pdl_tests.txt" 2>&1 &
    warm=$(mktemp -d)  # (their logs: $OUT brings back 8 files at most)
    for dtype in bfloat16 float32; do
      for rows in $("$PY" -c "from benchmarks.sampler_pdl_probe import ROWS; print(*ROWS)"); do
        "$PY" benchmarks/sampler_pdl_probe.py --warm "$dtype" "$rows" > "$warm/${dtype}_$rows.txt" 2>&1 &
      done
    done
    wait
    tail -n 3 -q "$warm"/*.txt
    tail -5 "$OUT/sampler_pdl_tests.txt"
    mkdir -p "$OUT/results"
    timeout "${BENCH_TIMEOUT:-420}" "$PY" benchmarks/sampler_pdl_probe.py "$OUT/results/sampler_pdl.json" 2>&1 \
      | tee "$OUT/sampler_pdl.txt"
    ;;
  *) echo "usage: bash benchmarks/gpu_run.sh smoke|profile|tests|fwd|bwd|fuzz BACKEND [CALLS] [CHUNK]|pieces|sharded [RANKS] [VARIANTS]|sampling_warm|sampling [ARGS]|sampling_sharded [RANKS] [ARGS]|sampler_pdl" >&2; exit 2 ;;
esac
