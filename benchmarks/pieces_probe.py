"""Probes behind the pieces' plans on a GPU, each timing against the same-bytes copy of its run:

* merge: `merge_kernel`'s tiles (rows x head), warps and grid (persistent at 8 programs per SM,
  or one program per tile) at the bench's decode and prefill shapes (K = 2 and 8, tokens 1..8192
  x 32 heads x D 64/128/256, bf16, vLLM's [heads, tokens] lses), each configuration launched
  through its bound launcher (as a repeated request runs), its result checked against the
  float64 merge (`testing.compare.compare_merge`); and the automatic plan beside them.
* host: merge_states, logsumexp and softmax back to back through the native and Triton
  launchers, and a profile of the host path of each.
* lse: the read ceiling of the shapes where logsumexp stays under 0.95 of copy (torch's sum and
  amax over rows), the automatic logsumexp, and two logsumexp kernels written here: whole rows
  per tile (one program per tile, or persistent with the loop's loads software-pipelined over
  `num_stages`), and rows read as boxes by the tensor memory accelerator into a pipeline of
  shared-memory buffers, to tell the row kernels' plan from what a read-only kernel reaches.

  With `--graph` the merge configurations are timed from CUDA graphs (`perf.graph_time_ms`,
  one program per tile only).
* order: graph-timed merges with the rows in the operands' order against head-major rows.
* floor: graph-timed diagnostics of the merges furthest under the copy (a Triton copy beside
  torch's; partials as views a power of two apart, padded views, separate allocations).
* layout: the automatic merge with vLLM's lses against contiguous ones (the rows' order).

    python benchmarks/pieces_probe.py --out DIR [--parts merge,host,lse,layout,floor,order] [--budget-s 540]

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
from anysoftmax.backends._triton_common.merge_states import MergePlan, merge_launcher
from anysoftmax.bench.lse_merge import MERGE_D, MERGE_HEADS, MERGE_K, MERGE_TOKENS, _copy_us, _graph_copy_us
from anysoftmax.bench.lse_merge import merge_sets as bench_merge_sets
from anysoftmax.testing.compare import compare_merge
from anysoftmax.core.lse_merge import MergeSpec
from anysoftmax.perf import back_to_back_us, graph_rotation_count, graph_time_ms, rotation_count, time_ms, warm_up

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


def probe_merge(f, deadline, graph=False, persistent_too=True):
    """Configurations of the merge per bench shape against the copy, timed by `time_ms` (one
    launch after an L2 flush) or, with `graph`, by `graph_time_ms` (calls replayed back to
    back from a CUDA graph: the kernel's own time, launch gaps out)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    summary = []
    for k, d, tokens in itertools.product(MERGE_K, MERGE_D, MERGE_TOKENS):
        if time.time() > deadline:
            break
        rows_n = tokens * MERGE_HEADS
        nbytes = (k + 1) * (rows_n * d * 2 + rows_n * 4)
        if graph:
            sets = bench_merge_sets(tokens, MERGE_HEADS, d, k, torch.bfloat16, "cuda", graph_rotation_count(nbytes))
            copy = _graph_copy_us(nbytes, "cuda", len(sets))
            timed = lambda fn: graph_time_ms(fn, sets, "cuda") * 1e3  # noqa: E731
        else:
            sets = merge_sets(tokens, d, k, rotation_count(nbytes))
            copy = _copy_us(nbytes, "cuda", time_ms, KW)
            timed = lambda fn: time_ms(fn, sets, "cuda", **KW) * 1e3  # noqa: E731
        spec = MergeSpec.from_tensors(*sets[0])
        auto = timed(lambda s: anysoftmax.merge_states(*s))
        best = ("auto", auto)
        bd = min(triton.next_power_of_2(d), 256)
        for br, warps, persistent in itertools.product([1, 2, 4, 8, 16, 32], [1, 2, 4, 8],
                                                       [True, False] if persistent_too else [False]):
            per_thread = br * bd / (32 * warps)
            if not 2 <= per_thread <= 64 or br > triton.next_power_of_2(rows_n):
                continue
            tiles = math.ceil(rows_n / br) * math.ceil(d / bd)
            plan = MergePlan(br, bd, min(tiles, sms * 8) if persistent else tiles, num_warps=warps)
            run = merge_launcher(spec, lambda *_a, p=plan: p)
            try:
                ok = compare_merge(*run(*sets[0], None, None), *sets[0], device="cuda").ok
                us = timed(lambda s: run(*s, None, None))
            except Exception as exc:  # a configuration that does not compile or launch is a row
                emit(f, dict(part="merge", K=k, D=d, tokens=tokens, br=br, warps=warps, persistent=persistent,
                             error=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            emit(f, dict(part="merge", K=k, D=d, tokens=tokens, br=br, warps=warps, persistent=persistent,
                         grid=plan.grid, us=round(us, 3), copy_us=round(copy, 3), frac=round(copy / us, 3), ok=ok,
                         timing="graph" if graph else "do_bench"))
            if ok and us < best[1]:
                best = (f"br={br} warps={warps} {'persistent' if persistent else 'all tiles'}", us)
        line = dict(part="merge_best", K=k, D=d, tokens=tokens, copy_us=round(copy, 3), auto_us=round(auto, 3),
                    auto_frac=round(copy / auto, 3), best=best[0], best_us=round(best[1], 3),
                    best_frac=round(copy / best[1], 3), timing="graph" if graph else "do_bench")
        emit(f, line)
        summary.append(line)
        print(json.dumps(line), flush=True)
        del sets
    return summary


@triton.jit
def probe_copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def probe_floor(f):
    """Graph-timed diagnostics of the merges furthest under the copy: (1) torch's copy against a
    Triton copy of the same bytes (is the small merges' gap a Triton kernel's start-up?), (2) a
    merge whose partials are views of one buffer (a power-of-two distance apart, as the bench's
    sets), separate allocations, or views a few pages off a power of two (do K streams at one
    power-of-two distance collide in the memory's channels?)."""
    for k, d, tokens in [(2, 64, 1), (8, 64, 1), (2, 128, 128), (8, 64, 128), (8, 64, 1024), (8, 128, 128)]:
        rows_n = tokens * MERGE_HEADS
        nbytes = (k + 1) * (rows_n * d * 2 + rows_n * 4)
        n_sets = graph_rotation_count(nbytes)
        half = max(nbytes // 2 // 4, 1)
        src = torch.ones(n_sets, half, device="cuda")
        dst = torch.empty(half, device="cuda")
        row = dict(part="floor", K=k, D=d, tokens=tokens,
                   torch_copy_us=graph_time_ms(lambda s: dst.copy_(s), list(src), "cuda") * 1e3)
        for block in (256, 1024, 4096):
            row[f"triton_copy_{block}_us"] = graph_time_ms(
                lambda s, b=block: probe_copy_kernel[(triton.cdiv(half, b),)](s, dst, half, BLOCK=b), list(src),
                "cuda") * 1e3
        del src
        views = bench_merge_sets(tokens, MERGE_HEADS, d, k, torch.bfloat16, "cuda", n_sets)
        row["merge_views_us"] = graph_time_ms(lambda s: anysoftmax.merge_states(*s), views, "cuda") * 1e3
        del views
        pad = 3 * 4096 // 2  # elements: three 4 KB pages
        per = rows_n * d
        big = torch.randn(n_sets * k * (per + pad), device="cuda", dtype=torch.bfloat16)
        lse_big = torch.randn(n_sets, k, MERGE_HEADS, tokens, device="cuda")
        padded = [([big[(i * k + j) * (per + pad):(i * k + j) * (per + pad) + per].view(tokens, MERGE_HEADS, d)
                    for j in range(k)], [lse_big[i, j].t() for j in range(k)]) for i in range(n_sets)]
        row["merge_padded_views_us"] = graph_time_ms(lambda s: anysoftmax.merge_states(*s), padded, "cuda") * 1e3
        del padded, big
        n_sep = min(n_sets, 512)
        sep = merge_sets(tokens, d, k, n_sep)
        row["merge_separate_us"] = graph_time_ms(lambda s: anysoftmax.merge_states(*s), sep, "cuda") * 1e3
        row["separate_sets"] = n_sep
        del sep
        row = {k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in row.items()}
        emit(f, row)
        print(json.dumps(row), flush=True)


def probe_order(f):
    """Graph-timed: vLLM-layout merges with the rows in the operands' order (the kernel's: a
    tile's rows adjacent heads of one token, adjacent in the partials) against rows numbered
    head-major (a tile's rows one head's consecutive tokens: lse sectors shared in a tile)."""
    from anysoftmax.backends._triton_common import merge_states as merge_module

    operand_order = merge_module._row_args

    def head_major(outputs, lses, out, lse_out, lead):
        l0 = lses[0]
        if lead == 2 and l0.shape[0] > 1 and l0.shape[1] > 1 and l0.stride(0) < l0.stride(1):
            outputs, lses = [t.transpose(0, 1) for t in outputs[:1]], [l0.transpose(0, 1)]
            out, lse_out = out.transpose(0, 1), lse_out.transpose(0, 1)
        return operand_order(outputs, lses, out, lse_out, lead)

    for k, d, tokens in [(2, 64, 1), (2, 64, 128), (2, 64, 1024), (2, 128, 1024), (8, 64, 16), (8, 64, 128),
                         (8, 64, 1024), (8, 128, 128), (8, 256, 128), (2, 256, 8192)]:
        rows_n = tokens * MERGE_HEADS
        nbytes = (k + 1) * (rows_n * d * 2 + rows_n * 4)
        sets = bench_merge_sets(tokens, MERGE_HEADS, d, k, torch.bfloat16, "cuda", graph_rotation_count(nbytes))
        row = dict(part="merge_order", K=k, D=d, tokens=tokens, copy_us=_graph_copy_us(nbytes, "cuda", len(sets)))
        for name, fn in (("head_major", head_major), ("token_major", operand_order)):
            merge_module._row_args = fn
            anysoftmax.refresh()
            ok = compare_merge(*anysoftmax.merge_states(*sets[0]), *sets[0], device="cuda").ok
            row[f"{name}_us"] = graph_time_ms(lambda s: anysoftmax.merge_states(*s), sets, "cuda") * 1e3
            row[f"{name}_ok"] = ok
        merge_module._row_args = operand_order
        anysoftmax.refresh()
        row = {k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in row.items()}
        emit(f, row)
        print(json.dumps(row), flush=True)
        del sets


def probe_layout(f):
    """The automatic merge with vLLM's [heads, tokens] lses (rows numbered head-major: a tile's
    rows are one head's tokens, its partial rows scattered by heads x D) against contiguous
    [tokens, heads] lses (rows token-major: a tile's partial rows adjacent): does the order the
    rows are read in cost bandwidth at the K = 8 shapes under 0.85 of copy?"""
    for k, d, tokens in itertools.product([2, 8], [64, 128], [128, 1024]):
        rows_n = tokens * MERGE_HEADS
        nbytes = (k + 1) * (rows_n * d * 2 + rows_n * 4)
        copy = _copy_us(nbytes, "cuda", time_ms, KW)
        for layout in ("vllm", "contiguous"):
            sets = merge_sets(tokens, d, k, rotation_count(nbytes))
            if layout == "contiguous":
                sets = [(outs, [torch.randn(tokens, MERGE_HEADS, device="cuda") * 3 for _ in range(k)])
                        for outs, _ in sets]
            ok = compare_merge(*anysoftmax.merge_states(*sets[0]), *sets[0], device="cuda").ok
            us = time_ms(lambda s: anysoftmax.merge_states(*s), sets, "cuda", **KW) * 1e3
            row = dict(part="merge_layout", K=k, D=d, tokens=tokens, lses=layout, us=round(us, 3),
                       copy_us=round(copy, 3), frac=round(copy / us, 3), ok=ok)
            emit(f, row)
            print(json.dumps(row), flush=True)
            del sets


def probe_host(f, rounds=5):
    """Host microseconds per call, back to back, median of `rounds` rounds that alternate the
    launchers: the whole calls, and the merge's parts (request key, eager check, dispatch, the
    bound launcher, allocation, a TVM-FFI call with 1 and 18 CUDA tensors) to find its cost."""
    import statistics

    from anysoftmax import dispatch
    from anysoftmax.core.request import MERGE, request_key
    from anysoftmax.torchop.lse_merge import plain_states

    x = torch.randn(16, 1024, device="cuda")
    sets = {k: merge_sets(1, 128, k, 1)[0] for k in (2, 8)}
    src = torch.randn(32 * 128, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    fixed = {"torch.copy_ 8 KB": lambda: dst.copy_(src), "torch.softmax 16x1024": lambda: torch.softmax(x, -1),
             "torch.empty_like x2": lambda: (torch.empty_like(src), torch.empty_like(src))}
    try:
        import tvm_ffi

        nop = tvm_ffi.get_global_func("testing.nop")
        many = [*sets[8][0], *sets[8][1], dst, src]
        fixed.update({"tvm_ffi nop(1 CUDA tensor)": lambda: nop(src), "tvm_ffi nop(18 CUDA tensors)": lambda: nop(*many),
                      "18 data_ptr()": lambda: [t.data_ptr() for t in many]})
    except Exception as exc:  # (apache-tvm-ffi not installed: the launchers' comparison still runs)
        emit(f, dict(part="host", what="tvm_ffi", error=str(exc)))
    for k, (outs, lses) in sets.items():
        fixed[f"merge K={k}: request key"] = lambda o=outs, l=lses: request_key(MERGE, o, l, None, None, False, None,
                                                                               None, None)
        fixed[f"merge K={k}: plain_states"] = lambda o=outs, l=lses: plain_states(o, l)
    times: dict[str, list] = {}
    for _ in range(rounds):
        for name, call in fixed.items():
            times.setdefault(name, []).append(back_to_back_us(call, "cuda"))
        for which in ("triton", "native"):
            native_launch.LAUNCHER = which
            anysoftmax.refresh()
            calls = {"softmax 16x1024": lambda: anysoftmax.softmax(x, -1),
                     "logsumexp 16x1024": lambda: anysoftmax.logsumexp(x, -1)}
            for k, (outs, lses) in sets.items():
                anysoftmax.merge_states(outs, lses)  # (binds the request)
                hit = dispatch._memo.get(request_key(MERGE, outs, lses, None, None, False, None, None, None))[0]
                out, lse = torch.empty_like(outs[0]), torch.empty(lses[0].shape, device="cuda")
                calls.update({f"merge K={k} 1x32x128": lambda o=outs, l=lses: anysoftmax.merge_states(o, l),
                              f"merge K={k}: dispatch": lambda o=outs, l=lses: dispatch.merge_states(o, l),
                              f"merge K={k}: bound launcher": lambda o=outs, l=lses, h=hit: h(o, l, None, None),
                              f"merge K={k}: bound launcher, outputs given":
                                  lambda o=outs, l=lses, h=hit, y=out, z=lse: h(o, l, y, z)})
            for name, call in calls.items():
                times.setdefault(f"{name} ({which})", []).append(back_to_back_us(call, "cuda"))
    native_launch.LAUNCHER = native_launch.choose(None)
    anysoftmax.refresh()
    for name, us in times.items():
        med = statistics.median(us)
        emit(f, dict(part="host", what=name, us=round(med, 2), rounds=[round(u, 2) for u in us]))
        print(f"host {name}: {med:.2f} us (rounds {', '.join(f'{u:.1f}' for u in us)})", flush=True)
    for which in ("triton", "native"):
        native_launch.LAUNCHER = which
        anysoftmax.refresh()
        outs, lses = sets[8]
        anysoftmax.merge_states(outs, lses)
        profile(f, f"merge_states K=8 1x32x128 ({which})", lambda: anysoftmax.merge_states(outs, lses))
    native_launch.LAUNCHER = native_launch.choose(None)
    anysoftmax.refresh()


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
    ap.add_argument("--graph", action="store_true", help="merge: time from CUDA graphs (graph_time_ms)")
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
        if "layout" in parts:
            probe_layout(f)
        if "floor" in parts:
            probe_floor(f)
        if "order" in parts:
            probe_order(f)
        if "lse" in parts:
            probe_lse(f, deadline - (240 if "merge" in parts else 0), a.lse_kernels.split(","))
        if "merge" in parts:
            probe_merge(f, deadline, graph=a.graph, persistent_too=not a.graph)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
