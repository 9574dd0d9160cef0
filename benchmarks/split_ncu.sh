#!/usr/bin/env bash
# Nsight Compute on the `triton` backend's split kernels (and `cute`'s, where it runs) at one
# shape, forward and backward, float32 and bfloat16, for each candidate of
# benchmarks/split_probe.py: one profiled launch each (after a warm-up and an L2 flush), then a
# summary per kernel: time, achieved DRAM bandwidth (% of peak), warps active (achieved
# occupancy) against the theoretical, registers per thread, local memory (spills), the top
# warp-stall reasons per issued instruction.
#
#   bash benchmarks/split_ncu.sh OUT [CANDIDATES] [SHAPE]
#       CANDIDATES: default base,prefetch,prefetch_small,cute; SHAPE: default 512x262144
#
# Writes OUT/split_ncu.ncu-rep (the report), OUT/split_ncu_raw.csv (`--page raw`),
# OUT/split_ncu_labels.json (what each launch was), OUT/split_ncu_summary.txt (printed too).
# About 1-2 minutes on an H100 for the defaults (16 kernels, ~20 replay passes each).
# --clock-control none: the GPU's own clocks (what these machines allowed before); the times
# are then those of an unlocked GPU, comparable within one report.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/split_ncu.sh OUT [CANDIDATES] [SHAPE]}
CANDIDATES=${2:-base,prefetch,prefetch_small,cute}
SHAPE=${3:-512x262144}
PY=${PY:-python3}
cd "$(dirname "$0")/.."
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
  --dtypes float32,bfloat16 --directions fwd,bwd 2>&1 | grep -v '^==PROF== Profiling' | tail -20
echo "profiled in $(( $(date +%s) - start )) s"
# (base units: ns and bytes; an ncu without --print-units prints its own, which the summary reads too)
"$NCU" --import "$OUT/split_ncu.ncu-rep" --page raw --csv --print-units base > "$OUT/split_ncu_raw.csv" 2>/dev/null \
  || "$NCU" --import "$OUT/split_ncu.ncu-rep" --page raw --csv > "$OUT/split_ncu_raw.csv"
"$PY" benchmarks/split_probe.py --ncu-summary "$OUT/split_ncu_raw.csv" --labels "$OUT/split_ncu_labels.json" \
  | tee "$OUT/split_ncu_summary.txt"
