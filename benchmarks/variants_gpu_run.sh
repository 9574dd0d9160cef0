#!/usr/bin/env bash
# The fused family on one CUDA GPU (issue 22), in stages that each fit one 10-minute command on an
# H100, logging under $OUT (default out/gpu). Run from the repository root on a host whose python3
# has torch and triton (optional peers liger-kernel, quack-kernels on PYTHONPATH):
#
#   bash benchmarks/variants_gpu_run.sh matrix "gpu conformance"   # every variant, dtype, op, direction  ~4 min
#   bash benchmarks/variants_gpu_run.sh matrix "gpu long rows"     # many rows, rows past one tile        ~3 min
#   bash benchmarks/variants_gpu_run.sh matrix "gpu bandwidth"     # a glance at S = 1024, bf16            ~1 min
#   bash benchmarks/variants_gpu_run.sh fwd 1024                   # bench --variants, forward, S = 1024  ~4 min
#   bash benchmarks/variants_gpu_run.sh fwd 2048                   #                            S = 2048  ~5 min
#   bash benchmarks/variants_gpu_run.sh fwd 4096 bfloat16          # S = 4096: one dtype per command     ~4 min
#   bash benchmarks/variants_gpu_run.sh fwd 4096 float32           #                                      ~5 min
#   bash benchmarks/variants_gpu_run.sh bwd 1024 | bwd 2048        # backward, alike                 ~5 / ~7 min
#   bash benchmarks/variants_gpu_run.sh bwd 4096 bfloat16 | bwd 4096 float32                       ~5 / ~6 min
#   bash benchmarks/variants_gpu_run.sh extra fwd|bwd              # additive, causal-bottom-right, megatron,
#                                                                  # gemma2, gpt-oss at S = 2048, bf16    ~4 min
#   bash benchmarks/variants_gpu_run.sh block 1024 | block 4096    # compiled attention block, S x head 64:
#                                                                  # torch, anysoftmax, scale=        ~6 / ~8 min
#   bash benchmarks/variants_gpu_run.sh merge                      # parts -> $OUT/results/<gpu>/softmax_variants_*
#
# A bench stage writes $OUT/parts/<dir>-S<S>[-<dtype>]/<gpu>/softmax_variants_<dir>.{json,csv,png}
# (each variant's same-bytes copy measured in the same run); `merge` folds the parts of each
# direction into one file (anysoftmax.bench.merge), prints the table, and merges the matrix
# entries' reports into $OUT/matrix_variants/merged. VARIANTS overrides the variants of fwd/bwd
# (default: those of the speed goals: plain,scale,mask,causal,softcap,sinks); with PART=<name>
# a run goes to a part of its own, e.g. a stage split in two when it nears the 10 minutes:
#   PART=a VARIANTS=plain,scale,mask bash benchmarks/variants_gpu_run.sh bwd 2048
#   PART=b VARIANTS=causal,softcap,sinks bash benchmarks/variants_gpu_run.sh bwd 2048
set -uo pipefail
OUT="${OUT:-out/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PY:-python3}"
VARIANTS="${VARIANTS:-plain,scale,mask,causal,softcap,sinks}"
EXTRA="additive,causal-bottom-right,megatron,gemma2,gpt-oss"
stage="${1:-}"
shift || true

bench() {  # bench <fwd|bwd> <S> <dtypes> <variants> <part name>
  local flag=""; [ "$1" = bwd ] && flag="--bwd"
  "$PY" -m anysoftmax.bench.softmax --variants "$4" $flag --shapes "8x16x$2x$2" --dtypes "$3" \
    --case-timeout 300 --out "$OUT/parts/$5" 2>&1 | tee "$OUT/bench_variants_$5.txt" | tail -30
}

case "$stage" in
  matrix)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    [ $# -eq 0 ] && set -- "gpu conformance" "gpu long rows" "gpu bandwidth"
    for entry in "$@"; do
      slug="${entry// /_}"
      "$PY" -m anysoftmax matrix variants --device "$entry" --out "$OUT/matrix_variants/$slug" 2>&1 \
        | tee "$OUT/matrix_variants_$slug.txt" | tail -25
    done
    ;;
  fwd|bwd)
    [ $# -ge 1 ] || { echo "usage: $0 $stage S [dtype]" >&2; exit 2; }
    s="$1"; dtypes="${2:-bfloat16,float32}"; part="$stage-S$s${2:+-$2}${PART:+-$PART}"
    bench "$stage" "$s" "$dtypes" "$VARIANTS" "$part"
    ;;
  extra)
    bench "${1:-fwd}" 2048 bfloat16 "$EXTRA" "${1:-fwd}-extra-S2048"
    ;;
  merge)
    "$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
from anysoftmax.bench import merge, report
from anysoftmax.bench.tables import variants_tables
out = Path(sys.argv[1])
for direction in ("fwd", "bwd"):
    parts = sorted(out.glob(f"parts/{direction}-*/*/softmax_variants_{direction}.json"))
    if not parts:
        continue
    doc = None
    for p in parts:
        new = json.loads(p.read_text())
        doc = new if doc is None else merge.merge(doc, new, p.parent.parent.name)
    paths = report.write(doc, out / "results" / parts[0].parent.name, f"softmax_variants_{direction}")
    print(variants_tables(doc))
    print("wrote " + ", ".join(map(str, paths)))
EOF
    reports=$(ls "$OUT"/matrix_variants/gpu_*/report.json 2>/dev/null)
    [ -n "$reports" ] && "$PY" -m anysoftmax merge $reports --out "$OUT/matrix_variants/merged" | tail -5
    ;;
  block)
    s="${1:-1024}"
    "$PY" -m anysoftmax.bench.compiled_block --out "$OUT/results/compiled_block_scale_$s" --shapes "8x16x${s}x64" \
      --providers torch anysoftmax anysoftmax:scale 2>&1 | tee "$OUT/compiled_block_scale_$s.txt" | tail -30
    ;;
  *) echo "usage: bash benchmarks/variants_gpu_run.sh matrix [ENTRY...]|fwd S [dtype]|bwd S [dtype]|extra fwd|bwd|merge|block [S]" >&2
     exit 2 ;;
esac
