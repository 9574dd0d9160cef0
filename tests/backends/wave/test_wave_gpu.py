"""Conformance of the `wave` backend on a GPU: AMD (ROCm torch), or NVIDIA through IREE's CUDA
path with ANYSOFTMAX_WAVE_ON_CUDA=1. Every result is checked with `anysoftmax.testing.compare`
against the one float64 reference, on fresh random data (the session's `gen`), into outputs
poisoned with NaN: the shared cases (anysoftmax/testing/cases.py) through the public API, the Wave kernel's
own edges (long rows, masked tails, more rows than one launch) through the backend, and every
member of the fused family (tests/helpers/wave.py) at the seed's shapes, 1823x781, an
attention block and a long row, with the sink shares and the gradients of a few.

Skips with "no AMD GPU" / "no CUDA GPU" elsewhere. The same file is also a script:

    python tests/backends/wave/test_wave_gpu.py precompile --target sm_80   # every kernel these tests need

(per-call cost and bandwidth: benchmarks/wave_latency.py).

Set ANYSOFTMAX_WAVE_RESULTS=<file> to have each test append its errors as a JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
import torch

import anysoftmax
from anysoftmax import dispatch
from anysoftmax.backends.wave import WaveBackend, diskcache, runtime
from anysoftmax.backends.wave.backend import as_rows, from_rows, kernel_key
from anysoftmax.backends.wave.env import compiler_missing, runtime_missing
from anysoftmax.backends.wave.target import detect_target, on_cuda_requested
from anysoftmax.core import SoftmaxSpec, dtype_name
from anysoftmax.testing.compare import PROLOGUE_ROUNDINGS, compare, compare_fused_backward
from anysoftmax.core.reference import fused_forward, prologue
from anysoftmax.testing.cases import CASES, LONG_ROW_CASES

if __name__ == "__main__":  # run as a script (`precompile`): the shared helpers are two folders up
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
from helpers import check, params  # noqa: E402
from helpers.wave import BY_NAME, spec_of  # noqa: E402
from helpers.wave import CASES as VARIANTS  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (shape, dim): the seed's shapes, an irregular one, long rows (one a multiple of the wave size,
# one not), dim not last, more rows than one launch takes (65535), tiny and odd rows.
SHAPES = [((2, 128), -1), ((256, 1024), -1), ((1823, 781), -1), ((4, 65536), -1), ((2, 100000), -1),
          ((3, 781, 5), 1), ((70000, 128), -1), ((7, 1), -1), ((5, 33), -1), ((64, 4096), -1)]
# dtype= widening: fp16/bf16 in, fp32 out.
WIDENING = [((1823, 781), torch.float16, torch.float32), ((1823, 781), torch.bfloat16, torch.float32)]
SPECIAL_SHAPE = (16, 781)
BENCH_SHAPES = [(256, 1024), (1823, 781), (4, 65536), (4096, 4096)]
# The fused family: the seed's shapes, an irregular one, an attention block, a long row.
VARIANT_SHAPES = [(2, 128), (256, 1024), (1823, 781), (2, 8, 256, 256), (2, 100000)]
# More rows than one launch takes (the kernel is told each launch's first row).
MANY_ROWS, MANY_ROWS_CASES = (70000, 64), ["causal_bottom_right_empty_uniform", "sink_rows",
                                           "mask_additive_float32_rows", "mask_bool"]
# (Finite outputs only: a row that torch makes NaN, all -inf, has a NaN gradient, which the
# gradient check refuses by design.)
GRADIENT_CASES = ["scale_softcap", "mask_bool", "mask_additive_float32_rows", "all_scale_softcap_mask_causal_sink",
                  "sink_rows"]


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


def _record(label: str, spec: SoftmaxSpec, result, how: str, device, **extra) -> None:
    path = os.environ.get("ANYSOFTMAX_WAVE_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(case=label, op=spec.op_name, shape=list(spec.shape), dim=spec.dim,
                                    dtype=f"{dtype_name(spec.in_dtype)}->{dtype_name(spec.out_dtype)}",
                                    variant=spec.variant.describe(), ok=result.ok, max_abs_err=result.max_abs_err,
                                    max_rel_err=result.max_rel_err, transfer=how,
                                    gpu=torch.cuda.get_device_name(device), **extra)) + "\n")


def _check(x: torch.Tensor, spec: SoftmaxSpec, label: str):
    backend = WaveBackend()
    assert backend.supports(spec) is None, backend.supports(spec)
    rows = as_rows(x, spec)
    out = torch.full(rows.shape, float("nan"), dtype=spec.out_dtype, device=x.device)
    how = backend.run_rows(rows, out, spec)
    result = compare(from_rows(out, x, spec), x, spec)
    _record(label, spec, result, how, x.device)
    assert result.ok, f"{spec.describe()}: {result.detail}"


def _check_variant(case, shape, dtype, log, gen) -> None:
    """One fused request through the public operator's path (dispatch.forward_fused, which
    also returns the sink shares): y against the float64 reference, and p_sink against the
    reference's own sink shares."""
    x = _input(shape, dtype, gen)
    kw = case.kwargs(gen, shape, "cuda")
    spec, _ = SoftmaxSpec.from_request(x, -1, log=log, fused=kw)
    assert WaveBackend().supports(spec) is None, WaveBackend().supports(spec)
    y, p = dispatch.forward_fused(x, -1, None, "wave", log, dispatch.FusedArgs(**kw))
    result = compare(y, x, spec, device=x.device, mask=kw.get("mask"), sinks=kw.get("sinks"))
    p_err = None
    if kw.get("sinks") is not None:
        x64, mask = x.to(torch.float64), kw.get("mask")
        _, p_ref = fused_forward(x64, spec.variant, spec.dim, log, mask, kw["sinks"], torch.float64)
        # The share exp(s - m) / sum carries the float32 sum's rounding (rtol 2e-5) and that of
        # the logits, ~eps per unit of |z| and |s| (as compare's prologue allowance, 8 eps).
        z = prologue(x64, spec.variant, mask, torch.float64).abs()
        z = torch.where(torch.isfinite(z), z, torch.zeros_like(z)).amax(-1, keepdim=True)
        scale = z + kw["sinks"].double().abs().expand_as(p_ref)
        bound = 1e-6 + (2e-5 + PROLOGUE_ROUNDINGS * 2.0**-24 * scale) * p_ref.abs()
        p_err = ((p.double() - p_ref).abs() / bound).max().item()
        assert p.shape == p_ref.shape and p.dtype == torch.float32 and p_err <= 1.0, f"p_sink off by {p_err:.3g}x"
    _record(case.name, spec, result, runtime.transfer_mode(), x.device, p_sink_err=p_err)
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
    x = _input((3, 781, 5), torch.bfloat16, gen)
    for op in (anysoftmax.softmax, anysoftmax.log_softmax):
        y = op(x, 1, dtype=torch.float32, backend="wave")
        spec = SoftmaxSpec.from_tensor(x, 1, dtype=torch.float32, log=op is anysoftmax.log_softmax)
        assert compare(y, x, spec).ok, compare(y, x, spec).detail


