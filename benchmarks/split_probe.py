"""Candidates for the `triton` backend's split rows (rows too long for one program), measured
side by side on the GPU at hand, forward and backward, so that one run says which to ship.

A candidate is a named set of tuning overrides (`CANDIDATES`; `heuristics.override`, as
`anysoftmax.bench.tune_triton` uses it): the forms of the cooperative launch (prefetch,
relaxed departure, 16-bit chunks held as loaded, the pipelined item loop in N stages;
`rows.softmax_split_kernel`), chunk bytes, warps, chunks per SM. On a GPU each candidate's
compiled kernel is reported (registers, shared memory, cp.async count; a stagesN candidate
whose kernel this Triton did not pipeline is marked NOT PIPELINED). `cute` (the cluster
kernels) joins where its backend runs. Each
(candidate, shape, dtype, direction) is checked against the float64 reference
(`anysoftmax.testing.compare`, fresh random data, the seed printed) and timed with
`triton.testing.do_bench` (median, input sets rotated so that L2 never holds them), beside the
copy of the same bytes (forward: read x, write y; backward: read y and dy, write dx) and the
1 GiB copy. The kernels of every candidate are compiled first by `--jobs` worker processes
(Triton's disk cache then serves the timing process). Results: DIR/split_probe.json (written
after every cell), DIR/split_probe.txt (the detail lines); the summary table on stdout.

    python3 benchmarks/split_probe.py --out DIR [--candidates base,prefetch,...] [--shapes 512x262144,...]
        [--dtypes float32,bfloat16] [--directions fwd,bwd] [--jobs 12] [--budget-s 280] [--rep-ms 20]
    python3 benchmarks/split_probe.py --list            # the candidates and their overrides

Nsight Compute: `bash benchmarks/split_ncu.sh DIR` runs this script with `--ncu` under ncu (one
launch per candidate, dtype and direction between cudaProfilerStart/Stop, labels in
DIR/split_ncu_labels.json) and summarises the report with `--ncu-summary CSV --labels JSON`.
`--device cpu` runs the whole flow through the Triton interpreter on tiny shapes (`--tiny`:
long-row thresholds lowered), which is how its test checks it without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The shapes: LLM vocabularies (128K-262K) and long rows, many rows to one.
SHAPES = ["2048x65536", "1024x131072", "512x262144", "128x151936", "128x128256", "64x1048576", "32x262144",
          "16x151936", "8x131072", "4x262144", "1x262144", "1x128256"]

_FORMS = dict(split_prefetch=True, split_relaxed_depart=True, bwd_split_prefetch=True, bwd_split_relaxed_depart=True)


def _staged(stages: int, chunk_kib: int = 16, warps: int | None = None) -> dict:
    """The pipelined item loop (split_stages): `stages` stages, forward chunks of `chunk_kib` KiB
    (the backward's, which hold y and dy, half that), `warps` warps per program (None: the
    table's by chunk width)."""
    over = dict(split_stages=stages, bwd_split_stages=stages)
    if chunk_kib != 16:
        over.update(split_chunk_bytes=chunk_kib << 10, bwd_split_chunk_bytes=chunk_kib << 9)
    if warps is not None:
        over.update(split_warps_by_chunk=[[32768, warps]], bwd_split_warps_by_chunk=[[32768, warps]])
    return over


# name -> tuning overrides (forward keys act on the forward only, bwd_* on the backward only).
CANDIDATES = {
    "base": {},  # the table as it stands
    "relaxed": dict(split_relaxed_depart=True, bwd_split_relaxed_depart=True),
    "prefetch": dict(_FORMS),
    # the prefetch with the default's acq_rel departure (which waits for the prefetched load)
    "prefetch_acqrel": dict(split_prefetch=True, bwd_split_prefetch=True),
    # two chunks held: half-size chunks keep the registers (and programs per SM) of today
    "prefetch_small": dict(_FORMS, split_chunk_bytes=8192, bwd_split_chunk_bytes=4096),
    # the same chunks on twice the warps
    "prefetch_8w": dict(_FORMS, split_warps_by_chunk=[[32768, 8]], bwd_split_warps_by_chunk=[[32768, 8]]),
    # 16-bit chunks held as loaded across the barrier (forward, 16-bit x only)
    "prefetch_hold": dict(_FORMS, split_hold_input_16bit=True),
    # few rows: more, smaller chunks so that the rows spread over every SM
    "prefetch_wide": dict(_FORMS, split_items_per_sm=8, split_min_chunk_elems=1024),
    # not in the default list: the two-launch form, for reference
    "two_launch": dict(cooperative=False),
    # The pipelined item loop (rows.softmax_split_kernel STAGES): the next items' chunks copied
    # into shared memory while a program waits at its barrier. Two stages issue the next copy
    # after the store and wait for it first thing in the next item (no overlap within a
    # program): the control that prices the shared-memory path and the barrier's call alone.
    "stages2": _staged(2),
    "stages3": _staged(3),
    "stages3_8w": _staged(3, warps=8),
    "stages3_32k": _staged(3, 32, warps=4),
    "stages3_32k_8w": _staged(3, 32, warps=8),
    "stages4": _staged(4),
    "stages4_8w": _staged(4, warps=8),
}
# (the register prefetch, candidates prefetch*, lost everywhere on the H200: still selectable)
DEFAULT_CANDIDATES = ["base", "stages2", "stages3", "stages3_8w", "stages3_32k", "stages3_32k_8w", "stages4",
                      "stages4_8w", "cute"]
# --tiny (the CPU run): rows of a few hundred elements take the split kernels.
TINY = dict(max_tile_elems=64, split_chunk_bytes=256, bwd_max_tile_bytes=64, bwd_split_chunk_bytes=256)
# Forward: >= 0.95 of the same-bytes copy; backward: >= 0.92 (where that copy reaches >= 0.85 of
# the 1 GiB copy); 1-32 rows of 128K-262K: GPU time <= 1.3x the same-bytes copy's.
GOALS = {"fwd": 0.95, "bwd": 0.92}


def parse_shape(text: str) -> tuple[int, int]:
    m, n = text.lower().split("x")
    return int(m), int(n)


def overrides(name: str, tiny: bool) -> dict:
    return {**(TINY if tiny else {}), **CANDIDATES[name]}


# ---- one request ----------------------------------------------------------------------------

def make_inputs(m: int, n: int, dtype, direction: str, device: str, sets: int, gen) -> list[tuple]:
    """`sets` input tuples: (x,) forward, (y, dy) backward (y a softmax output)."""
    import torch

    out = []
    for _ in range(sets):
        x = (torch.randn(m, n, device=device, generator=gen) * 3).to(dtype)
        if direction == "fwd":
            out.append((x,))
        else:
            out.append((torch.softmax(x.float(), -1).to(dtype), torch.randn(m, n, device=device, generator=gen).to(dtype)))
    return out


def op_for(backend: str, direction: str):
    """The call timed: anysoftmax's softmax (forward) or softmax_backward over the last dim."""
    import anysoftmax

    if direction == "fwd":
        return lambda x: anysoftmax.softmax(x, -1, backend=backend)
    return lambda y, dy: anysoftmax.softmax_backward(y, dy, -1, backend=backend)


def copy_for(direction: str):
    """The same bytes moved by torch: read x, write y; read y and dy, write dx."""
    import torch

    if direction == "fwd":
        return lambda x: x.clone()
    return lambda y, dy: torch.add(y, dy)


def check(backend: str, direction: str, inputs: tuple, device: str):
    """(ok, detail) of one call against the float64 reference."""
    from anysoftmax.core import SoftmaxSpec
    from anysoftmax.testing.compare import compare, compare_backward

    out = op_for(backend, direction)(*inputs)
    if direction == "fwd":
        r = compare(out, inputs[0], SoftmaxSpec.from_tensor(inputs[0], -1), device=device)
    else:
        y, dy = inputs
        r = compare_backward(out, y, dy, SoftmaxSpec.from_tensor(y, -1), device=device)
    return r.ok, ("" if r.ok else r.detail[:160]), r.max_abs_err


def plan_info(inputs: tuple, direction: str) -> dict:
    """The triton plan of this request and its compiled kernel's registers and spills (the
    backend's internals; {} where they cannot be read, which changes no measurement)."""
    try:
        from dataclasses import replace

        import anysoftmax
        from anysoftmax.backends._triton_common import softmax_launchers as request
        from anysoftmax.backends._triton_common.launcher import scratch_maker
        from anysoftmax.core import SoftmaxSpec

        backend = anysoftmax.get_backend("triton")
        t = inputs[0]
        spec = SoftmaxSpec.from_tensor(t, -1)
        if direction == "fwd":
            x, y, layout, _ = request.forward_layout(t, spec)
            plan = backend.plan(x, y, layout, spec)
            given = (x, y, None, None, None, None)
        else:
            y = t.contiguous()
            layout, _ = request.backward_layout(y, spec)
            dx = y.new_empty(y.shape)
            plan = backend.plan(y, dx, layout, spec, backward=True)
            given = (y, inputs[1], dx, None, None, None, None)
        stages = plan.options.get("stages", 1)
        info = dict(kind=plan.kind, chunk=plan.block_n, chunks=plan.chunks, grid=plan.grid,
                    cooperative=plan.cooperative, warps=plan.options.get("num_warps"),
                    forms=sorted(k for k in ("prefetch", "relaxed_depart", "hold_input") if plan.options.get(k))
                    + ([f"stages{stages}"] if stages > 1 else []))
    except Exception as exc:  # (the plan is reported when it can be; a failure here measures on)
        return dict(plan_error=f"{type(exc).__name__}: {str(exc)[:120]}")
    if t.device.type != "cuda":
        return info  # (interpreted: no compiled kernel)
    try:
        stats, counts = scratch_maker(replace(plan, cooperative=False), layout, t.dtype)(t.device)
        kernel, args, meta = plan.calls(plan.tensors(given), layout, False, t.dtype, stats, counts)[0]
        compiled = kernel.warmup(*args, grid=(1,), **meta, **plan.launch_options())  # (compiled: the cache's)
        compiled._init_handles()
        info["regs"] = int(compiled.n_regs)
        # shared memory per program, and the async copies of a pipelined loop (0 where this
        # Triton did not pipeline it: the form then runs as the plain kernel plus its call)
        info["shared"] = int(compiled.metadata.shared)
        ptx = compiled.asm.get("ptx", "") if isinstance(getattr(compiled, "asm", None), dict) else ""
        info["cp_async"] = ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global")
        spills = getattr(compiled, "n_spills", None)
        if spills is None and "cubin" in getattr(compiled, "asm", {}):
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from helpers.cubin import resources  # (the test suite's cubin reader)

            spills = resources(compiled.asm["cubin"]).frame_bytes  # (stack frame bytes: spills)
        info["spills"] = spills
    except Exception as exc:
        info["kernel_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return info


def same_plan_key(info: dict):
    keys = ("kind", "chunk", "chunks", "grid", "cooperative", "warps", "forms")
    return None if "plan_error" in info or "kind" not in info else tuple(str(info[k]) for k in keys)


# ---- compiling ahead, in parallel -------------------------------------------------------------

def _compile_one(task) -> tuple:
    """Worker: run one (candidate, shape, dtype, direction) once on zeros, so Triton compiles its
    kernels into the disk cache the timing process reads."""
    name, shape, dname, direction, tiny, device = task
    t0 = time.perf_counter()
    try:
        import torch

        from anysoftmax.backends.triton import heuristics

        m, n = parse_shape(shape)
        dtype = getattr(torch, dname)
        inputs = (torch.zeros(m, n, dtype=dtype, device=device),) if direction == "fwd" else \
            (torch.full((m, n), 1.0 / n, dtype=dtype, device=device), torch.zeros(m, n, dtype=dtype, device=device))
        with heuristics.override(**overrides(name, tiny)):
            op_for("triton", direction)(*inputs)
        torch.cuda.synchronize() if device == "cuda" else None
        return task, time.perf_counter() - t0, None
    except Exception as exc:
        return task, time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc)[:200]}"


