#!/usr/bin/env bash
# Nsight Compute on the `triton` backend's split kernels (and `cute`'s, where it runs) at one
# shape, forward and backward, float32 and bfloat16, for each candidate of
# benchmarks/split_probe.py: one profiled launch each (after a warm-up and an L2 flush), then a
# summary per kernel: time, achieved DRAM bandwidth (% of peak), warps active (achieved
# occupancy) against the theoretical, registers per thread, local memory (spills), the top
# warp-stall reasons per issued instruction.
#
#   bash benchmarks/split_ncu.sh OUT [CANDIDATES] [SHAPE] [DTYPES] [DIRECTIONS]
#       CANDIDATES: default base,stages2,stages3 (the table's kernel and the pipelined loop with
#       one and two chunks in flight; add cute to profile the cluster kernels); SHAPE: default
#       512x262144; DTYPES: default float32,bfloat16; DIRECTIONS: default fwd,bwd. One pair:
#   bash benchmarks/split_ncu.sh OUT base,stages2 512x262144 float32 fwd    (2 kernels, about a minute)
#
# Writes OUT/split_ncu.ncu-rep (the report), OUT/split_ncu_raw.csv (`--page raw`),
# OUT/split_ncu_labels.json (what each launch was), OUT/split_ncu_summary.txt (printed too).
# About 1-2 minutes on an H100 for the defaults (12 kernels, ~20 replay passes each).
# Exits 2 without a CUDA GPU, 3 without ncu, 4 when the profiled run fails.
# --clock-control none: the GPU's own clocks (what these machines allowed before); the times
# are then those of an unlocked GPU, comparable within one report.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/split_ncu.sh OUT [CANDIDATES] [SHAPE] [DTYPES] [DIRECTIONS]}
CANDIDATES=${2:-base,stages2,stages3}
SHAPE=${3:-512x262144}
DTYPES=${4:-float32,bfloat16}
DIRECTIONS=${5:-fwd,bwd}
PY=${PY:-python3}
cd "$(dirname "$0")/.."
"$PY" - <<'EOF' || exit 2
import sys
try:
    import torch
except ImportError as exc:
    sys.exit(f"split_ncu: {sys.executable} cannot import torch ({exc}): set PY to the environment's python")
if not torch.cuda.is_available():
    sys.exit("split_ncu: no CUDA GPU visible (torch.cuda.is_available() is False): nothing to profile")
EOF
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
if [ -z "$NCU" ]; then
  echo "ncu not found (set NCU=/path/to/ncu)" >&2
  exit 3
fi
"$NCU" --version | tail -1
STALLS=$(for s in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard math_pipe_throttle \
  membar mio_throttle misc no_instruction short_scoreboard sleeping tex_throttle wait selected not_selected; do
  printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' "$s"; done)
METRICS="${STALLS}dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum"
METRICS="$METRICS,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
METRICS="$METRICS,launch__registers_per_thread,launch__grid_size,launch__block_size,smsp__inst_executed.sum"
start=$(date +%s)
"$NCU" --target-processes all --profile-from-start off --clock-control none \
  --kernel-name regex:'softmax_split|softmax_bwd|cutlass' --launch-count 64 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis --metrics "$METRICS" \
  --export "$OUT/split_ncu" --force-overwrite \
  "$PY" benchmarks/split_probe.py --ncu --out "$OUT" --candidates "$CANDIDATES" --shapes "$SHAPE" \
  --dtypes "$DTYPES" --directions "$DIRECTIONS" 2>&1 | grep -v '^==PROF== Profiling' | tail -20
status=${PIPESTATUS[0]}
echo "profiled in $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ] || [ ! -s "$OUT/split_ncu.ncu-rep" ]; then
  echo "the profiled run failed (ncu exit $status): no report to summarise" >&2
  exit 4
fi
# (base units: ns and bytes; an ncu without --print-units prints its own, which the summary reads too)
"$NCU" --import "$OUT/split_ncu.ncu-rep" --page raw --csv --print-units base > "$OUT/split_ncu_raw.csv" 2>/dev/null \
  || "$NCU" --import "$OUT/split_ncu.ncu-rep" --page raw --csv > "$OUT/split_ncu_raw.csv"
"$PY" benchmarks/split_probe.py --ncu-summary "$OUT/split_ncu_raw.csv" --labels "$OUT/split_ncu_labels.json" \
  | tee "$OUT/split_ncu_summary.txt"
