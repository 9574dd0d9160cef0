"""A first look at the one-read sharded softmax on this host's GPUs, case by case with a line
each (the conformance kit, `--check` of distributed_bench.py, reports only at its end: a hang
would show nothing). Every rank makes the same global rows, takes its shard (uneven, one rank's
empty), and rank 0 compares the gathered result with the float64 softmax of the whole rows.

    python -m torch.distributed.run --nproc_per_node=2 benchmarks/one_read_smoke.py
"""

from __future__ import annotations

import itertools
import os
import sys
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anysoftmax.distributed as asd  # noqa: E402
from anysoftmax.backends.triton import heuristics  # noqa: E402
from anysoftmax.core.reference import fused_forward  # noqa: E402
from anysoftmax.core.spec import TOLERANCES  # noqa: E402
from anysoftmax.core.variant import build  # noqa: E402
from anysoftmax.distributed import one_read  # noqa: E402

# (rows, n, cut fractions, dtype, keywords): n is the global row length.
CASES = [
    ((4,), 4096, None, torch.float32, {}),
    ((3, 5), 70001, (0.3, 0.9), torch.bfloat16, {"scale": 0.5}),
    ((16,), 262144, None, torch.bfloat16, {}),
    ((2, 7), 131072, None, torch.float16, {"softcap": 20.0, "sinks": True, "log": True}),
    ((9,), 100000, (0.0,), torch.float32, {"mask": True, "sinks": True}),
    ((1024,), 8192, None, torch.bfloat16, {}),
    ((2048,), 131072, None, torch.bfloat16, {"sinks": True}),  # (many chunks and passes per program)
    ((3000,), 65536, (0.4,), torch.float32, {"log": True}),
    ((5,), 3_000_000, None, torch.float32, {"log": True}),
]

# The one-launch forms (PHASE 0): the tuning table's, and each dtype's other prefetch choice.
FORMS = [("tuned", {}), ("prefetch flipped", {"sharded_prefetch_16bit": True, "sharded_prefetch_32bit": False})]


def main() -> int:
    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    failures = 0
    for (rows, n, cuts, dtype, kw), (form, tuning) in itertools.product(CASES, FORMS):
        g = torch.Generator(device="cpu").manual_seed(n)
        x = (torch.randn(*rows, n, generator=g) * 4).to(dtype)
        bounds = [0, *[int(f * n) for f in (cuts or [i / world for i in range(1, world)])][:world - 1], n]
        lo, hi = bounds[rank], bounds[rank + 1]
        mask = torch.randn(*rows, n, generator=g) if kw.get("mask") else None
        sinks = torch.randn(*rows, 1, generator=g) if kw.get("sinks") else None
        fn = asd.log_softmax if kw.get("log") else asd.softmax
        args = dict(scale=kw.get("scale"), softcap=kw.get("softcap"),
                    mask=None if mask is None else mask[..., lo:hi].to(device),
                    sinks=None if sinks is None else sinks.to(device))
        before = one_read.stats["calls"]
        xs = x[..., lo:hi].to(device)
        with heuristics.override(**tuning):
            for _ in range(3):  # the same request again: the epochs move on
                y = fn(xs, -1, **args)
        torch.cuda.synchronize(device)
        path = "one_read" if one_read.stats["calls"] > before else "two_pass"
        parts = [torch.empty(*rows, bounds[r + 1] - bounds[r], dtype=dtype, device=device) for r in range(world)]
        parts[rank].copy_(y)
        for r in range(world):  # (uneven shards: a broadcast per rank)
            dist.broadcast(parts[r], src=r)
        if rank == 0:
            v, _ = build(tuple(x.shape), x.device, x.dim() - 1, scale=kw.get("scale"), mask=mask,
                         softcap=kw.get("softcap"), sinks=sinks)
            ref, _ = fused_forward(x, v, x.dim() - 1, bool(kw.get("log")), mask, sinks, torch.float64)
            got = torch.cat([p.cpu() for p in parts], -1).double()
            tol = TOLERANCES[dtype]
            err = (got - ref).abs()
            bound = tol.atol + tol.rtol * ref.abs()
            ok = bool((err <= bound).all()) and not bool(got.isnan().any())
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {str(dtype):15s} rows={rows} n={n} cuts={bounds} {kw} path={path} ({form}) "
                  f"max err {float(err.max()):.3e}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"{failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