def _worker_init():
    # Triton's launcher in the workers: the native one would build its extension in each.
    os.environ["ANYSOFTMAX_LAUNCHER"] = "triton"


def precompile(tasks: list, jobs: int, limit_s: float, log) -> None:
    """Compile every task's kernels in `jobs` spawned processes, for at most `limit_s` seconds
    (what is left compiles in the timing process, as it would anyway)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    if jobs <= 0 or not tasks:
        return
    t0 = time.perf_counter()
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init)
    futures = [pool.submit(_compile_one, t) for t in tasks]
    done, errors = 0, []
    try:
        for f in cf.as_completed(futures, timeout=limit_s):
            task, _, err = f.result()
            done += 1
            if err:
                errors.append((task, err))
    except cf.TimeoutError:
        log(f"precompile: {limit_s:.0f} s limit reached, {done} of {len(tasks)} compiled; the rest compiles as it runs")
    except Exception as exc:  # (a worker that died: the timing process compiles what is left)
        log(f"precompile stopped: {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    log(f"precompile: {done} of {len(tasks)} requests in {time.perf_counter() - t0:.0f} s on {jobs} processes"
        + (f"; {len(errors)} failed, first: {errors[0]}" if errors else ""))


# ---- the measurement ------------------------------------------------------------------------

def cute_reason(device: str) -> str | None:
    """None when the cute backend runs here, else why it is skipped."""
    if device != "cuda":
        return "cute runs on CUDA GPUs only"
    try:
        import anysoftmax
        import anysoftmax.backends.cute  # noqa: F401
    except Exception as exc:
        return f"import anysoftmax.backends.cute failed: {type(exc).__name__}: {exc}"
    status = {s.name: s for s in anysoftmax.list_backends()}.get("cute")
    if status is None or not status.available:
        return f"cute backend not available: {getattr(status, 'reason', 'not registered')}"
    return None


def measure(args, log) -> dict:
    import torch

    import anysoftmax
    from anysoftmax import perf
    from anysoftmax.backends.triton import heuristics

    t_start = time.perf_counter()  # (the budget counts from here: compiling ahead included)
    device = args.device
    seed = args.seed if args.seed is not None else int(time.time()) % (2**31)
    gen = torch.Generator(device=device).manual_seed(seed)
    dev_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    large = perf.copy_bandwidth_gbps(device)
    names = [c for c in args.candidates.split(",") if c]
    unknown = [c for c in names if c != "cute" and c not in CANDIDATES]
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}; known: {', '.join(CANDIDATES)}, cute")
    cute_skip = cute_reason(device) if "cute" in names else None
    if cute_skip:
        log(f"cute skipped: {cute_skip}")
        names = [c for c in names if c != "cute"]
    import triton

    doc = dict(device=dev_name, torch=torch.__version__, triton=triton.__version__, seed=seed,
               large_copy_gbps=large, candidates={c: CANDIDATES.get(c, "backend=cute") for c in names},
               cute_skipped=cute_skip, rows=[])
    log(f"{dev_name}: 1 GiB copy {large:.0f} GB/s; torch {torch.__version__}, triton {triton.__version__}; seed {seed}")
    cells = [(s, d, r) for s in args.shapes.split(",") for d in args.dtypes.split(",") for r in args.directions.split(",")]
    triton_names = [c for c in names if c != "cute"]
    jobs = args.jobs if args.jobs is not None else (min(12, max((os.cpu_count() or 2) - 2, 1)) if device == "cuda" else 0)
    precompile([(c, s, d, r, args.tiny, device) for s, d, r in cells for c in triton_names], jobs,
               min(args.precompile_s, 0.5 * args.budget_s), log)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    def over_budget() -> bool:
        return time.perf_counter() - t_start > args.budget_s

    timing = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    # Triton candidates for every cell first, then cute: a budget cut leaves out the reference last.
    for phase in (triton_names, ["cute"] if "cute" in names else []):
        for shape, dname, direction in cells:
            if not phase:
                break
            m, n = parse_shape(shape)
            dtype = getattr(torch, dname)
            per_set = (2 if direction == "fwd" else 3) * m * n * dtype.itemsize
            if over_budget():
                doc["rows"] += [dict(shape=shape, dtype=dname, direction=direction, candidate=c, skipped="budget")
                                for c in phase]
                continue
            sets = make_inputs(m, n, dtype, direction, device, perf.rotation_count(per_set), gen)
            base = dict(shape=shape, dtype=dname, direction=direction, bytes=per_set)
            copy = [r for r in _rows(doc, shape, dname, direction) if r["candidate"] == "copy" and r.get("ok")]
            if not copy:  # (the cell's first phase times the copy)
                copy_ms = perf.time_ms(lambda a: copy_for(direction)(*a), sets, device, **timing)
                copy = [dict(base, candidate="copy", ok=True, us=copy_ms * 1e3,
                             frac_large=per_set / (copy_ms * 1e-3) / 1e9 / large)]
                doc["rows"].append(copy[0])
            copy_us = copy[0]["us"]
            seen: dict = {}
            for name in phase:
                if over_budget():
                    doc["rows"].append(dict(base, candidate=name, skipped="budget"))
                    continue
                row = dict(base, candidate=name)
                backend = "cute" if name == "cute" else "triton"
                t0, key = time.perf_counter(), None
                try:
                    with heuristics.override(**({} if name == "cute" else overrides(name, args.tiny))):
                        info = plan_info(sets[0], direction) if backend == "triton" else {}
                        key = same_plan_key(info)
                        if key is not None and key in seen:
                            row.update({k: v for k, v in seen[key].items() if k not in ("candidate", "wall_s")},
                                       same_as=seen[key]["candidate"], **info)
                            doc["rows"].append(row)
                            continue
                        if any(f.startswith("stages") for f in info.get("forms", [])) and info.get("cp_async") == 0:
                            log(f"{name} {shape} {_short(dname)} {direction}: NOT PIPELINED (no cp.async in the "
                                f"compiled kernel; shared {info.get('shared')}, regs {info.get('regs')})")
                        ok, detail, err = check(backend, direction, sets[0], device)
                        row.update(info, ok=ok, detail=detail, max_abs_err=err)
                        if ok:
                            ms = perf.time_ms(lambda a: op_for(backend, direction)(*a), sets, device, **timing)
                            row.update(us=ms * 1e3, frac_same=copy_us / (ms * 1e3),
                                       frac_large=per_set / (ms * 1e-3) / 1e9 / large)
                except Exception as exc:  # a candidate that fails to compile or run is a result too
                    row.update(ok=False, error=True, detail=f"{type(exc).__name__}: {str(exc)[:200]}")
                row["wall_s"] = round(time.perf_counter() - t0, 2)
                doc["rows"].append(row)
                if key is not None and key not in seen:
                    seen[key] = row
            del sets
            log(cell_line(doc, shape, dname, direction))
            (out_dir / "split_probe.json").write_text(json.dumps(doc, indent=1))
    doc["measure_s"] = round(time.perf_counter() - t_start, 1)
    (out_dir / "split_probe.json").write_text(json.dumps(doc, indent=1))
    (out_dir / "split_probe.txt").write_text("\n".join(detail_lines(doc)) + "\n")
    return doc


# ---- reports --------------------------------------------------------------------------------

def _rows(doc, shape, dname, direction):
    return [r for r in doc["rows"] if (r["shape"], r["dtype"], r["direction"]) == (shape, dname, direction)]


def _short(dname: str) -> str:
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}.get(dname, dname)


def cell_line(doc, shape, dname, direction) -> str:
    """One progress line: each candidate's fraction of the same-bytes copy."""
    rows = _rows(doc, shape, dname, direction)
    parts = []
    for r in rows:
        if r["candidate"] == "copy":
            parts.insert(0, f"copy {r['us']:.0f}us ({r['frac_large']:.2f} of 1GiB)")
        else:
            parts.append(f"{r['candidate']} {_cell(r)}")
    return f"{shape} {_short(dname)} {direction}: " + ", ".join(parts)


