"""The pieces benchmark: `anysoftmax.logsumexp` and `anysoftmax.merge_states` against torch
eager, torch.compile and the same-bytes copy, each result checked against the float64
reference before it is timed.

    python -m anysoftmax.bench.lse_merge                  # the H100 run: ~5 minutes
    python -m anysoftmax.bench.lse_merge --quick          # a few shapes
    python -m anysoftmax.bench.lse_merge --device cpu     # tiny shapes through the interpreter (the path only)

* logsumexp over rows [M, N] (the softmax grid's shapes, bf16 and fp32): `anysoftmax` (the
  automatic choice), `anysoftmax:<backend>` for every backend that runs it here (what
  `anysoftmax select` writes the selection table's `lse` rules from), `torch` (`torch.logsumexp`), `torch.compile` (of the same call) and `copy`: a device copy
  of the bytes logsumexp must move (read x, write one float32 per row).
* merge_states of K = 2 and 8 partials [tokens, 32 heads, head_size 64/128/256] (bf16) with
  float32 LSEs, tokens 1..8192: `anysoftmax`, `vllm-dropin` (`compat.vllm.merge_attn_states`,
  K = 2, in place), `torch` (the formula in eager torch ops), `torch.compile` (of that
  formula) and `copy` (K partials and LSEs read, one output and LSE written).

Each row: median device time (`us`, `triton.testing.do_bench`, L2 flushed, inputs rotated),
GB/s of the op's own bytes, `frac_of_copy` (the copy's time over the op's), and `host_us`: wall
time per call issued back to back (dispatch-bound merges show there), the best of `HOST_ROUNDS`
rounds in which a cell's providers take turns (the host's clocks and other processes move one
round by microseconds, alike for every provider of it; `host_us_rounds` keeps them all). Merge rows on a GPU also
carry `graph_us` and `graph_frac_of_copy`: the device time per call of calls replayed back to
back from a CUDA graph (`perf.graph_time_ms`, inputs rotated past the L2), against the copy
timed alike; a decode step's merges run that way, and there the host no longer shows. Results:
<out>/<device>/pieces_logsumexp.{json,png} and pieces_merge.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

LSE_GRID = [(32768, 128), (32768, 1024), (16384, 4096), (8192, 16384), (2048, 65536), (512, 262144),
            (64, 1048576), (8, 1048576), (4823, 781)]
LSE_QUICK = [(32768, 1024), (2048, 65536), (8, 1048576)]
MERGE_TOKENS = [1, 16, 128, 1024, 8192]
MERGE_HEADS = 32
MERGE_D = [64, 128, 256]
HOST_ROUNDS = 5  # rounds of back-to-back calls per cell (the best is `host_us`)
MERGE_K = [2, 8]
CPU_LSE = [(8, 64), (3, 300)]
CPU_MERGE = dict(tokens=[1, 5], d=[16], k=[2, 3], heads=2)


def _timing(device):
    from ..perf import back_to_back_us, rotation_count, time_ms

    cpu = device.type == "cpu"
    kw = dict(warmup_ms=1, rep_ms=5) if cpu else dict(warmup_ms=10, rep_ms=50)
    return time_ms, back_to_back_us, rotation_count, kw, (20 if cpu else 200)


def _copy_us(nbytes: int, device, time_ms, kw) -> float:
    import torch

    half = max(nbytes // 2 // 4, 1)
    src = torch.ones(half, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return time_ms(lambda s: dst.copy_(s), [src], device, **kw) * 1e3


def _copy_gbps(device) -> float:
    from ..perf import copy_bandwidth_gbps

    return round(copy_bandwidth_gbps(device), 1)


def _host_rounds(timed: list, b2b, device, calls: int) -> None:
    """Set each timed row's `host_us_rounds` (`HOST_ROUNDS` rounds, the providers of a cell
    taking turns within each) and `host_us`, their best; a provider whose call fails is marked
    failed. `timed`: (row, call) pairs."""
    for row, _ in timed:
        row["host_us_rounds"] = []
    for _ in range(HOST_ROUNDS):
        for row, call in timed:
            if row["status"] == "failed":
                continue
            try:
                row["host_us_rounds"].append(round(b2b(call, device, calls), 2))
            except Exception as exc:  # a provider that fails is a row, not the end of the run
                row.update(status="failed", detail=f"{type(exc).__name__}: {exc}")
    for row, _ in timed:
        row["host_us"] = min(row["host_us_rounds"]) if row["host_us_rounds"] else None


def _row(provider, what, us, nbytes, copy_us, host_us=None, err="", status="ok", graph=(None, None)):
    gbps = nbytes / (us * 1e-6) / 1e9 if us else 0.0
    graph_us, copy_graph_us = graph
    timed_graph = {} if graph_us is None else dict(graph_us=round(graph_us, 3),
                                                   graph_frac_of_copy=round(copy_graph_us / graph_us, 3))
    return dict(provider=provider, **what, us=round(us, 3), gbps=round(gbps, 1),
                frac_of_copy=round(copy_us / us, 3) if us else 0.0, **timed_graph,
                host_us=None if host_us is None else round(host_us, 2), status=status, detail=err)


def _lse_backends(x) -> list[str]:
    """The backends that run logsumexp on `x` here (each timed as `anysoftmax:<name>`: the rows
    `anysoftmax select` writes the table's `lse` rules from)."""
    from ..core.lse_merge import LOGSUMEXP, logsumexp_request
    from ..core.registry import runners

    return runners(logsumexp_request(x, -1)[0], LOGSUMEXP)


def bench_logsumexp(shapes, dtypes, device, compiled: bool) -> list[dict]:
    import torch

    import anysoftmax
    from ..testing.compare import compare_logsumexp
    from ..core.lse_merge import logsumexp_request
    from ..matrix.providers import fresh_compiled

    time_ms, b2b, rotation_count, kw, calls = _timing(device)
    rows = []
    for dtype in dtypes:
        for m, n in shapes:
            what = dict(op="logsumexp", dtype=str(dtype).removeprefix("torch."), M=m, N=n, dim=-1)
            nbytes = m * n * dtype.itemsize + m * 4
            xs = [torch.randn(m, n, device=device, dtype=dtype) for _ in range(rotation_count(nbytes))]
            copy_us = _copy_us(nbytes, device, time_ms, kw)
            rows.append(_row("copy", what, copy_us, nbytes, copy_us))
            sub = xs[0][:256]  # checked on up to 256 rows (the float64 reference of them all is large)
            providers = []
            for backend in [None, *_lse_backends(xs[0])]:
                fn = (lambda b: lambda t: anysoftmax.logsumexp(t, -1, backend=b))(backend)
                check = compare_logsumexp(fn(xs[0]).unsqueeze(-1)[:256], sub, logsumexp_request(sub, -1)[0], device=device)
                providers.append(("anysoftmax" if backend is None else f"anysoftmax:{backend}", fn, check))
            providers.append(("torch", lambda t: torch.logsumexp(t, -1), None))
            if compiled:
                providers.append(("torch.compile", fresh_compiled(lambda t: torch.logsumexp(t, -1)), None))
            timed = []
            for name, fn, check in providers:
                try:
                    us = time_ms(fn, xs, device, **kw) * 1e3
                    ok = check is None or check.ok
                    rows.append(_row(name, what, us, nbytes, copy_us, None, "" if ok else check.detail,
                                     "ok" if ok else "wrong"))
                    timed.append((rows[-1], lambda fn=fn: fn(xs[0])))
                except Exception as exc:  # a provider that fails is a row, not the end of the run
                    rows.append(_row(name, what, 0.0, nbytes, copy_us, None, f"{type(exc).__name__}: {exc}",
                                     "failed"))
            _host_rounds(timed, b2b, device, calls)
            print(" ".join(f"{r['provider']}={r['frac_of_copy']}" for r in rows[-len(providers) - 1:]),
                  what, flush=True)
            del xs
    return rows


def merge_sets(tokens, heads, d, k, dtype, device, n) -> list[tuple[list, list]]:
    """`n` input sets of a merge: K partials [tokens, heads, d] and K lses in vLLM's layout
    ([heads, tokens] read as [tokens, heads]), views into two buffers (one allocation each, a
    set at a 16-byte-aligned offset: every set is the same request)."""
    import torch

    o = torch.randn(n, k, tokens, heads, d, device=device, dtype=dtype)
    lse = torch.randn(n, k, heads, tokens, device=device) * 3
    return [([o[i, j] for j in range(k)], [lse[i, j].t() for j in range(k)]) for i in range(n)]


def _graph_copy_us(nbytes: int, device, n_sets: int) -> float:
    import torch

    from ..perf import graph_time_ms

    half = max(nbytes // 2 // 4, 1)
    src = torch.ones(n_sets, half, dtype=torch.float32, device=device)
    dst = torch.empty(half, dtype=torch.float32, device=device)
    return graph_time_ms(lambda s: dst.copy_(s), list(src), device) * 1e3


def bench_merge(tokens_list, d_list, k_list, heads, dtype, device, compiled: bool) -> list[dict]:
    """Rows of merge_states and its peers. On a GPU each is also timed from a CUDA graph of
    back-to-back calls (`graph_us`, `graph_frac_of_copy` against the copy timed alike): the
    device time of a merge in a decode step replayed from a graph, where `us` (one launch
    after an L2 flush) also holds the host's time once that exceeds the flush."""
    import torch

    import anysoftmax
    from ..compat.vllm import merge_attn_states
    from ..testing.compare import compare_merge
    from ..matrix.lse_merge_cells import torch_merge
    from ..matrix.providers import fresh_compiled
    from ..perf import graph_rotation_count, graph_time_ms

    time_ms, b2b, rotation_count, kw, calls = _timing(device)
    graphs = device.type == "cuda"
    rows = []
    for k in k_list:
        for d in d_list:
            for tokens in tokens_list:
                what = dict(op="merge_states", dtype=str(dtype).removeprefix("torch."), K=k, tokens=tokens,
                            heads=heads, D=d)
                part = tokens * heads * d * dtype.itemsize + tokens * heads * 4
                nbytes = (k + 1) * part
                n_sets = graph_rotation_count(nbytes) if graphs else rotation_count(nbytes)
                all_sets = merge_sets(tokens, heads, d, k, dtype, device, n_sets)
                sets = all_sets[:rotation_count(nbytes)]
                copy_us = _copy_us(nbytes, device, time_ms, kw)
                copy_graph_us = _graph_copy_us(nbytes, device, n_sets) if graphs else None
                rows.append(_row("copy", what, copy_us, nbytes, copy_us, graph=(copy_graph_us, copy_graph_us)))
                out, lse = anysoftmax.merge_states(*sets[0])
                check = compare_merge(out, lse, *sets[0], device=device)
                providers = [("anysoftmax", lambda s: anysoftmax.merge_states(*s), check)]
                if k == 2:
                    dst = torch.empty(tokens, heads, d, device=device, dtype=dtype)
                    dst_lse = torch.empty(heads, tokens, device=device)
                    merge_attn_states(dst, sets[0][0][0], sets[0][1][0].t(), sets[0][0][1], sets[0][1][1].t(), dst_lse)
                    check_v = compare_merge(dst, dst_lse.t(), *sets[0], device=device)
                    providers.append(("vllm-dropin", lambda s: merge_attn_states(
                        dst, s[0][0], s[1][0].t(), s[0][1], s[1][1].t(), dst_lse), check_v))
                providers.append(("torch", lambda s: torch_merge(*s), None))
                if compiled:
                    formula_c = fresh_compiled(torch_merge)
                    providers.append(("torch.compile", lambda s: formula_c(*s), None))
                timed = []
                for name, fn, chk in providers:
                    try:
                        us = time_ms(fn, sets, device, **kw) * 1e3
                        graph_us = graph_time_ms(fn, all_sets, device) * 1e3 if graphs else None
                        ok = chk is None or chk.ok
                        rows.append(_row(name, what, us, nbytes, copy_us, None, "" if ok else chk.detail,
                                         "ok" if ok else "wrong", graph=(graph_us, copy_graph_us)))
                        timed.append((rows[-1], lambda fn=fn: fn(sets[0])))
                    except Exception as exc:
                        rows.append(_row(name, what, 0.0, nbytes, copy_us, None, f"{type(exc).__name__}: {exc}",
                                         "failed"))
                _host_rounds(timed, b2b, device, calls)
                print(" ".join(f"{r['provider']}={r['frac_of_copy']}|{r.get('graph_frac_of_copy')}/{r['host_us']}us"
                               for r in rows[-len(providers) - 1:]), what, flush=True)
                del sets, all_sets
    return rows


def plot(rows: list[dict], path: Path, x: str, panels: list[tuple]) -> None:
    """A fraction of copy against `x` (log scale), one panel per (title, row filter[, the row's
    key: `frac_of_copy` unless named]), a line per provider (nothing without matplotlib: the
    JSON holds every number)."""
    try:
        import matplotlib
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'anysoftmax[plot]')")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, where, *key) in zip(axes[0], panels):
        key = key[0] if key else "frac_of_copy"
        sel = [r for r in rows if all(r.get(k) == v for k, v in where.items()) and r["status"] == "ok"
               and r.get(key) is not None]
        for prov in dict.fromkeys(r["provider"] for r in sel):
            pts = sorted((r[x], r[key]) for r in sel if r["provider"] == prov)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov)
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(x)
        ax.set_ylabel("fraction of same-bytes copy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m anysoftmax.bench.lse_merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--ops", default="logsumexp,merge_states")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    import torch

    from ..perf import warm_up
    from .report import gpu_dir_name

    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU; --device cpu runs tiny shapes through the interpreter", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    device_name = torch.cuda.get_device_name(device) if not cpu else "cpu"
    name = gpu_dir_name(device_name)
    out_dir = Path(args.out) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    warm_up(device)
    compiled = not args.no_compile and not cpu
    ops = set(args.ops.split(","))
    meta = dict(device=device_name, torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if "logsumexp" in ops:
        t0 = time.time()
        shapes = CPU_LSE if cpu else LSE_QUICK if args.quick else LSE_GRID
        rows = bench_logsumexp(shapes, [torch.bfloat16, torch.float32], device, compiled)
        # `direction: lse`: `anysoftmax select` reads the anysoftmax:<backend> rows as the table's lse rules.
        (out_dir / "pieces_logsumexp.json").write_text(json.dumps(dict(meta, direction="lse", copy_gbps=_copy_gbps(device),
                                                                       seconds=round(time.time() - t0), results=rows),
                                                                  indent=1))
        plot(rows, out_dir / "pieces_logsumexp.png", "N", [(f"logsumexp {d}", dict(dtype=d))
                                                            for d in ("bfloat16", "float32")])
    if "merge_states" in ops:
        t0 = time.time()
        if cpu:
            rows = bench_merge(CPU_MERGE["tokens"], CPU_MERGE["d"], CPU_MERGE["k"], CPU_MERGE["heads"],
                               torch.bfloat16, device, False)
        else:
            tokens = [1, 1024, 8192] if args.quick else MERGE_TOKENS
            rows = bench_merge(tokens, MERGE_D, MERGE_K, MERGE_HEADS, torch.bfloat16, device, compiled)
        (out_dir / "pieces_merge.json").write_text(json.dumps(dict(meta, seconds=round(time.time() - t0),
                                                                   results=rows), indent=1))
        ks = CPU_MERGE["k"] if cpu else MERGE_K
        ds = CPU_MERGE["d"] if cpu else [128]
        panels = [(f"merge_states K={k} D={d} bf16", dict(K=k, D=d)) for k in ks for d in ds]
        if not cpu:
            panels += [(f"{t} (CUDA graph)", w, "graph_frac_of_copy") for t, w in panels]
        plot(rows, out_dir / "pieces_merge.png", "tokens", panels)
    print(f"results in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
