"""Compile the shared kernels for GPUs this machine does not have (no device needed).

Triton compiles ahead of time from a signature: `compile_call` turns one launch that the
backends would make (kernel, positional args, constexprs; tensors may live on the CPU) into a
signature and compiles it for a `GPUTarget` such as Hopper (cuda, 90) or CDNA3 (hip, gfx942).
The result carries the register and shared-memory counts the occupancy model consumes.

`compile_launch` does the same through the JIT's own argument binder, so the kernel gets the
specialization a real `kernel[grid](...)` launch gives it (16-divisible integers and aligned
pointers, integers equal to 1 folded to constants, AMD's 32-bit pointer ranges): the register
counts are those of the kernel that would run, not of a less specialized variant.

Run as a script (`python tests/backends/triton/compile_targets.py [--targets sm_90,gfx942]`) in a process
WITHOUT TRITON_INTERPRET: for each target it plans the launches the `triton` backend makes for
a set of shapes (its own heuristics and tuning table, with the target's SM count), compiles
every kernel of those launches, reads the real register counts out of the binaries (cuobjdump
on the cubin for CUDA, the amdgcn assembly's metadata for HIP) and applies the occupancy model.
It prints one JSON document; failures are recorded in it, not raised. tests/backends/triton/test_compile_targets.py
runs it and checks the document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/, as a script
from helpers.gpus import A100_SXM, H100_SXM, MI300X  # noqa: E402

TARGETS = {
    "sm_90": GPUTarget("cuda", 90, 32),
    "sm_80": GPUTarget("cuda", 80, 32),
    "gfx942": GPUTarget("hip", "gfx942", 64),
}

# Registers per thread a kernel may use: 255 on NVIDIA; 512 VGPRs per lane on gfx942
# (256 general + 256 accumulation, one unified file).
REG_LIMIT = {"sm_90": 255, "sm_80": 255, "gfx942": 512}

_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                 torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8"}


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TRITON_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type kernel argument {value!r}")


def compile_call(kernel, args: tuple, constexprs: dict, target: str, options: dict | None = None):
    """Compile `kernel(*args, **constexprs)` for `target` (a key of TARGETS)."""
    fn = kernel  # a JITFunction: compile in a process without TRITON_INTERPRET
    names = [p.name for p in fn.params if not p.is_constexpr]
    signature = {name: _arg_type(v) for name, v in zip(names, args)}
    signature.update({name: "constexpr" for name in constexprs})
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v
                                                                            for k, v in constexprs.items()})
    return triton.compile(src, target=TARGETS[target], options=options or {})


def compile_launch(kernel, args: tuple, constexprs: dict, target: str, options: dict | None = None):
    """Compile `kernel[grid](*args, **constexprs, **options)` for `target` exactly as the launch
    would: the JIT's binder computes the signature, constants and specialization attributes.

    Returns (compiled, how): how is "jit-binder", or "plain-signature" where this Triton's JIT
    internals differ (then `compile_call`, without the launch's specialization).
    """
    try:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError:
        create_function_from_signature = None
    if create_function_from_signature is None or not hasattr(kernel, "_pack_args"):
        return compile_call(kernel, args, constexprs, target, options), "plain-signature"
    backend = make_backend(TARGETS[target])
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {**constexprs, **(options or {})}
    bound, specialization, opts = binder(*args, **kwargs)
    opts, signature, consts, attrs = kernel._pack_args(backend, kwargs, bound, specialization, opts)
    src = triton.compiler.ASTSource(kernel, signature, consts, attrs)
    return triton.compile(src, target=TARGETS[target], options=opts.__dict__), "jit-binder"


# --- register counts out of the binaries ---------------------------------------------------

def _cuobjdump() -> str:
    try:
        from triton import knobs
        path = knobs.nvidia.cuobjdump.path
    except (ImportError, AttributeError):  # older Triton: the binary it ships
        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return path


def cuda_resources(compiled) -> dict:
    """Registers per thread and static shared memory of a CUDA kernel, from its cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
        path = f.name
    try:
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", path], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(path)
    fields = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out))
    if "REG" not in fields:
        raise RuntimeError(f"no REG:NN in cuobjdump output:\n{out}")
    get = lambda key: int(fields[key]) if key in fields else None
    # STACK > 0 at 255 registers: the kernel spills to local memory.
    return dict(n_regs=get("REG"), stack=get("STACK"), local=get("LOCAL"), static_shared=get("SHARED"))