def _abbrev(name: str) -> str:
    """A candidate's column label (7 characters at most)."""
    short = name.replace("prefetch", "pf").replace("relaxed", "relax").replace("_small", "_sm").replace("two_launch", "2launch")
    short = short.replace("stages", "st").replace("_32k", "L")
    return short[:7]


def _cell(r: dict) -> str:
    if r.get("skipped"):
        return "skip"
    if not r.get("ok"):
        return "ERR" if r.get("error") else "WRONG"
    return f"{r['frac_same']:.2f}"


def kernel_lines(doc) -> list[str]:
    """Each triton candidate's compiled kernel per dtype and direction (its first shape): chunk,
    warps, grid, registers, shared memory, cp.async count; a pipelined form (stagesN) whose
    kernel holds no cp.async is marked NOT PIPELINED."""
    out, seen = [], set()
    for r in doc["rows"]:
        key = (r["candidate"], r["dtype"], r["direction"])
        if r["candidate"] in ("copy", "cute") or key in seen or "regs" not in r:
            continue
        seen.add(key)
        staged = any(f.startswith("stages") for f in r.get("forms") or [])
        flag = "  NOT PIPELINED" if staged and not r.get("cp_async") else ""
        out.append(f"  {r['candidate']:16}{_short(r['dtype']):5}{r['direction']:4} {r['shape']}: "
                   f"chunk {r.get('chunk')}, {r.get('warps')} warps, grid {r.get('grid')}, regs {r.get('regs')}, "
                   f"spills {r.get('spills')}, "
                   f"shared {r.get('shared')}, cp.async {r.get('cp_async')}{flag}")
    return out


