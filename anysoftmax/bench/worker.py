"""Runs one provider over a list of cases in its own process (a crash there cannot poison the
CUDA context of the others). Reads a JSON job on stdin, prints one JSON result per line."""

from __future__ import annotations

import json
import sys

import torch

from anysoftmax.core import SoftmaxSpec, compare, compare_backward

from .providers import REFERENCE_ONLY, Unavailable, backward, forward
from anysoftmax.perf import rotation_count

from .timing import median_ms

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_case(provider: str, direction: str, dtype_name: str, m: int, n: int, dim: int = -1) -> dict:
    dtype = DTYPES[dtype_name]
    row = dict(provider=provider, dtype=dtype_name, M=m, N=n, dim=dim, gbps=0.0, frac_of_copy=0.0, us=0.0,
               max_err=float("nan"), status="failed", detail="")
    try:
        fn = forward(provider, dim) if direction == "fwd" else backward(provider)
    except Unavailable as exc:
        row.update(status="unavailable", detail=str(exc))
        return row
    elem = torch.tensor([], dtype=dtype).element_size()
    tensors_per_set = 1 if direction == "fwd" else 2
    n_sets = rotation_count(tensors_per_set * m * n * elem)
    # A reference provider moves the same bytes but is not a softmax: nothing to check.
    ok, err, detail = True, float("nan"), "reference: same bytes moved, not a softmax"
    try:
        if direction == "fwd":
            sets = [((torch.randn(m, n, device="cuda") * 3).to(dtype),) for _ in range(n_sets)]
            out = fn(*sets[0])
            if provider not in REFERENCE_ONLY:
                cmp = compare(out, sets[0][0], SoftmaxSpec.from_tensor(sets[0][0], dim), device="cuda")
                ok, err, detail = cmp.ok, cmp.max_abs_err, cmp.detail
            bytes_moved = 2 * m * n * elem
        else:
            sets = []
            for _ in range(n_sets):
                x = torch.randn(m, n, device="cuda") * 3
                sets.append((torch.softmax(x, -1).to(dtype), torch.randn(m, n, device="cuda").to(dtype)))
            out = fn(*sets[0])
            if provider not in REFERENCE_ONLY:
                cmp = compare_backward(out, *sets[0], SoftmaxSpec.from_tensor(sets[0][0], -1), device="cuda")
                ok, err, detail = cmp.ok, cmp.max_abs_err, cmp.detail
            bytes_moved = 3 * m * n * elem
        torch.cuda.synchronize()
    except Exception as exc:  # a provider failing on a shape is a result, not a crash of the run
        row.update(status="failed", detail=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        return row
    row["max_err"] = err
    if not ok:
        row.update(status="wrong", detail=detail)
        return row
    ms = median_ms(fn, sets)
    row.update(status="ok", us=ms * 1e3, gbps=bytes_moved / (ms * 1e-3) / 1e9, detail=detail)
    return row


def warm_up_gpu(seconds: float = 0.5) -> None:
    """Keep the GPU busy for a moment before the first timing. A fresh process used to time
    its first (small) shapes at idle clocks: the provider that ran first in a run lost up to
    0.3 of copy bandwidth on 16-32 MB tensors against the same kernel timed second (H100)."""
    import time

    a = torch.randn(4096, 4096, device="cuda")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            a = (a @ a).mul_(1e-3)
        torch.cuda.synchronize()


def main() -> None:
    job = json.load(sys.stdin)
    warm_up_gpu()
    for case in job["cases"]:
        print(json.dumps(run_case(job["provider"], job["direction"], *case)), flush=True)


if __name__ == "__main__":
    main()