# --- the fused family -------------------------------------------------------------------------


def _variant_params():
    for shape in VARIANT_SHAPES:
        for case in VARIANTS:
            for dtype in case.dtypes:
                yield pytest.param(case, shape, dtype, id=f"{case.name}-{'x'.join(map(str, shape))}-{dtype_name(dtype)}")


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case, shape, dtype", list(_variant_params()))
def test_variant(case, shape, dtype, log, gen):
    _check_variant(case, shape, dtype, log, gen)


@pytest.mark.parametrize("name", MANY_ROWS_CASES)
def test_variant_rows_beyond_one_launch(name, gen):
    _check_variant(BY_NAME[name], MANY_ROWS, torch.float32, False, gen)


def test_new_scale_and_softcap_values_reuse_the_kernel(gen):
    x = _input((256, 1024), torch.float32, gen)
    loaded = None
    for scale, cap in ((0.3, 2.0), (3.0, 7.5), (-1.25, 0.5)):
        y = anysoftmax.softmax(x, -1, scale=scale, softcap=cap, backend="wave")
        spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=scale, softcap=cap))
        result = compare(y, x, spec, device=x.device)
        assert result.ok, f"scale={scale} softcap={cap}: {result.detail}"
        loaded = len(runtime._modules) if loaded is None else loaded
        assert len(runtime._modules) == loaded  # the same compiled kernel, new argument values


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_variant_gradients(name, gen):
    # The backward of a fused request is dispatch's torch formula on the Wave forward's output
    # and sink shares (the backend has no backward kernel): checked in float64.
    case = BY_NAME[name]
    shape = (2, 8, 256, 256)
    x = _input(shape, torch.float32, gen).requires_grad_()
    kw = case.kwargs(gen, shape, "cuda")
    if kw.get("sinks") is not None:
        kw["sinks"] = kw["sinks"].float().requires_grad_()
    y = anysoftmax.softmax(x, -1, backend="wave", **kw)
    g = torch.randn(shape, generator=gen, dtype=torch.float64).float().cuda()
    y.backward(g)
    spec, _ = SoftmaxSpec.from_request(x.detach(), -1, fused={k: (v.detach() if isinstance(v, torch.Tensor) else v)
                                                              for k, v in kw.items()})
    sinks = kw.get("sinks")
    result = compare_fused_backward(x.grad, y.detach(), g, x.detach(), spec, mask=kw.get("mask"),
                                    sinks=None if sinks is None else sinks.detach(),
                                    dsinks=None if sinks is None else sinks.grad, device=x.device)
    _record(name + "-backward", spec, result, runtime.transfer_mode(), x.device)
    assert result.ok, result.detail