def detail_lines(doc) -> list[str]:
    """Every row: fraction of the same-bytes copy, of the 1 GiB copy, GPU us, plan and kernel."""
    lines = [f"{doc['device']}  1 GiB copy {doc['large_copy_gbps']:.0f} GB/s  seed {doc['seed']}",
             "shape dtype dir candidate: same-bytes / 1GiB / us | plan: chunk x chunks, warps, grid, forms | regs, spills"]
    for r in doc["rows"]:
        head = f"{r['shape']} {_short(r['dtype'])} {r['direction']} {r['candidate']}"
        if r.get("skipped"):
            lines.append(f"{head}: skipped ({r['skipped']})")
            continue
        if r["candidate"] == "copy":
            lines.append(f"{head}: {r['frac_large']:.3f} of 1GiB, {r['us']:.1f} us")
            continue
        plan = (f" | {r.get('chunk')} x {r.get('chunks')}, {r.get('warps')} warps, grid {r.get('grid')}, "
                f"{'+'.join(r.get('forms') or []) or '-'} | regs {r.get('regs')}, spills {r.get('spills')}, "
                f"shared {r.get('shared')}, cp.async {r.get('cp_async')}"
                if "kind" in r else (f" | {r['plan_error']}" if "plan_error" in r else ""))
        same = f" (plan of {r['same_as']})" if r.get("same_as") else ""
        if r.get("ok"):
            lines.append(f"{head}: {r['frac_same']:.3f} / {r['frac_large']:.3f} / {r['us']:.1f} us{same}{plan}")
        else:
            lines.append(f"{head}: FAILED {r.get('detail', '')}{plan}")
    return lines


