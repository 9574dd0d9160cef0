"""Conformance of the `wave` backend on a GPU: AMD (ROCm torch), or NVIDIA through IREE's CUDA
path with ANYSOFTMAX_WAVE_ON_CUDA=1. Every result is checked with `anysoftmax.core.compare`
against the one float64 reference, on fresh random data (the session's `gen`), into outputs
poisoned with NaN: the shared cases (tests/cases.py) through the public API, and the Wave
kernel's own edges (long rows, masked tails, more rows than one launch) through the backend.

Skips with "no AMD GPU" / "no CUDA GPU" elsewhere. The same file is also a script:

    python tests/test_wave_gpu.py precompile --target sm_80   # every kernel these tests need
    python tests/test_wave_gpu.py bench                       # timings (median of 20 runs)

Set ANYSOFTMAX_WAVE_RESULTS=<file> to have each test append its errors as a JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time

import pytest
import torch
from cases import CASES, LONG_ROW_CASES, params
from helpers import check

from anysoftmax.backends.wave import WaveBackend, diskcache, runtime
from anysoftmax.backends.wave.backend import as_rows, from_rows
from anysoftmax.backends.wave.env import compiler_missing, runtime_missing
from anysoftmax.backends.wave.target import detect_target, on_cuda_requested
from anysoftmax.core import SoftmaxSpec, compare, dtype_name

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (shape, dim): the seed's shapes, an irregular one, long rows (one a multiple of the wave size,
# one not), dim not last, more rows than one launch takes (65535), tiny and odd rows.
SHAPES = [((2, 128), -1), ((256, 1024), -1), ((1823, 781), -1), ((4, 65536), -1), ((2, 100000), -1),
          ((3, 781, 5), 1), ((70000, 128), -1), ((7, 1), -1), ((5, 33), -1), ((64, 4096), -1)]
# dtype= widening: fp16/bf16 in, fp32 out.
WIDENING = [((1823, 781), torch.float16, torch.float32), ((1823, 781), torch.bfloat16, torch.float32)]
SPECIAL_SHAPE = (16, 781)
BENCH_SHAPES = [(256, 1024), (1823, 781), (4, 65536), (4096, 4096)]


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU" if (torch.version.hip is None and on_cuda_requested()) else "no AMD GPU"
    if torch.version.hip is None and not on_cuda_requested():
        return "no AMD GPU (set ANYSOFTMAX_WAVE_ON_CUDA=1 to validate on an NVIDIA GPU)"
    # Only a missing package skips (the compiler only when no kernels were precompiled for
    # this GPU); a GPU whose target cannot be read must fail, not skip.
    if runtime_missing():
        return runtime_missing()
    target = detect_target()
    if compiler_missing() and not isinstance(target, str) and not diskcache.has_kernels(target.name):
        return compiler_missing()
    return None


_REASON = _skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


def _wave_cases(cases):
    """The shared cases with the dtypes the Wave kernel computes in (float64 only as an input
    that `dtype=` narrows: the API rounds it on the host first)."""
    def runs(case, dtype):
        out = case.out_dtype or dtype
        return out in DTYPES and (dtype in DTYPES or out.itemsize < dtype.itemsize)

    kept = [dataclasses.replace(c, dtypes=tuple(d for d in c.dtypes if runs(c, d))) for c in cases]
    return [c for c in kept if c.dtypes]


SHARED_CASES = _wave_cases(CASES + LONG_ROW_CASES)


def _input(shape, dtype, gen) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(dtype).cuda()


def _check(x: torch.Tensor, spec: SoftmaxSpec, label: str):
    backend = WaveBackend()
    assert backend.supports(spec) is None, backend.supports(spec)
    rows = as_rows(x, spec)
    out = torch.full(rows.shape, float("nan"), dtype=spec.out_dtype, device=x.device)
    how = backend.run_rows(rows, out, spec)
    result = compare(from_rows(out, x, spec), x, spec)
    path = os.environ.get("ANYSOFTMAX_WAVE_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(case=label, op=spec.op_name, shape=list(spec.shape), dim=spec.dim,
                                    dtype=f"{dtype_name(spec.in_dtype)}->{dtype_name(spec.out_dtype)}",
                                    ok=result.ok, max_abs_err=result.max_abs_err,
                                    max_rel_err=result.max_rel_err, transfer=how,
                                    gpu=torch.cuda.get_device_name(x.device))) + "\n")
    assert result.ok, f"{spec.describe()}: {result.detail}"


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case,dtype", params(SHARED_CASES))
def test_shared_cases(case, dtype, log, gen):
    check(case.make(gen, dtype).cuda(), case.dim, backend="wave", log=log, dtype=case.out_dtype)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("shape, dim", SHAPES, ids=[f"{'x'.join(map(str, s))}-dim{d}" for s, d in SHAPES])
def test_conformance(shape, dim, dtype, log, gen):
    x = _input(shape, dtype, gen)
    _check(x, SoftmaxSpec.from_tensor(x, dim, log=log), "random")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, din, dout", WIDENING, ids=["fp16-fp32", "bf16-fp32"])
def test_dtype_widening(shape, din, dout, log, gen):
    x = _input(shape, din, gen)
    _check(x, SoftmaxSpec.from_tensor(x, -1, dtype=dout, log=log), "widening")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_name)
def test_special_values(dtype, log, gen):
    # -inf beside finite values, a row of -inf, a NaN, a +inf, huge offsets: torch's semantics.
    x = _input(SPECIAL_SHAPE, torch.float32, gen)
    x[0, ::3] = float("-inf")
    x[1] = float("-inf")
    x[2, 400] = float("nan")
    x[3, 5] = float("inf")
    x[4] += 1e4
    x[5, 780] = float("-inf")  # in the last, partly padded, column block
    x = x.to(dtype)
    _check(x, SoftmaxSpec.from_tensor(x, -1, log=log), "special")


def test_public_api_and_dim(gen):
    import anysoftmax

    x = _input((3, 781, 5), torch.bfloat16, gen)
    for op in (anysoftmax.softmax, anysoftmax.log_softmax):
        y = op(x, 1, dtype=torch.float32, backend="wave")
        spec = SoftmaxSpec.from_tensor(x, 1, dtype=torch.float32, log=op is anysoftmax.log_softmax)
        assert compare(y, x, spec).ok, compare(y, x, spec).detail


# --- script: precompile and bench ------------------------------------------------------------


def needed_keys(target):
    """Every KernelKey the tests above use on `target`."""
    from anysoftmax.backends.wave.kernel import KernelKey

    keys = set()
    gen = torch.Generator().manual_seed(0)
    for case in SHARED_CASES:
        for d in case.dtypes:
            x = case.make(gen, d)
            for log in (False, True):
                spec = SoftmaxSpec.from_tensor(x, case.dim, case.out_dtype, log=log)
                if spec.numel:  # as the API does: a narrowing dtype= is applied to the input first
                    keys.add(KernelKey(spec.n_cols, dtype_name(spec.out_dtype if spec.needs_input_cast
                                                                else spec.in_dtype), dtype_name(spec.out_dtype),
                                       log, target))
    for shape, dim in SHAPES:
        for d in DTYPES:
            keys |= {KernelKey(shape[dim], dtype_name(d), dtype_name(d), log, target) for log in (False, True)}
    for shape, din, dout in WIDENING:
        keys |= {KernelKey(shape[-1], dtype_name(din), dtype_name(dout), log, target) for log in (False, True)}
    for d in (torch.float32, torch.bfloat16):
        keys |= {KernelKey(s[-1], dtype_name(d), dtype_name(d), False, target) for s in BENCH_SHAPES}
    return sorted(keys, key=lambda k: (k.n, k.in_dtype, k.out_dtype, k.log))


def precompile(target_name: str) -> None:
    """Compile every kernel the tests and the bench need into the disk cache."""
    from anysoftmax.backends.wave import diskcache
    from anysoftmax.backends.wave.compiler import compile_vmfb
    from anysoftmax.backends.wave.target import parse_target

    for key in needed_keys(parse_target(target_name)):
        if diskcache.load(key) is None:
            diskcache.store(key, compile_vmfb(key))
        print(diskcache.vmfb_path(key))


def _median_ms(fn, reps=20, warmup=3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench() -> None:
    """Median time of 20 runs per shape; GB/s = 2 * numel * itemsize / time (read x, write y).

    'wave run (dlpack)' and 'wave run (host)' time `WaveBackend.run` whole (the host path's
    copies through host memory included); 'iree invoke only' times the IREE call on buffers
    imported once (kernel, IREE's dispatch and its wait for completion).
    """
    from anysoftmax.backends.wave.backend import kernel_key, vmfb_for
    from anysoftmax.backends.wave.target import detect_target

    backend = WaveBackend()
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print(f"{'shape':>12} {'dtype':>9} {'path':>22} {'ms':>9} {'GB/s':>8}")

    def line(shape, dtype, path, ms, nbytes):
        print(f"{'x'.join(map(str, shape)):>12} {dtype_name(dtype):>9} {path:>22} {ms:9.3f} {nbytes / ms / 1e6:8.1f}",
              flush=True)

    for shape in BENCH_SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            x = _input(shape, dtype, torch.Generator().manual_seed(1))
            spec = SoftmaxSpec.from_tensor(x, -1)
            nbytes = 2 * x.numel() * x.element_size()
            for transfer in runtime.TRANSFERS:
                os.environ[runtime.ENV_TRANSFER] = transfer
                line(shape, dtype, f"wave run ({transfer})", _median_ms(lambda: backend.run(x, spec)), nbytes)
            os.environ.pop(runtime.ENV_TRANSFER, None)
            key = kernel_key(spec, detect_target())
            kernel = runtime.load(key, vmfb_for(key), key.target.device, x.device)
            rows, out = as_rows(x, spec), torch.empty(x.shape, dtype=dtype, device=x.device)
            xv = kernel.device.hal.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(rows))
            yv = kernel.device.hal.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(out))
            line(shape, dtype, "iree invoke only", _median_ms(lambda: runtime._invoke(kernel, xv, yv)), nbytes)
            line(shape, dtype, "torch.softmax", _median_ms(lambda: torch.softmax(x, -1)), nbytes)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "precompile":
        precompile(sys.argv[sys.argv.index("--target") + 1] if "--target" in sys.argv else "sm_80")
    elif len(sys.argv) >= 2 and sys.argv[1] == "bench":
        bench()
    else:
        sys.exit(__doc__)
