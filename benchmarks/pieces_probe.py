"""Probes behind the pieces' plans on a GPU, each timing against the same-bytes copy of its run:

* merge: `merge_kernel`'s tiles (rows x head), warps and grid (persistent at 8 programs per SM,
  or one program per tile) at the bench's decode and prefill shapes (K = 2 and 8, tokens 1..8192
  x 32 heads x D 64/128/256, bf16, vLLM's [heads, tokens] lses), each configuration launched
  through its bound launcher (as a repeated request runs), its result checked against the
  float64 merge (`core.compare.compare_merge`); and the automatic plan beside them.
* host: merge_states, logsumexp and softmax back to back through the native and Triton
  launchers, and a profile of the host path of each.
* lse: the read ceiling of the shapes where logsumexp stays under 0.95 of copy (torch's sum and
  amax over rows), the automatic logsumexp, and two logsumexp kernels written here: whole rows
  per tile (one program per tile, or persistent with the loop's loads software-pipelined over
  `num_stages`), and rows read as boxes by the tensor memory accelerator into a pipeline of
  shared-memory buffers, to tell the row kernels' plan from what a read-only kernel reaches.

    python benchmarks/pieces_probe.py --out DIR [--parts merge,host,lse] [--budget-s 540]

JSON lines in DIR/pieces_probe.jsonl, a summary of the best per shape on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

import anysoftmax
from anysoftmax.backends._triton_common import native_launch
from anysoftmax.backends._triton_common.pieces import MergePlan, merge_launcher
from anysoftmax.bench.pieces import MERGE_D, MERGE_HEADS, MERGE_K, MERGE_TOKENS, _copy_us
from anysoftmax.core.compare import compare_merge
from anysoftmax.core.pieces import MergeSpec
from anysoftmax.perf import back_to_back_us, rotation_count, time_ms, warm_up

KW = dict(warmup_ms=5, rep_ms=25)
LSE_SHAPES = [(32768, 1024), (16384, 4096)]


def emit(f, row):
    f.write(json.dumps(row) + "\n")
    f.flush()


def merge_sets(tokens, d, k, n):
    sets = []
    for _ in range(n):
        outs = [torch.randn(tokens, MERGE_HEADS, d, device="cuda", dtype=torch.bfloat16) for _ in range(k)]
        lses = [torch.randn(MERGE_HEADS, tokens, device="cuda").t() * 3 for _ in range(k)]
        sets.append((outs, lses))
    return sets


def probe_merge(f, deadline):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    summary = []
    for k, d, tokens in itertools.product(MERGE_K, MERGE_D, MERGE_TOKENS):
        if time.time() > deadline:
            break
        rows_n = tokens * MERGE_HEADS
        nbytes = (k + 1) * (rows_n * d * 2 + rows_n * 4)
        sets = merge_sets(tokens, d, k, rotation_count(nbytes))
        copy = _copy_us(nbytes, "cuda", time_ms, KW)
        spec = MergeSpec.from_tensors(*sets[0])
        auto = time_ms(lambda s: anysoftmax.merge_states(*s), sets, "cuda", **KW) * 1e3
        best = ("auto", auto)
        bd = min(triton.next_power_of_2(d), 256)
        for br, warps, persistent in itertools.product([1, 2, 4, 8, 16, 32], [1, 2, 4, 8], [True, False]):
            per_thread = br * bd / (32 * warps)
            if not 2 <= per_thread <= 64 or br > triton.next_power_of_2(rows_n):
                continue
            tiles = math.ceil(rows_n / br) * math.ceil(d / bd)
            plan = MergePlan(br, bd, min(tiles, sms * 8) if persistent else tiles, num_warps=warps)
            run = merge_launcher(spec, lambda *_a, p=plan: p)
            try:
                ok = compare_merge(*run(*sets[0], None, None), *sets[0], device="cuda").ok
                us = time_ms(lambda s: run(*s, None, None), sets, "cuda", **KW) * 1e3
            except Exception as exc:  # a configuration that does not compile or launch is a row
                emit(f, dict(part="merge", K=k, D=d, tokens=tokens, br=br, warps=warps, persistent=persistent,
                             error=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            emit(f, dict(part="merge", K=k, D=d, tokens=tokens, br=br, warps=warps, persistent=persistent,
                         grid=plan.grid, us=round(us, 3), copy_us=round(copy, 3), frac=round(copy / us, 3), ok=ok))
            if ok and us < best[1]:
                best = (f"br={br} warps={warps} {'persistent' if persistent else 'all tiles'}", us)
        line = dict(part="merge_best", K=k, D=d, tokens=tokens, copy_us=round(copy, 3), auto_us=round(auto, 3),
                    auto_frac=round(copy / auto, 3), best=best[0], best_us=round(best[1], 3),
                    best_frac=round(copy / best[1], 3))
        emit(f, line)
        summary.append(line)
        print(json.dumps(line), flush=True)
        del sets
    return summary


def probe_host(f):
    x = torch.randn(16, 1024, device="cuda")
    outs2, lses2 = merge_sets(1, 128, 2, 1)[0]
    outs8, lses8 = merge_sets(1, 128, 8, 1)[0]
    src = torch.randn(32 * 128, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    res = {"torch.copy_ 8 KB": back_to_back_us(lambda: dst.copy_(src), "cuda"),
           "torch.softmax 16x1024": back_to_back_us(lambda: torch.softmax(x, -1), "cuda")}
    for which in ("triton", "native"):
        native_launch.LAUNCHER = which
        anysoftmax.refresh()
        for name, call in [("softmax 16x1024", lambda: anysoftmax.softmax(x, -1)),
                           ("merge_states K=2 1x32x128", lambda: anysoftmax.merge_states(outs2, lses2)),
                           ("merge_states K=8 1x32x128", lambda: anysoftmax.merge_states(outs8, lses8)),
                           ("logsumexp 16x1024", lambda: anysoftmax.logsumexp(x, -1))]:
            res[f"{name} ({which})"] = min(back_to_back_us(call, "cuda") for _ in range(5))
        for name, call in [("merge_states K=8 1x32x128", lambda: anysoftmax.merge_states(outs8, lses8)),
                           ("logsumexp 16x1024", lambda: anysoftmax.logsumexp(x, -1))]:
            profile(f, f"{name} ({which})", call)
    native_launch.LAUNCHER = native_launch.choose(None)
    anysoftmax.refresh()
    for name, us in res.items():
        emit(f, dict(part="host", what=name, us=round(us, 2)))
        print(f"host {name}: {us:.2f} us", flush=True)


def profile(f, name, call, calls=2000):
    """cProfile of `calls` back-to-back calls: the 15 entries of most own time, as a row."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    emit(f, dict(part="host_profile", what=name, calls=calls, profile=text.getvalue()[-6000:]))