def summary_lines(doc, misses: bool = False) -> list[str]:
    """The table (fraction of the same-bytes copy per candidate, the best starred), each
    candidate's geometric mean and goals missed, and per dtype and direction the candidate with
    the best geometric mean that is nowhere more than 3 % slower than `base`; with `misses`,
    only the shapes each candidate misses its goal at."""
    cands = [c for c in dict.fromkeys(r["candidate"] for r in doc["rows"]) if c != "copy"]
    cells = list(dict.fromkeys((r["shape"], r["dtype"], r["direction"]) for r in doc["rows"]))
    width = 8
    out = [f"fraction of the same-bytes copy ({doc['device']}; copy/1G: the same-bytes copy's fraction of the 1 GiB "
           f"copy; *: best; WRONG: failed the reference check; ERR: did not run; columns: "
           + ", ".join(f"{_abbrev(c)}={c}" for c in cands if _abbrev(c) != c) + ")",
           f"{'shape':12}{'dt':5}{'dir':4}{'copy/1G':>8} " + "".join(f"{_abbrev(c):>{width}}" for c in cands)
           + "   best: of 1 GiB, us"]
    for shape, dname, direction in cells:
        rows = {r["candidate"]: r for r in _rows(doc, shape, dname, direction)}
        copy = rows.get("copy")
        ok = [r for c, r in rows.items() if c != "copy" and r.get("ok")]
        best = max(ok, key=lambda r: r["frac_same"]) if ok else None
        line = f"{shape:12}{_short(dname):5}{direction:4}{(copy['frac_large'] if copy else float('nan')):8.2f} "
        for c in cands:
            r = rows.get(c)
            text = "-" if r is None else _cell(r) + ("*" if r is best else "")
            line += f"{text:>{width}}"
        out.append(line + (f"   {best['frac_large']:.2f} {best['us']:9.1f}" if best else "   -"))
    out.append("")
    out.append("geometric mean of the fraction, and goals missed (fwd < 0.95, bwd < 0.92 where the same-bytes copy "
               "reaches >= 0.85 of 1 GiB; 1-32 rows: > 1.3x the copy's time; which: split_probe_summary.txt):")
    groups = list(dict.fromkeys((d, r) for _, d, r in cells))
    missed_lines = []
    for c in cands:
        parts = []
        for dname, direction in groups:
            fr, missed = [], []
            for shape, d2, r2 in cells:
                if (d2, r2) != (dname, direction):
                    continue
                rows = {r["candidate"]: r for r in _rows(doc, shape, d2, r2)}
                r, copy = rows.get(c), rows.get("copy")
                if r is None or r.get("skipped") or copy is None:
                    continue
                if not r.get("ok"):
                    missed.append(f"{shape}:{_cell(r)}")
                    continue
                fr.append(r["frac_same"])
                if parse_shape(shape)[0] <= 32:
                    if r["frac_same"] < 1 / 1.3:
                        missed.append(f"{shape}:{r['frac_same']:.2f}")
                elif copy["frac_large"] >= 0.85 and r["frac_same"] < GOALS[direction]:
                    missed.append(f"{shape}:{r['frac_same']:.2f}")
            if fr:
                gm = math.exp(sum(map(math.log, fr)) / len(fr))
                parts.append(f"{_short(dname)} {direction} {gm:.3f} ({len(missed)})")
                missed_lines.append(f"  {c} {_short(dname)} {direction}: " + " ".join(missed))
        out.append(f"  {c:16}" + " | ".join(parts))
    if misses:
        return missed_lines
    kernels = kernel_lines(doc)
    if kernels:
        out += ["", "compiled kernels (registers per thread, shared memory per program in bytes):"] + kernels
    out.append("")
    out.append("choice per dtype and direction (best geometric mean among candidates never > 3% slower than base):")
    for dname in dict.fromkeys(d for _, d, _ in cells):
        for direction in dict.fromkeys(r for _, _, r in cells):
            scores = []
            for c in cands:
                if c == "cute":
                    continue
                fr, worst = [], 0.0
                for shape, d2, r2 in cells:
                    if (d2, r2) != (dname, direction):
                        continue
                    rows = {r["candidate"]: r for r in _rows(doc, shape, d2, r2)}
                    r, b = rows.get(c), rows.get("base")
                    if r is None or r.get("skipped"):
                        continue
                    if not r.get("ok"):
                        fr = []
                        break
                    fr.append(r["frac_same"])
                    if b is not None and b.get("ok"):
                        worst = max(worst, r["us"] / b["us"] - 1)
                if fr:
                    scores.append((math.exp(sum(map(math.log, fr)) / len(fr)), worst, c))
            safe = [s for s in scores if s[1] <= 0.03]
            if scores:
                top = max(scores)
                pick = max(safe) if safe else None
                out.append(f"  {_short(dname):5}{direction:4} best {top[2]} ({top[0]:.3f}, worst vs base "
                           f"+{100 * top[1]:.0f}%); safe: " + (f"{pick[2]} ({pick[0]:.3f})" if pick else "none"))
    return out


