#!/usr/bin/env bash
# The device matrix on Ray vs local workers, on one GPU host (e.g. 2x H200), from the repo root.
#
#   bash benchmarks/ray_gpu_run.sh [CONFIG]      # CONFIG: default h100 (bare names resolve)
#
# Installs Ray from .gpu/ray/ if it is missing (the host has no network; see README, "The matrix on Ray"),
# starts a Ray head bound to 127.0.0.1 (no dashboard, token auth with a throwaway token), runs
# the matrix with local workers, then on Ray, and writes both reports, the timings and a
# cell-by-cell status comparison under $OUT (default: out/ray_gpu_run).
set -euo pipefail
CONFIG=${1:-h100}
OUT=${OUT:-out/ray_gpu_run}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

if ! $PY -c "import ray" 2>/dev/null; then
  W=ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
  # The two halves travel in consecutive calls (64 MiB each): part 1 may already wait in /tmp.
  P0=.gpu/ray/part1/ray.whl.part00; [ -f "$P0" ] || P0=/tmp/ray.whl.part00
  DEPS=.gpu/ray/part1/deps; [ -d "$DEPS" ] || DEPS=/tmp/raydeps
  cat "$P0" .gpu/ray/part2/ray.whl.part01 > "/tmp/$W"
  (cd /tmp && sha256sum -c <(sed "s#wheels/##" "$OLDPWD/.gpu/ray/part2/ray.whl.sha256"))
  $PY -m pip install -q --no-index --find-links "$DEPS" "/tmp/$W"
fi

export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN=$($PY -c "import uuid; print(uuid.uuid4().hex)")
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0  # keep 127.0.0.1: Ray would swap in the host's address
ray start --head --node-ip-address 127.0.0.1 --port 6379 --include-dashboard=false --disable-usage-stats \
  > "$OUT/ray_start.log" 2>&1
trap 'ray stop --force > /dev/null 2>&1 || true' EXIT
ray status --address 127.0.0.1:6379 > "$OUT/ray_status.txt" 2>&1 || true

t0=$(date +%s.%N)
$PY -m anysoftmax matrix "$CONFIG" --out "$OUT/local" --no-progress > "$OUT/local.log" 2>&1 || echo "local: exit $?"
t1=$(date +%s.%N)
$PY -m anysoftmax matrix "$CONFIG" --ray 127.0.0.1:6379 --out "$OUT/ray" --no-progress > "$OUT/ray.log" 2>&1 \
  || echo "ray: exit $?"
t2=$(date +%s.%N)

$PY - "$OUT" "$t0" "$t1" "$t2" <<'PYEOF' | tee "$OUT/ray_vs_local.txt"
import json, sys
out, t0, t1, t2 = sys.argv[1], *map(float, sys.argv[2:])
local, ray = (json.load(open(f"{out}/{k}/report.json")) for k in ("local", "ray"))
print(f"local workers: {t1 - t0:.1f} s wall (report {local['seconds']:.1f} s), counts {local['counts']}")
print(f"ray:           {t2 - t1:.1f} s wall (report {ray['seconds']:.1f} s), counts {ray['counts']}")
diff = [(a["id"], a["status"], b["status"]) for a, b in zip(local["cells"], ray["cells"]) if a["status"] != b["status"]]
print(f"cells whose status differs: {len(diff)}", *diff[:20], sep="\n  ")
print("ray placements:", sorted({(c["host"], c["ran_on"]) for c in ray["cells"]}))
PYEOF
