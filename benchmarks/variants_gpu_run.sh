#!/usr/bin/env bash
# The fused family on one CUDA GPU (issue 22): each stage fits in one 10-minute command on an
# H100 and logs under $OUT (default out/gpu). Run from the repository root on a host whose
# python3 has torch and triton (optional peers liger-kernel, quack-kernels on PYTHONPATH):
#
#   bash benchmarks/variants_gpu_run.sh matrix        # conformance of every variant (configs/variants.yaml)  ~5 min
#   bash benchmarks/variants_gpu_run.sh fwd 1024      # the variants benchmark, forward, S = 1024          ~4 min
#   bash benchmarks/variants_gpu_run.sh fwd 2048      #                                   S = 2048          ~5 min
#   bash benchmarks/variants_gpu_run.sh fwd 4096      #                                   S = 4096          ~8 min
#   bash benchmarks/variants_gpu_run.sh bwd 1024|2048|4096                # backward, alike        ~5 / 6 / 9 min
#   bash benchmarks/variants_gpu_run.sh merge         # the parts -> $OUT/results/<gpu>/softmax_variants_{fwd,bwd}.*
#   bash benchmarks/variants_gpu_run.sh block         # compiled attention block: torch, anysoftmax, scale=  ~6 min
#   bash benchmarks/variants_gpu_run.sh extra fwd|bwd # the other presets (additive, causal-bottom-right,
#                                                     # megatron, gemma2, gpt-oss) at S = 2048             ~5 min
#
# A bench stage writes $OUT/parts/<dir>-S<S>/<gpu>/softmax_variants_<dir>.{json,csv,png} (the
# copy of each variant's bytes is measured in the same run); `merge` folds every part of a
# direction into one file (anysoftmax.bench.merge) and prints the table. VARIANTS overrides the
# variants of fwd/bwd (default: those of the speed goals: plain,scale,mask,causal,softcap,sinks).
set -uo pipefail
OUT="${OUT:-out/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PY:-python3}"
VARIANTS="${VARIANTS:-plain,scale,mask,causal,softcap,sinks}"
EXTRA="additive,causal-bottom-right,megatron,gemma2,gpt-oss"
stage="${1:-}"
shift || true

bench() {  # bench <fwd|bwd> <S> <variants> <part name>
  local flag=""; [ "$1" = bwd ] && flag="--bwd"
  "$PY" -m anysoftmax.bench.softmax --variants "$3" $flag --shapes "8x16x$2x$2" --dtypes bfloat16,float32 \
    --case-timeout 300 --out "$OUT/parts/$4" 2>&1 | tee "$OUT/bench_variants_$4.txt" | tail -30
}

case "$stage" in
  matrix)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
    "$PY" -m anysoftmax matrix variants --out "$OUT/matrix_variants" 2>&1 | tee "$OUT/matrix_variants.txt" | tail -40
    ;;
  fwd|bwd)
    for s in "${@:-2048}"; do bench "$stage" "$s" "$VARIANTS" "$stage-S$s"; done
    ;;
  extra)
    bench "${1:-fwd}" 2048 "$EXTRA" "${1:-fwd}-extra-S2048"
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
    ;;
  block)
    "$PY" -m anysoftmax.bench.compiled_block --out "$OUT/results/compiled_block_scale" \
      --providers torch anysoftmax anysoftmax:scale 2>&1 | tee "$OUT/compiled_block_scale.txt" | tail -30
    ;;
  *) echo "usage: bash benchmarks/variants_gpu_run.sh matrix|fwd [S...]|bwd [S...]|extra fwd|bwd|merge|block" >&2
     exit 2 ;;
esac
