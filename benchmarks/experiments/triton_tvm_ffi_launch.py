"""Host cost per call of launching anysoftmax's compiled Triton softmax kernel: torch.softmax,
anysoftmax.softmax, Triton's own launcher called the way anysoftmax's fast path calls it, and a
small C++ TVM-FFI function (built at run time) that calls cuLaunchKernel itself. Question: can a
TVM-FFI launch cut anysoftmax's ~16 us/call toward torch's ~10 us on a small tensor (8 x 1024 fp32)?

Run from the repository root: PYTHONPATH=. python3 benchmarks/experiments/triton_tvm_ffi_launch.py
(`--compile-only`: build and load the C++ module, no GPU needed). Writes $OUT/triton_tvm_ffi_launch.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback

CALLS, WARMUP, ROUNDS = 5000, 200, 5

CPP = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>
#include <dlfcn.h>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {
// No cuda.h: the two driver entry points, declared here and found with dlsym once.
typedef int CUresult; typedef void* CUfunction; typedef void* CUstream;
typedef CUresult (*LaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
typedef CUresult (*ErrorFn)(CUresult, const char**);
struct Driver { LaunchFn launch = nullptr; ErrorFn error = nullptr; std::string problem; };

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) { const char* e = dlerror(); d.problem = std::string("dlopen libcuda.so.1: ") + (e ? e : "?"); return d; }
    d.launch = reinterpret_cast<LaunchFn>(dlsym(h, "cuLaunchKernel"));
    d.error = reinterpret_cast<ErrorFn>(dlsym(h, "cuGetErrorString"));
    if (d.launch == nullptr) d.problem = "dlsym cuLaunchKernel failed";
    return d;
  }();
  return d;
}

// One bound launch: every kernel parameter in its own 8-byte slot (little-endian, so a 4-byte
// value sits in the slot's first bytes); per call only the x / y pointer slots are rewritten.
struct Launch {
  CUfunction fn; unsigned grid, block, smem;
  std::vector<uint64_t> slots; std::vector<void*> params; std::vector<size_t> x_at, y_at;
  void run(const void* x, const void* y, CUstream stream) {  // not thread-safe: one shared slot array
    const Driver& d = driver();
    if (d.launch == nullptr) TVM_FFI_THROW(RuntimeError) << d.problem;
    for (size_t i : x_at) slots[i] = reinterpret_cast<uint64_t>(x);
    for (size_t i : y_at) slots[i] = reinterpret_cast<uint64_t>(y);
    CUresult rc = d.launch(fn, grid, 1, 1, block, 1, 1, smem, stream, params.data(), nullptr);
    const char* msg = "?";
    if (rc != 0 && d.error) d.error(rc, &msg);
    if (rc != 0) TVM_FFI_THROW(RuntimeError) << "cuLaunchKernel failed: " << rc << " " << msg;
  }
};
}  // namespace

// mode 0: f(x, y) tensors, TVM-FFI env stream; 1: f(x_ptr, y_ptr, stream) ints;
// 2: f(x) -> y, y allocated through the env (torch) allocator.
tvm::ffi::Function make_launcher(int64_t mode, int64_t function, int64_t grid, int64_t block, int64_t smem,
                                 tvm::ffi::Bytes blob, tvm::ffi::Bytes roles) {
  size_t n = roles.size();
  TVM_FFI_ICHECK(blob.size() == 8 * n) << "blob must hold 8 bytes per parameter";
  auto st = std::make_shared<Launch>();
  st->fn = reinterpret_cast<CUfunction>(function);
  st->grid = unsigned(grid); st->block = unsigned(block); st->smem = unsigned(smem);
  st->slots.resize(n); st->params.resize(n);
  std::memcpy(st->slots.data(), blob.data(), blob.size());
  for (size_t i = 0; i < n; ++i) {
    st->params[i] = &st->slots[i];
    if (roles.data()[i] == 'x') st->x_at.push_back(i);
    if (roles.data()[i] == 'y') st->y_at.push_back(i);
  }
  if (mode == 0) {
    return tvm::ffi::Function::FromTyped([st](tvm::ffi::TensorView x, tvm::ffi::TensorView y) {
      DLDevice dev = x.device();
      st->run(x.data_ptr(), y.data_ptr(), static_cast<CUstream>(TVMFFIEnvGetStream(dev.device_type, dev.device_id)));
    });
  }
  if (mode == 1) {
    return tvm::ffi::Function::FromTyped([st](int64_t x, int64_t y, int64_t stream) {
      st->run(reinterpret_cast<void*>(x), reinterpret_cast<void*>(y), reinterpret_cast<CUstream>(stream));
    });
  }
  TVM_FFI_ICHECK(mode == 2) << "unknown mode " << mode;
#ifdef NO_ENV_ALLOC
  TVM_FFI_THROW(RuntimeError) << "this tvm_ffi has no TVMFFIEnvTensorAlloc";
#else
  return tvm::ffi::Function::FromTyped([st](tvm::ffi::TensorView x) -> tvm::ffi::Tensor {
    DLDevice dev = x.device();
    tvm::ffi::Tensor y = tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, x.shape(), x.dtype(), dev);
    st->run(x.data_ptr(), y.data_ptr(), static_cast<CUstream>(TVMFFIEnvGetStream(dev.device_type, dev.device_id)));
    return y;
  });
#endif
}

void noop(tvm::ffi::TensorView x, tvm::ffi::TensorView y) {}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_launcher, make_launcher);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(noop, noop);
"""