@triton.jit
def probe_lse_kernel(x_ptr, o_ptr, n_rows, N: tl.constexpr, BM: tl.constexpr, STAGES: tl.constexpr):
    """Whole rows of N per tile, BM rows a tile: o = log(sum(exp(x - max))) + max."""
    cols = tl.arange(0, N)
    for blk in tl.range(tl.program_id(0), tl.cdiv(n_rows, BM), tl.num_programs(0), num_stages=STAGES):
        rows = blk * BM + tl.arange(0, BM)
        ok = rows < n_rows
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=ok[:, None]).to(tl.float32)
        m = tl.max(x, 1)
        s = tl.sum(tl.exp2((x - m[:, None]) * 1.4426950408889634), 1)
        tl.store(o_ptr + rows, m + tl.log(s), mask=ok)


@triton.jit
def probe_tma_lse_kernel(desc, o_ptr, n_rows, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         STAGES: tl.constexpr):
    """Rows read as [BM, BN] boxes by the tensor memory accelerator, one flat loop over this
    program's (row block, column box) pairs pipelined over STAGES buffers, an online max and
    sum per row closed at its last box."""
    NC: tl.constexpr = N // BN
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    mine = (tl.cdiv(n_rows, BM) - pid + nprog - 1) // nprog
    m = tl.full([BM], float("-inf"), tl.float32)
    s = tl.zeros([BM], tl.float32)
    for it in tl.range(0, mine * NC, num_stages=STAGES):
        blk = pid + (it // NC) * nprog
        c = it % NC
        x = desc.load([blk * BM, c * BN]).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 1))
        s = s * tl.exp2((m - m_new) * 1.4426950408889634) + \
            tl.sum(tl.exp2((x - m_new[:, None]) * 1.4426950408889634), 1)
        m = m_new
        if c == NC - 1:
            rows = blk * BM + tl.arange(0, BM)
            tl.store(o_ptr + rows, m + tl.log(s), mask=rows < n_rows)
            m = tl.full([BM], float("-inf"), tl.float32)
            s = tl.zeros([BM], tl.float32)