# ---- Nsight Compute -------------------------------------------------------------------------

def ncu_run(args, log) -> None:
    """One launch per (candidate, dtype, direction) between cudaProfilerStart/Stop, each after
    an L2 flush and a warm-up call outside the range; the labels in launch order go to
    DIR/split_ncu_labels.json."""
    import torch

    from anysoftmax.backends.triton import heuristics

    names = [c for c in args.candidates.split(",") if c]
    if "cute" in names and cute_reason("cuda"):
        log(f"cute skipped: {cute_reason('cuda')}")
        names.remove("cute")
    gen = torch.Generator(device="cuda").manual_seed(args.seed or 0)
    runs = []
    for shape in args.shapes.split(","):
        m, n = parse_shape(shape)
        for dname in args.dtypes.split(","):
            for direction in args.directions.split(","):
                inputs = make_inputs(m, n, getattr(torch, dname), direction, "cuda", 1, gen)[0]
                for name in names:
                    backend = "cute" if name == "cute" else "triton"
                    over = {} if name == "cute" else overrides(name, False)
                    with heuristics.override(**over):
                        op_for(backend, direction)(*inputs)  # compile, bind
                        info = plan_info(inputs, direction) if backend == "triton" else {}
                    runs.append((dict(candidate=name, shape=shape, dtype=dname, direction=direction, **info),
                                 backend, over, inputs))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, backend, over, inputs in runs:
        flush.zero_()
        with heuristics.override(**over):
            op_for(backend, label["direction"])(*inputs)
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "split_ncu_labels.json").write_text(json.dumps([r[0] for r in runs], indent=1))
    log(f"profiled {len(runs)} calls: " + ", ".join(f"{r[0]['candidate']}/{_short(r[0]['dtype'])}/{r[0]['direction']}"
                                                  for r in runs))