def build_module(info: dict):
    """load_inline (needs ninja); without ninja, or if it fails, the same source compiled directly."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ / c++) on PATH")
    info["cxx"] = cxx
    import tvm_ffi
    import tvm_ffi.cpp
    from tvm_ffi.libinfo import find_dlpack_include_path, find_include_path, find_libtvm_ffi
    with open(os.path.join(find_include_path(), "tvm", "ffi", "extra", "c_env_api.h")) as f:
        flags = [] if "TVMFFIEnvTensorAlloc" in f.read() else ["-DNO_ENV_ALLOC"]  # older tvm_ffi
    t0 = time.perf_counter()
    try:
        if shutil.which("ninja") is None:
            raise RuntimeError("ninja not on PATH")
        mod = tvm_ffi.cpp.load_inline(name="anysoftmax_triton_launch", cpp_sources=CPP, extra_cflags=flags)
        info["built_with"] = "tvm_ffi.cpp.load_inline"
    except Exception as exc:  # direct compile, same flags load_inline uses
        info["load_inline_error"] = f"{type(exc).__name__}: {exc}"[-2000:]
        d = tempfile.mkdtemp(prefix="tvm_ffi_launch_")
        src, so, lib = os.path.join(d, "main.cpp"), os.path.join(d, "launch.so"), os.path.dirname(find_libtvm_ffi())
        with open(src, "w") as f:
            f.write(CPP)
        cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", *flags, f"-I{find_include_path()}",
               f"-I{find_dlpack_include_path()}", src, f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}", "-o", so]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"direct compile failed: {r.stderr[-3000:]}") from None
        mod = tvm_ffi.load_module(so)
        info["built_with"] = "direct c++ compile + tvm_ffi.load_module"
    info["build_s"] = round(time.perf_counter() - t0, 2)
    return mod


def ptx_param_sizes(ptx: str, name: str) -> list:
    """Byte sizes of the kernel entry's parameters, read from its PTX."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise RuntimeError(f"no .entry {name} in the PTX")
    sizes = []
    for p in (s for s in m.group(1).split(",") if ".param" in s):
        t = re.search(r"\.[usbf](8|16|32|64)\b", p)
        count = re.search(r"\[(\d+)\]", p)
        sizes.append(int(t.group(1)) // 8 * (int(count.group(1)) if count else 1))
    return sizes


INT_FMT = {"i1": "<b", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q",
           "u1": "<B", "u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q"}


def param_blob(compiled, kernel, args, x, y, info: dict):
    """(blob, roles): the kernel's parameter list as Triton's launcher passes it: the non-constexpr
    arguments in declaration order, then the trailing scratch pointers (null: this kernel uses none),
    counted from the PTX entry so the layout follows whichever Triton version compiled it."""
    sig = compiled.src.signature
    slots, roles, types = [], [], []
    for i, (name, a) in enumerate(zip(kernel.arg_names, args)):
        ty = sig[name] if name in sig else sig[i]
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            raise RuntimeError(f"unsupported parameter {name}: {ty}")
        types.append(ty)
        if ty.startswith("*"):
            role = "x" if a is x else "y" if a is y else None
            if role is None:
                raise RuntimeError(f"pointer parameter {name} is neither x nor y")
            slots.append(b"\0" * 8); roles.append(role)
        elif ty in ("fp32", "f32"):
            slots.append(struct.pack("<f", a).ljust(8, b"\0")); roles.append("v")
        elif ty == "fp64":
            slots.append(struct.pack("<d", a)); roles.append("v")
        elif ty in INT_FMT:
            slots.append(struct.pack(INT_FMT[ty], int(a)).ljust(8, b"\0")); roles.append("v")
        else:
            raise RuntimeError(f"unsupported parameter type {ty} ({name})")
    sizes = ptx_param_sizes(compiled.asm["ptx"], compiled.metadata.name)
    extra = len(sizes) - len(slots)
    info.update(kernel_param_types=types, ptx_param_sizes=sizes, trailing_scratch_params=extra)
    if extra < 0 or any(s != 8 for s in sizes[len(slots):]):
        raise RuntimeError(f"PTX has {len(sizes)} params {sizes}, Triton signature {len(slots)}: {types}")
    slots += [b"\0" * 8] * extra
    roles += ["s"] * extra
    return b"".join(slots), "".join(roles).encode()


def bench(fn) -> float:
    from anysoftmax.perf import back_to_back_us

    return back_to_back_us(fn, "cuda", calls=CALLS, warmup=WARMUP)


def err(exc) -> str:
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"[-3000:]


def main() -> None:
    info, errors, routes, checks = {}, {}, {}, {}
    if "--compile-only" in sys.argv:
        mod = build_module(info)  # and build each launcher kind (none is called: no GPU needed)
        kinds = [type(mod.make_launcher(m, 0, 1, 128, 0, b"\0" * 16, b"xy")).__name__ for m in (0, 1, 2)]
        mod.noop(__import__("torch").zeros(4), __import__("torch").zeros(4))
        print("compile-only OK:", info, kinds)
        return
    import torch
    # Before anything imports tvm_ffi (which would add it): torch's own fast DLPack exchange API.
    info["torch_native_dlpack_exchange_api"] = [n for n in ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__")
                                                if hasattr(torch.Tensor, n)]
    import triton
    import anysoftmax
    from anysoftmax import dispatch
    from anysoftmax.backends._triton_common import launcher as L
    from anysoftmax.backends._triton_common import request
    from anysoftmax.backends._triton_common.plan import PLAIN_SCALARS
    from anysoftmax.core.registry import get_backend

    x = torch.randn(8, 1024, device="cuda")
    y_pre = torch.empty_like(x)
    routes["python loop floor (lambda: None)"] = lambda: None
    routes["torch.softmax"] = lambda: torch.softmax(x, -1)
    routes["torch.empty_like"] = lambda: torch.empty_like(x)
    try:
        ref = anysoftmax.softmax(x, -1, backend="triton")  # plans and compiles
        checks["anysoftmax allclose torch.softmax"] = bool(torch.allclose(ref, torch.softmax(x, -1)))
        routes["anysoftmax.softmax(backend=triton)"] = lambda: anysoftmax.softmax(x, -1, backend="triton")
    except Exception as exc:
        errors["anysoftmax.softmax"] = err(exc)
        ref = torch.full_like(x, float("nan"))  # every check against it then FAILs

    compiled = None
    try:  # route 4: what anysoftmax's launcher does after its first call
        prepared, spec = dispatch.prepare(x, -1)
        _, y0, layout, _ = request.forward_layout(prepared, spec)
        plan = get_backend("triton").plan(x, y0, layout, spec)
        info["plan"] = repr(plan)
        if plan.split or plan.cooperative or len(plan.phases()) != 1:
            raise RuntimeError("this experiment handles one-launch, non-split plans only")
        kernel, static, values = plan.kernel(), tuple(plan.static_args(layout).values()), PLAIN_SCALARS
        metas = [{**plan.constexprs(layout, False, x.dtype, p), **plan.launch_options()} for p in plan.phases()]
        head = plan.tensors((x, y_pre, None, None, None))
        compiled = kernel[(plan.grid,)](*head, *static, *values, **metas[0])
        tails = L._constexpr_tails(kernel, len(head) + len(static) + len(values), metas)
        (fn, function, packed, tail), = L._fast_calls([compiled], tails)
        from triton.runtime.driver import driver
        stream_of, index = driver.active.get_current_stream, x.device.index
        bare = (plan.grid, stream_of(index), function, packed, *[t.data_ptr() for t in head], *static, *values, *tail)
        routes["triton fast launch (prealloc y)"] = lambda: fn(*bare)

        def alloc_launch():
            y = torch.empty_like(x)
            ptrs = [t.data_ptr() for t in plan.tensors((x, y, None, None, None))]
            fn(plan.grid, stream_of(index), function, packed, *ptrs, *static, *values, *tail)
            return y
        routes["empty_like + ptrs + stream + triton fast launch"] = alloc_launch
        checks["triton fast launch == anysoftmax"] = bool(torch.equal(alloc_launch(), ref))
        info.update(launcher=type(compiled.run).__name__, num_warps=compiled.metadata.num_warps,
                    shared=compiled.metadata.shared, grid=plan.grid, kernel=compiled.metadata.name)
    except Exception as exc:
        errors["triton fast launch"] = err(exc)

    try:  # route 5: the same kernel through a TVM-FFI C++ function calling cuLaunchKernel
        if compiled is None:
            raise RuntimeError("no compiled kernel (route 4 failed)")
        t0 = time.perf_counter()
        import tvm_ffi  # noqa: F401  (may JIT a torch DLPack addon when torch lacks the exchange API)
        info["import_tvm_ffi_s"] = round(time.perf_counter() - t0, 2)
        info["tvm_ffi_torch_exchange_api"] = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
        md = compiled.metadata
        if getattr(md, "launch_pdl", False) or getattr(md, "launch_cooperative_grid", False) or \
                getattr(md, "num_ctas", 1) != 1 or getattr(md, "global_scratch_size", 0) or \
                getattr(md, "profile_scratch_size", 0):
            raise RuntimeError("kernel needs launch attributes or scratch: not handled here")
        blob, roles = param_blob(compiled, kernel, (*head, *static, *values, *tail), x, y_pre, info)
        mod = build_module(info)
        mk = lambda mode: mod.make_launcher(mode, compiled.function, plan.grid, 32 * md.num_warps, md.shared, blob, roles)
        f_t, f_p = mk(0), mk(1)
        xp, yp, s = x.data_ptr(), y_pre.data_ptr(), torch.cuda.current_stream().cuda_stream
        for name, f in (("tensors", lambda y: f_t(x, y)), ("ints", lambda y: f_p(xp, y.data_ptr(), s))):
            y = torch.empty_like(x) if name == "tensors" else y_pre
            y.fill_(float("nan")); f(y); torch.cuda.synchronize()
            checks[f"tvm_ffi launch ({name}) == anysoftmax"] = ok = bool(torch.equal(y, ref))
            if not ok:  # a wrong parameter layout: launching it 25000 more times could fault the context
                raise RuntimeError(f"tvm_ffi launch ({name}) output differs from anysoftmax: not timed")
        try:
            f_a = mk(2)
            y_a = f_a(x)
            info["env_alloc_returns"] = type(y_a).__name__
            checks["tvm_ffi env-alloc softmax == anysoftmax"] = ok = bool(torch.equal(torch.from_dlpack(y_a), ref))
            if ok:
                routes["tvm_ffi softmax(x) -> y (env alloc inside)"] = lambda: f_a(x)
        except Exception as exc:
            errors["tvm_ffi env-alloc route"] = err(exc)
        noop = mod.noop
        routes["tvm_ffi noop(x, y) (FFI + DLPack floor)"] = lambda: noop(x, y_pre)
        routes["tvm_ffi launch(x_ptr, y_ptr, stream) ints"] = lambda: f_p(xp, yp, s)
        routes["tvm_ffi launch(x, y) (prealloc y)"] = lambda: f_t(x, y_pre)
        routes["empty_like + tvm_ffi launch(x, y)"] = lambda: f_t(x, torch.empty_like(x))
        try:  # device floor: the kernel alone, 100 launches replayed from a CUDA graph (env stream = capture's)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(100):
                    f_t(x, y_pre)
            g.replay(); torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20):
                g.replay()
            e1.record(); torch.cuda.synchronize()
            info["device_us_per_kernel_in_graph"] = e0.elapsed_time(e1) * 1e3 / 2000
        except Exception as exc:
            errors["cuda graph device floor"] = err(exc)
    except Exception as exc:
        errors["tvm_ffi route"] = err(exc)

    samples = {k: [] for k in routes}
    for _ in range(ROUNDS):  # interleaved rounds
        for name, fn_ in list(routes.items()):
            try:
                samples[name].append(bench(fn_))
            except Exception as exc:
                errors[name] = err(exc)
                routes.pop(name)
                samples.pop(name)
    results = {k: dict(median_us=statistics.median(v), min_us=min(v), max_us=max(v), samples_us=v)
               for k, v in samples.items() if v}
    print(f"{'route':<52} {'median':>8} {'min':>8} {'max':>8}   (us/call, {CALLS} calls x {ROUNDS} rounds)")
    for k, r in results.items():
        print(f"{k:<52} {r['median_us']:8.2f} {r['min_us']:8.2f} {r['max_us']:8.2f}")
    for k, ok in checks.items():
        print(f"{'OK  ' if ok else 'FAIL'} check: {k}")
    for k, e in errors.items():
        print(f"ERROR {k}: {e}")
    try:
        tvm_version = __import__("tvm_ffi").__version__
    except Exception as exc:
        tvm_version = f"unavailable: {exc}"
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  tvm_ffi=tvm_version, python=sys.version.split()[0], shape=list(x.shape), dtype="float32",
                  calls=CALLS, warmup=WARMUP, rounds=ROUNDS, results=results, checks=checks, errors=errors, info=info)
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "triton_tvm_ffi_launch.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    print("info:", json.dumps(info, default=str))


if __name__ == "__main__":
    main()