def probe_tma(f, what, xs, ref, copy, m, n, sms):
    from triton.tools.tensor_descriptor import TensorDescriptor

    best = (None, float("inf"))
    for bm, bn, stages, warps, per_sm in itertools.product([16, 32], [256], [3, 4], [4, 8], [1, 2, 4]):
        if n % bn:
            continue
        grid = min(math.ceil(m / bm), sms * per_sm)
        descs = [TensorDescriptor.from_tensor(x, block_shape=[bm, bn]) for x in xs]
        out = torch.empty(m, device="cuda")
        cfg = dict(bm=bm, bn=bn, stages=stages, warps=warps, per_sm=per_sm)
        try:
            probe_tma_lse_kernel[(grid,)](descs[0], out, m, N=n, BM=bm, BN=bn, STAGES=stages, num_warps=warps)
            ok = torch.allclose(out, ref, atol=1e-3, rtol=1e-4)
            us = time_ms(lambda d: probe_tma_lse_kernel[(grid,)](d, out, m, N=n, BM=bm, BN=bn, STAGES=stages,
                                                                num_warps=warps), descs, "cuda", **KW) * 1e3
        except Exception as exc:
            emit(f, dict(**what, provider="probe_tma_lse_kernel", **cfg, error=f"{type(exc).__name__}: {exc}"[:300]))
            continue
        emit(f, dict(**what, provider="probe_tma_lse_kernel", **cfg, us=round(us, 3), frac=round(copy / us, 3),
                     ok=ok))
        if ok and us < best[1]:
            best = (cfg, us)
    emit(f, dict(**what, provider="probe_tma_lse_kernel best", config=best[0], us=round(best[1], 3),
                 frac=round(copy / best[1], 3)))
    print(f"lse {what['dtype']} {m}x{n} TMA best {best[0]}: {copy / best[1]:.3f} of copy", flush=True)


def probe_lse(f, deadline, kernels=("simple", "tma")):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dtype, (m, n) in itertools.product([torch.bfloat16, torch.float32], LSE_SHAPES):
        if time.time() > deadline:
            break
        nbytes = m * n * dtype.itemsize + m * 4
        xs = [torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(rotation_count(nbytes))]
        copy = _copy_us(nbytes, "cuda", time_ms, KW)
        ref = torch.logsumexp(xs[0].float(), -1)
        what = dict(part="lse", dtype=str(dtype)[6:], M=m, N=n, copy_us=round(copy, 3))
        refs = {"torch.sum": lambda t: t.sum(-1, dtype=torch.float32), "torch.amax": lambda t: t.amax(-1),
                "anysoftmax.logsumexp": lambda t: anysoftmax.logsumexp(t, -1),
                "anysoftmax.logsumexp:triton": lambda t: anysoftmax.logsumexp(t, -1, backend="triton")}
        for name, fn in refs.items():
            us = time_ms(fn, xs, "cuda", **KW) * 1e3
            emit(f, dict(**what, provider=name, us=round(us, 3), frac=round(copy / us, 3)))
            print(f"lse {dtype} {m}x{n} {name}: {copy / us:.3f} of copy", flush=True)
        if "tma" in kernels:
            probe_tma(f, what, xs, ref, copy, m, n, sms)
        best = (None, float("inf"))
        for tile, warps, stages, grid_kind in ([] if "simple" not in kernels else itertools.product(sorted({n, 2048, 4096, 8192, 16384}), [4, 8], [1, 3],
                                                                ["all", 8])):
            bm = tile // n
            if bm < 1 or tile < n or (grid_kind == "all" and stages > 1):
                continue
            blocks = math.ceil(m / bm)
            grid = blocks if grid_kind == "all" else min(blocks, sms * grid_kind)
            out = torch.empty(m, device="cuda")
            try:
                probe_lse_kernel[(grid,)](xs[0], out, m, N=n, BM=bm, STAGES=stages, num_warps=warps)
                ok = torch.allclose(out, ref, atol=1e-3, rtol=1e-4)
                us = time_ms(lambda t: probe_lse_kernel[(grid,)](t, out, m, N=n, BM=bm, STAGES=stages, num_warps=warps),
                             xs, "cuda", **KW) * 1e3
            except Exception as exc:
                emit(f, dict(**what, provider="probe_lse_kernel", bm=bm, warps=warps, stages=stages, grid=grid,
                             error=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            emit(f, dict(**what, provider="probe_lse_kernel", bm=bm, warps=warps, stages=stages, grid=grid,
                         per_sm=grid_kind, us=round(us, 3), frac=round(copy / us, 3), ok=ok))
            if ok and us < best[1]:
                best = (dict(bm=bm, warps=warps, stages=stages, per_sm=grid_kind), us)
        if best[0] is not None:
            emit(f, dict(**what, provider="probe_lse_kernel best", config=best[0], us=round(best[1], 3),
                         frac=round(copy / best[1], 3)))
            print(f"lse {dtype} {m}x{n} probe best {best[0]}: {copy / best[1]:.3f} of copy", flush=True)
        del xs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="host,merge,lse")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--lse-kernels", default="simple,tma", help="the probe kernels timed (simple, tma)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + a.budget_s
    warm_up("cuda")
    with open(a.out / "pieces_probe.jsonl", "a") as f:
        emit(f, dict(part="device", name=torch.cuda.get_device_name(), torch=torch.__version__,
                     triton=triton.__version__))
        parts = a.parts.split(",")
        if "host" in parts:
            probe_host(f)
        if "lse" in parts:
            probe_lse(f, deadline - (240 if "merge" in parts else 0), a.lse_kernels.split(","))
        if "merge" in parts:
            probe_merge(f, deadline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