def hardware_programs_per_sm(dev, res: dict, shared: int, num_warps: int) -> int:
    """Resident programs by the hardware's own allocation rules, for comparison with the model
    (which divides raw register counts): CUDA allocates registers per warp in units of 256
    (per-thread counts rounded up to 8) and holds at most 32 blocks per SM; on CDNA the
    compiler's occupancy (waves per SIMD, VGPRs in granules of 8) is the limit, a workgroup's
    waves spread over the CU's 4 SIMDs."""
    if dev.is_hip:
        per_simd = res.get("compiler_waves_per_simd")
        if per_simd is None:
            return 0
        occ = per_simd // -(-num_warps // 4)
    else:
        regs_per_warp = -(-res["n_regs"] * dev.warp_size // 256) * 256
        occ = min(dev.max_num_regs // (regs_per_warp * num_warps),
                  dev.max_threads_per_sm // (dev.warp_size * num_warps), 32)
    if shared > 0:
        # what the SM (CU) holds for all its programs, less the hardware's reserve per program
        # (CUDA sm_80+: 1 KiB each; cudaDevAttrReservedSharedMemoryPerBlock)
        occ = min(occ, (dev.shared_mem_per_sm or dev.max_shared_mem) // (shared + dev.reserved_shared_per_program))
    return occ


def _asm_int(asm: str, pattern: str) -> int | None:
    m = re.search(pattern, asm, re.MULTILINE)
    return int(m.group(1)) if m else None


def hip_resources(compiled) -> dict:
    """VGPRs per lane of an AMD kernel, from its amdgcn assembly.

    `n_regs` is the code object's `.vgpr_count` (what hipFuncGetAttribute(NUM_REGS) reports, and
    so what the backend feeds the model on a real MI300X); on gfx90a/gfx942 it counts the
    accumulation VGPRs too (the unified 512-entry file). The compiler's own occupancy estimate
    (waves per SIMD) is kept for comparison with the model.
    """
    asm = compiled.asm["amdgcn"]
    info = dict(vgprs=_asm_int(asm, r"^\s*;\s*NumVgprs:\s*(\d+)"),
                agprs=_asm_int(asm, r"^\s*;\s*NumAgprs:\s*(\d+)"),
                total_vgprs=_asm_int(asm, r"^\s*;\s*TotalNumVgprs:\s*(\d+)"),
                sgprs=_asm_int(asm, r"^\s*\.sgpr_count:\s*(\d+)"),
                scratch=_asm_int(asm, r"^\s*;\s*ScratchSize:\s*(\d+)"),
                compiler_waves_per_simd=_asm_int(asm, r"^\s*;\s*Occupancy:\s*(\d+)"))
    n_regs = _asm_int(asm, r"^\s*\.vgpr_count:\s*(\d+)")
    if n_regs is None:
        n_regs = info["total_vgprs"] if info["total_vgprs"] is not None else info["vgprs"]
    if n_regs is None:
        raise RuntimeError("no .vgpr_count / NumVgprs in the amdgcn assembly")
    return dict(info, n_regs=n_regs)


def staged_loads(compiled) -> dict:
    """What Triton's software pipeliner made of an NVIDIA kernel's loads (`rows.softmax_split_kernel`
    STAGES): the tensors copied ahead into shared memory (`ttg.async_copy_global_to_local` in
    the TTGIR: "dtype[shape]" each, in the kernel and in the functions it calls), the loads
    through L2 (.cg: the split kernels' statistics, which other programs write before the
    barrier) in the kernel and in called functions, the PTX's cp.async and ld.global.cg
    instructions in the kernel's own body (`.entry`), and the shared memory its called functions
    (`.func`s) touch (Triton before 3.9 places a callee's shared memory at offset 0, over the
    caller's: triton-lang/triton#11267)."""
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    out = dict(async_copies=[], async_copies_in_calls=0, cg_loads=0, cg_loads_in_calls=0)
    in_kernel = False
    for line in ttgir.splitlines():
        head = re.match(r"\s*tt\.func\s+(public|private)?", line)
        if head:
            in_kernel = head.group(1) != "private"
            continue
        if "ttg.async_copy_global_to_local" in line:
            m = re.search(r":\s*tensor<([0-9x]+)x!tt\.ptr<(\w+)>", line)
            if in_kernel:
                out["async_copies"].append(f"{m.group(2)}[{m.group(1).replace('x', ',')}]" if m else line.strip()[:80])
            else:
                out["async_copies_in_calls"] += 1
        if "tt.load" in line and re.search(r"cache_?[mM]odifier = cg", line):
            out["cg_loads" if in_kernel else "cg_loads_in_calls"] += 1
    entry = re.search(r"\.entry\s.*?(?=^\.(?:visible\s+)?\.?func\b|\Z)", ptx, re.S | re.M)
    body = entry.group(0) if entry else ptx
    out["cp_async"] = len(re.findall(r"\bcp\.async\.c[ag]\.shared\.global", body))
    out["ptx_cg_loads"] = len(re.findall(r"\bld\.global\.cg\b", body))
    calls = re.findall(r"^\.func\b.*?^}", ptx[entry.end():] if entry else "", re.S | re.M)
    out["calls_shared"] = sum(len(re.findall(r"\.shared\b|global_smem", f)) for f in calls)
    return out


# --- the launches the `triton` backend plans --------------------------------------------------

SPLIT_FORMS = dict(split_prefetch=True, split_relaxed_depart=True, split_hold_input_16bit=True, bwd_split_prefetch=True,
                   bwd_split_relaxed_depart=True)

# The pipelined item loop (rows.softmax_split_kernel STAGES): three stages, alone and (fused)
# with the forms it combines with (not prefetch, which it replaces), and two stages (one chunk
# copied ahead, waited for at the top of the next item). AMD plans drop it (the backend's
# draft_plan).
STAGED_FORMS = dict(split_stages=3, bwd_split_stages=3, split_relaxed_depart=True, split_hold_input_16bit=True,
                    bwd_split_relaxed_depart=True)
STAGED_CASES = ("split_stages", "fused_split_stages", "bwd_split_stages", "split_stages2", "bwd_split_stages2")

# (case, shape, reduced dim, log, backward, tuning overrides, kind the backend should choose).
# Shapes are those of the tuning table's notes: a row on chip, long rows (split; online when
# the table says so), reductions over dim 0 in one tile and in cooperative chunks.
CASES = [
    ("tile", (64, 1024), 1, False, False, {}, "tile"),
    ("tile_log", (64, 1024), 1, True, False, {}, "tile"),
    ("online", (64, 65536), 1, False, False, {"long_rows": "online"}, "online"),
    ("split", (128, 65536), 1, False, False, {}, "split"),
    ("cols", (1024, 8192), 0, False, False, {}, "cols"),
    ("cols_split", (8192, 8192), 0, False, False, {}, "cols_split"),
    ("bwd_tile", (64, 1024), 1, False, True, {}, "tile"),
    ("bwd_split", (128, 65536), 1, False, True, {}, "split"),
    # The fused family (core.variant): attention-shaped scores with every step compiled in.
    ("fused_tile", (2, 4, 128, 1024), 3, False, False, {}, "tile"),
    ("fused_split", (1, 2, 64, 65536), 3, True, False, {}, "split"),
    ("fused_online", (1, 2, 64, 65536), 3, False, False, {"long_rows": "online"}, "online"),
    ("fused_cols", (1024, 8192), 0, False, False, {}, "cols"),
    ("fused_cols_split", (8192, 8192), 0, False, False, {}, "cols_split"),
    ("fused_bwd_tile", (2, 4, 128, 1024), 3, False, True, {}, "tile"),
    ("fused_bwd_split", (1, 2, 64, 65536), 3, False, True, {}, "split"),
    # A tensor scale, one value per row (per-request temperatures), with softcap.
    ("row_scale_tile", (64, 1024), 1, False, False, {}, "tile"),
    ("row_scale_split", (128, 65536), 1, True, False, {}, "split"),
    # The cooperative split kernels' forms of their one launch (tuning.yaml), every one on.
    ("split_forms", (128, 65536), 1, False, False, SPLIT_FORMS, "split"),
    ("fused_split_forms", (1, 2, 64, 65536), 3, True, False, SPLIT_FORMS, "split"),
    ("bwd_split_forms", (128, 65536), 1, False, True, SPLIT_FORMS, "split"),
    ("split_stages", (128, 65536), 1, False, False, dict(split_stages=3, bwd_split_stages=3), "split"),
    ("fused_split_stages", (1, 2, 64, 65536), 3, True, False, STAGED_FORMS, "split"),
    ("bwd_split_stages", (128, 65536), 1, False, True, dict(split_stages=3, bwd_split_stages=3), "split"),
    ("split_stages2", (128, 65536), 1, False, False, dict(split_stages=2), "split"),
    ("bwd_split_stages2", (128, 65536), 1, False, True, dict(bwd_split_stages=2), "split"),
]


def fused_kwargs(case: str, shape: tuple, dim: int) -> dict | None:
    """The fused keywords of a `fused_*` case (meta tensors: only dtypes and strides matter):
    a bool mask broadcast over heads, causal where the dim is the last, sinks, softcap, scale;
    of a `row_scale_*` case: a float32 scale per row and softcap."""
    rows = tuple(1 if d == dim else s for d, s in enumerate(shape))
    if case.startswith("row_scale"):
        return dict(scale=torch.empty(rows, dtype=torch.float32, device="meta"), softcap=30.0)
    if not case.startswith("fused"):
        return None
    mask_shape = (shape[0], 1, *shape[2:]) if len(shape) == 4 else shape
    kw = dict(scale=0.125, softcap=30.0, mask=torch.empty(mask_shape, dtype=torch.bool, device="meta"),
              sinks=torch.empty(rows, dtype=torch.float32, device="meta"), empty_rows="uniform")
    if dim == len(shape) - 1:
        kw["causal"] = "bottom_right"
    return kw
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEVICES = {"sm_90": H100_SXM, "sm_80": A100_SXM, "gfx942": MI300X}
BACKEND_OF = {"cuda": "nvidia", "hip": "amd"}


def plan_for(layout, elem_bytes: int, dev, backward: bool, overrides: dict, spec=None):
    """The backend's KernelPlan for this layout on `dev` (`draft_plan`: kernel, tile, warps,
    stages and cooperation; the grid is left at 1: it is not compiled in); `spec` carries a
    fused variant."""
    from anysoftmax.backends._triton_common.plan import Fusion
    from anysoftmax.backends.triton import heuristics
    from anysoftmax.backends.triton.backend import draft_plan

    with heuristics.override(**overrides):
        return draft_plan(layout, elem_bytes, dev, backward, Fusion.of(spec) if spec is not None else Fusion())


def case_layout(shape, dim, dtype, log, fused):
    """(spec, layout) of a case on meta tensors, the fused operands' strides included."""
    from anysoftmax.core.layout import RowLayout, operand_strides
    from anysoftmax.core.spec import SoftmaxSpec

    x = torch.empty(shape, dtype=dtype, device="meta")
    spec, _ = SoftmaxSpec.from_request(x, dim, log=log, fused=fused)
    strides = tuple(x.stride())
    return spec, RowLayout.from_strides(shape, strides, strides, dim, operand_strides(spec))


def launches(plan, shape, dim, dtype, log: bool, backward: bool, fused: dict | None = None) -> list:
    """[(kernel, args, constexprs, options)] the backend launches for `plan` (meta tensors:
    only dtypes, strides and the 16-byte alignment every allocation has matter)."""
    from anysoftmax.backends._triton_common.launcher import scratch_maker

    x = torch.empty(shape, dtype=dtype, device="meta")
    y = torch.empty(shape, dtype=dtype, device="meta")
    spec, layout = case_layout(shape, dim, dtype, log, fused)
    opts = plan.launch_options()
    stats, counts = scratch_maker(plan, layout, dtype)(x.device) if (plan.split or backward) else (None, None)
    mask = sinks = p = row_scale = None
    if fused and "mask" in fused:
        mask = fused["mask"].view(torch.uint8)
        sinks = fused["sinks"]
        p = torch.empty(sinks.shape, dtype=spec.acc_dtype, device="meta")
    elif fused:
        row_scale = fused["scale"]
    # as the launchers do: (x, y, operands) forward; y, dy and dx alike backward
    given = (y, torch.empty_like(y), torch.empty_like(y), x if fused else None, mask, p, p) if backward else \
        (x, y, mask, sinks, p, row_scale)
    return [(k, a, c, opts) for k, a, c in plan.calls(plan.tensors(given), layout, log, dtype, stats, counts)]


def compile_target(target: str, dtypes: dict) -> dict:
    from anysoftmax.backends.triton import occupancy

    dev = DEVICES[target]
    kernels, errors = [], []
    for case, shape, dim, log, backward, overrides, expected_kind in CASES:
        for dname, dtype in dtypes.items():
            where = dict(target=target, case=case, dtype=dname)
            try:
                fused = fused_kwargs(case, shape, dim)
                spec, layout = case_layout(shape, dim, dtype, log, fused)
                plan = plan_for(layout, dtype.itemsize, dev, backward, overrides, spec if fused else None)
                calls = launches(plan, shape, dim, dtype, log, backward, fused)
            except Exception as exc:
                errors.append(dict(where, stage="plan", error=f"{type(exc).__name__}: {exc}",
                                   traceback=traceback.format_exc(limit=-4)))
                continue
            for kernel, args, constexprs, opts in calls:
                record = dict(where, kind=plan.kind, expected_kind=expected_kind, backward=backward, log=log,
                              shape=list(shape), dim=dim, kernel=kernel.__name__,
                              phase=constexprs.get("PHASE"), stages=constexprs.get("STAGES", 1),
                              block_m=plan.block_m, block_n=plan.block_n,
                              chunks=plan.chunks, cooperative=plan.cooperative, num_warps=opts["num_warps"],
                              device=dev.name, multiprocessor_count=dev.multiprocessor_count)
                try:
                    t0 = time.perf_counter()
                    compiled, how = compile_launch(kernel, args, constexprs, target, opts)
                    record["compile_s"] = round(time.perf_counter() - t0, 3)
                    res = cuda_resources(compiled) if TARGETS[target].backend == "cuda" else hip_resources(compiled)
                    shared = int(compiled.metadata.shared)
                    warps = int(compiled.metadata.num_warps)
                    pps = occupancy.programs_per_sm(dev, occupancy.KernelResources(res["n_regs"], shared, warps,
                                                                                     res.get("sgprs") or 0))
                    if TARGETS[target].backend == "cuda":
                        record.update(staged_loads(compiled))
                    record.update(res, specialization=how, shared=shared, compiled_num_warps=warps,
                                  programs_per_sm=pps, resident_programs=pps * dev.multiprocessor_count,
                                  hardware_programs_per_sm=hardware_programs_per_sm(dev, res, shared, warps))
                    kernels.append(record)
                except Exception as exc:
                    errors.append(dict(record, stage="compile", error=f"{type(exc).__name__}: {exc}",
                                       traceback=traceback.format_exc(limit=-4)))
    return dict(kernels=kernels, errors=errors)


def report_targets(targets: str, compile_one) -> dict:
    """The JSON document of `compile_one(target)` ({kernels, errors}) over the comma-separated
    `targets` whose backend this Triton has (the others listed under missing_backends); the
    compilers' chatter goes to stderr."""
    from triton.backends import backends as available

    doc = dict(triton=triton.__version__, torch=torch.__version__, backends=sorted(available),
               interpreting=os.environ.get("TRITON_INTERPRET", "") not in ("", "0"),
               kernels=[], errors=[], missing_backends={})
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON document only
        for target in targets.split(","):
            backend = BACKEND_OF[TARGETS[target].backend]
            if backend not in available:
                doc["missing_backends"][target] = backend
                continue
            part = compile_one(target)
            for key in ("kernels", "errors"):
                doc[key] += part[key]
    doc["total_s"] = round(time.perf_counter() - t0, 2)
    return doc


def missing_backend(target: str) -> str | None:
    """Why this Triton cannot compile for `target` (it lacks the backend), or None."""
    from triton.backends import backends as available

    backend = BACKEND_OF[TARGETS[target].backend]
    if backend not in available:
        return (f"Triton {triton.__version__} has no {backend!r} backend (triton.backends.backends: "
                f"{sorted(available)}): cannot compile for {target}")
    return None


def run_script(script, args: list, root, cache_dir) -> dict:
    """Run a compile script (this one, sampler_targets.py) in a process WITHOUT TRITON_INTERPRET,
    with `root` importable and a fresh Triton cache `cache_dir` (every kernel really compiled,
    nothing left in the user's cache), and return the JSON document it prints."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    proc = subprocess.run([sys.executable, str(script), *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    name = os.path.basename(str(script))
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{name} printed no JSON ({exc}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}") from exc
    assert not doc["interpreting"], "the compile script ran under TRITON_INTERPRET"
    return doc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="sm_90,gfx942", help="comma-separated keys of TARGETS")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: " + ", ".join(DTYPES))
    a = parser.parse_args(argv)
    dtypes = {d: DTYPES[d] for d in a.dtypes.split(",")}
    json.dump(report_targets(a.targets, lambda target: compile_target(target, dtypes)), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