# --- script: precompile and bench ------------------------------------------------------------


def needed_specs() -> list[SoftmaxSpec]:
    """Every request the tests above and the latency benchmark make (on meta tensors: only
    layouts and dtypes matter to the kernels)."""
    from anysoftmax.bench.latency import SHAPES as LATENCY_SHAPES

    specs = []
    gen = torch.Generator().manual_seed(0)
    for case in SHARED_CASES:
        for d in case.dtypes:
            x = case.make(gen, d)
            for log in (False, True):
                spec = SoftmaxSpec.from_tensor(x, case.dim, case.out_dtype, log=log)
                if spec.numel:  # as the API does: a narrowing dtype= is applied to the input first
                    specs.append(SoftmaxSpec.from_tensor(x.to(spec.out_dtype) if spec.needs_input_cast else x,
                                                         case.dim, case.out_dtype, log=log))
    meta = lambda shape, d: torch.empty(shape, dtype=d, device="meta")  # noqa: E731
    for shape, dim in SHAPES:
        specs += [SoftmaxSpec.from_tensor(meta(shape, d), dim, log=log) for d in DTYPES for log in (False, True)]
    for shape, din, dout in WIDENING:
        specs += [SoftmaxSpec.from_tensor(meta(shape, din), -1, dout, log=log) for log in (False, True)]
    specs += [SoftmaxSpec.from_tensor(meta(s, torch.float32), -1) for s in LATENCY_SHAPES]
    for shape in VARIANT_SHAPES:
        for case in VARIANTS:
            specs += [spec_of(case, shape, d, log) for d in case.dtypes for log in (False, True)]
    specs += [spec_of(BY_NAME[name], MANY_ROWS) for name in MANY_ROWS_CASES]
    specs += [spec_of(BY_NAME[name], (2, 8, 256, 256)) for name in GRADIENT_CASES]
    specs.append(spec_of(BY_NAME["scale_softcap"], (256, 1024)))
    # benchmarks/wave_latency.py's fused request
    x = meta((8, 1024), torch.float32)
    specs.append(SoftmaxSpec.from_request(x, -1, fused=dict(scale=0.3, mask=meta((8, 1024), torch.bool),
                                                            sinks=meta((8, 1), torch.float32)))[0])
    return specs


def _compile_one(key) -> str:
    from anysoftmax.backends.wave.compiler import compile_vmfb

    if diskcache.load(key) is None:
        diskcache.store(key, compile_vmfb(key))
    return str(diskcache.vmfb_path(key))


def precompile(target_name: str) -> None:
    """Compile every kernel the tests and the benchmark need into the disk cache (one process
    per CPU: each compile is a single-threaded iree-compile run)."""
    from concurrent.futures import ProcessPoolExecutor

    from anysoftmax.backends.wave.target import parse_target

    target = parse_target(target_name)
    keys = sorted({kernel_key(spec, target) for spec in needed_specs()}, key=diskcache.kernel_name)
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        for i, path in enumerate(pool.map(_compile_one, keys)):
            print(f"{i + 1}/{len(keys)} {path}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "precompile":
        precompile(sys.argv[sys.argv.index("--target") + 1] if "--target" in sys.argv else "sm_80")
    else:
        sys.exit(__doc__)