STALL = "smsp__average_warps_issue_stalled_"


def ncu_summary(csv_path: str, labels_path: str | None) -> list[str]:
    """The profiled kernels of `ncu --page raw --csv` (one row each, in launch order) with their
    labels: time, DRAM throughput, achieved occupancy, registers, local memory, top stalls."""
    import csv

    with open(csv_path, newline="") as f:
        table = list(csv.DictReader(line for line in f if not line.startswith("==")))
    units = next((r for r in table if not (r.get("ID") or "").strip()), {})  # (the row under the names)
    rows = [r for r in table if (r.get("ID") or "").strip().isdigit()]
    labels = json.loads(Path(labels_path).read_text()) if labels_path else []
    out = [f"{len(rows)} kernels profiled" + ("" if len(rows) == len(labels) else
                                             f" (labels: {len(labels)}; names shown where they differ)")]
    scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "byte": 1.0, "Kbyte": 1e3,
             "Mbyte": 1e6, "Gbyte": 1e9}

    def num(r, key):
        """The value in base units (ns, bytes) whatever unit ncu printed it in."""
        try:
            return float(str(r.get(key, "")).replace(",", "")) * scale.get((units.get(key) or "").strip(), 1.0)
        except ValueError:
            return None

    for i, r in enumerate(rows):
        lab = labels[i] if i < len(labels) and len(rows) == len(labels) else {}
        name = r.get("Kernel Name", "?")[:40]
        head = (f"{lab['candidate']} {lab['shape']} {_short(lab['dtype'])} {lab['direction']}" if lab else name)
        t = num(r, "gpu__time_duration.sum")
        dram = num(r, "dram__throughput.avg.pct_of_peak_sustained_elapsed")
        rd, wr = num(r, "dram__bytes_read.sum"), num(r, "dram__bytes_write.sum")
        occ = num(r, "sm__warps_active.avg.pct_of_peak_sustained_active")
        theo = num(r, "sm__maximum_warps_per_active_cycle_pct")
        regs = num(r, "launch__registers_per_thread")
        grid = num(r, "launch__grid_size")
        # (LaunchStats and Occupancy sections: dynamic shared memory and the blocks per SM each
        # resource allows, where this ncu names them so)
        smem = num(r, "launch__shared_mem_per_block_dynamic")
        limits = {k: num(r, f"launch__occupancy_limit_{k}") for k in ("registers", "shared_mem", "warps")}
        local = {k: v for k, v in r.items() if ("local" in k or "spill" in k) and num(r, k)}
        stalls = sorted(((num(r, k) or 0.0, k[len(STALL):].replace("_per_issue_active.ratio", ""))
                         for k in r if k.startswith(STALL) and "not_selected" not in k and "_selected" not in k),
                        reverse=True)
        line = f"{head}: "
        line += f"{t / 1e3:.1f} us, " if t is not None and t > 1e3 else (f"{t} ns, " if t is not None else "")
        line += f"DRAM {dram:.1f}% of peak" if dram is not None else "DRAM ?"
        if rd is not None and wr is not None and t:
            line += f" ({(rd + wr) / t:.0f} GB/s)"
        line += f", warps active {occ:.1f}%" if occ is not None else ""
        line += f" (theoretical {theo:.1f}%)" if theo is not None else ""
        line += f", {regs:.0f} regs" if regs is not None else ""
        line += f", grid {grid:.0f}" if grid is not None else ""
        line += f", shared {smem:.0f} B" if smem else ""
        if any(v is not None for v in limits.values()):
            line += " (blocks/SM by " + ", ".join(f"{k} {v:.0f}" for k, v in limits.items() if v is not None) + ")"
        line += ", local memory: " + (", ".join(f"{k}={v}" for k, v in local.items()) if local else "none")
        line += "; stalls/issue: " + ", ".join(f"{k} {v:.2f}" for v, k in stalls[:4])
        out.append(line)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES))
    p.add_argument("--shapes", default=",".join(SHAPES), help="MxN,... (rows x row length, softmax over rows)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--directions", default="fwd,bwd")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes compiling ahead (0: none; default on a GPU: the cores less two, at most 12)")
    p.add_argument("--precompile-s", type=float, default=120.0, help="at most this long (and half the budget)")
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="nothing new is measured after this many seconds (compiling ahead included)")
    p.add_argument("--warmup-ms", type=float, default=5.0)
    p.add_argument("--rep-ms", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="lower the long-row thresholds (tiny shapes take the split)")
    p.add_argument("--list", action="store_true", help="print the candidates and exit")
    p.add_argument("--ncu", action="store_true", help="profile mode (run under ncu: benchmarks/split_ncu.sh)")
    p.add_argument("--ncu-summary", metavar="CSV", help="summarise `ncu --page raw --csv` output")
    p.add_argument("--labels", help="with --ncu-summary: the labels --ncu wrote")
    args = p.parse_args(argv)

    def log(text: str) -> None:
        print(text, flush=True)

    if args.list:
        for name, over in CANDIDATES.items():
            log(f"{name:16} {over}")
        log(f"{'cute':16} backend='cute' (where it runs)")
        return 0
    if args.ncu_summary:
        for line in ncu_summary(args.ncu_summary, args.labels):
            log(line)
        return 0
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("split_probe: no CUDA GPU visible (torch.cuda.is_available() is False); "
                             "`--device cpu --tiny` runs the same flow through the Triton interpreter")
    # Device times do not depend on the launcher; the native one would first build its extension.
    os.environ.setdefault("ANYSOFTMAX_LAUNCHER", "triton")
    sys.path.insert(0, str(ROOT))
    if args.ncu:
        ncu_run(args, log)
        return 0
    doc = measure(args, log)
    log("")
    for line in summary_lines(doc):
        log(line)
    (Path(args.out) / "split_probe_summary.txt").write_text("\n".join(summary_lines(doc) + ["", "goals missed:"]
                                                                      + summary_lines(doc, misses=True)) + "\n")
    log(f"(detail: {Path(args.out) / 'split_probe.txt'}; {doc['measure_s']} s from the start of measuring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
