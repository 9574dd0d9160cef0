"""The `wave` backend: Wave (tkw) kernels compiled by IREE, run with iree.runtime (docs/wave.md). The kernel
reads dense (rows, N) buffers (`as_rows`), from memory, the disk cache or the compiler; the backward is torch's."""

from __future__ import annotations

import math
import struct

import torch

from ...core.backend import Backend
from ...core.cache import BoundedDict, OnceCache
from ...core.layout import new_output
from ...core.registry import BackendUnavailableError
from ...core.request import FWD, plan_key
from ...core.spec import SoftmaxSpec, dtype_name
from ...core.variant import NO_OPERANDS, Operands
from . import diskcache, fusion, limits, runtime
from .env import compiler_missing, runtime_missing
from .kernel import DTYPES, KernelKey
from .target import Target, detect_target

# KernelKey -> .vmfb bytes (from disk or freshly compiled).
_vmfbs: OnceCache[bytes] = OnceCache(maxsize=512)
# core.request.plan_key -> loaded kernel (forward only; IREE checks the alignment it needs per call).
_loaded: BoundedDict = BoundedDict(maxsize=1024)


def kernel_key(spec: SoftmaxSpec, target: Target) -> KernelKey:
    """The compiled kernel that serves `spec` on `target`: the key of its canonical form."""
    return KernelKey(fusion.canonical(spec), target)


def vmfb_for(key: KernelKey, spec: SoftmaxSpec | None = None) -> bytes:
    """The .vmfb of `key`: from the disk cache, else compiled now and stored there (`spec` words the
    error when neither is possible)."""

    def build() -> bytes:
        data = diskcache.load(key)
        if data is None:
            reason = compiler_missing()
            if reason is not None:
                from .aot import command_for

                command = command_for(spec if spec is not None else key.spec, key.target)
                raise BackendUnavailableError(
                    f"no precompiled Wave kernel {diskcache.vmfb_path(key)} and {reason} "
                    f"(or precompile it elsewhere: {command})")
            from .compiler import compile_vmfb

            data = compile_vmfb(key)
            diskcache.store(key, data)
        return data

    return _vmfbs.get(key, build)


def flat(t: torch.Tensor) -> torch.Tensor:
    """A mask or sinks operand as the kernel takes it: a 1-D view of its storage from its first
    element to its last (a bool mask as bytes); the kernel adds the offsets."""
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.as_strided((span,), (1,))


def f32_bits(value: float) -> int:
    """`value` rounded to float32 (+-inf beyond its range), as the int32 of its bits: how the kernel
    takes scale and softcap (`kernel._signature`)."""
    try:
        return _F32_BITS.unpack(_F32.pack(value))[0]
    except OverflowError:
        return _F32_BITS.unpack(_F32.pack(math.copysign(math.inf, value)))[0]


_F32, _F32_BITS = struct.Struct("<f"), struct.Struct("<i")


class WaveBackend(Backend):
    name = "wave"
    devices = ("cuda",)  # ROCm tensors are torch device type "cuda" too
    priority = 50  # below triton (100), above torch (0)
    fused = True  # every step of core.variant is compiled into the kernel (fusion.Fusion)
    logsumexp_refusal = "no logsumexp kernel (its kernel builder emits no per-row output yet; use 'triton' or 'torch')"
    merge_states_refusal = "no merge_states kernel (use backend='triton' or 'torch')"
    # The sampler needs a per-row select (searches over candidates, a counter-based generator)
    # that the kernel builder has no form for.
    sampler_refusal = ("no sampler kernels (its kernel builder emits elementwise-per-row kernels only: no per-row "
                       "select or random numbers; use backend='triton' or 'torch')")

    def is_available(self) -> str | None:
        reason = runtime_missing()
        if reason is not None:
            return reason
        target = detect_target()
        if isinstance(target, str):
            return target
        missing = compiler_missing()
        if missing is not None and not diskcache.has_kernels(target.name):
            return f"{missing}; no precompiled kernels for {target.name} in {diskcache.cache_dir()}"
        return None

    def supports(self, spec: SoftmaxSpec) -> str | None:
        if spec.device.type != "cuda":
            return (f"device type {spec.device.type!r} is not supported "
                    f"(AMD GPUs, or NVIDIA GPUs with ANYSOFTMAX_WAVE_ON_CUDA=1)")
        for dtype in (spec.in_dtype, spec.out_dtype):
            if dtype_name(dtype) not in DTYPES:
                return f"{dtype_name(dtype)} is not supported by the Wave kernel (float32, float16, bfloat16)"
        reason = fusion.refusal(spec)
        if reason is not None or spec.numel == 0:  # nothing to launch: the API returns the empty result itself
            return reason
        target = detect_target(spec.device.index)
        if isinstance(target, str):
            return target
        longest = limits.max_row_length(target)
        if spec.n_cols > longest:
            return (f"rows of {spec.n_cols} elements exceed {longest}, the longest row the Wave kernel takes on "
                    f"{target.chip} ({limits.TUNING}: longer rows spill registers or exceed one workgroup); "
                    f"backend 'triton' handles them")
        if not spec.is_plain and spec.n_rows >= fusion.ROW_LIMIT:
            return f"{spec.n_rows} rows: a fused Wave kernel indexes rows with int32 (fewer than {fusion.ROW_LIMIT})"
        missing = compiler_missing()
        if missing is not None and not diskcache.vmfb_path(kernel_key(spec, target)).is_file():
            return f"{missing}; and {diskcache.vmfb_path(kernel_key(spec, target))} is not precompiled"
        return None

    def _kernel(self, spec: SoftmaxSpec, device: torch.device):
        """The loaded kernel for `spec` on `device`, and its `Fusion` (memoised per request)."""
        key = plan_key(spec, FWD)
        hit = _loaded.get(key)
        if hit is None:
            target = detect_target(device.index)
            if isinstance(target, str):
                raise BackendUnavailableError(target)
            kernel = kernel_key(spec, target)
            hit = runtime.load(kernel, vmfb_for(kernel, spec), target.device, device), kernel.fusion
            _loaded.put(key, hit)
        return hit

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request; for a fused spec `f(x, operands) -> (y, p_sink or None)`."""
        loaded, f = self._kernel(spec, x.device)  # (a plain spec's Fusion has no step: no operand, no value)
        p_shape = tuple(1 if d == spec.dim else s for d, s in enumerate(spec.shape))

        def run_fused(t: torch.Tensor, ops: Operands = NO_OPERANDS):
            rows = as_rows(t, spec)
            out = new_output(rows.shape, spec.out_dtype, t.device)  # NaN-filled in the tests
            p = torch.empty(rows.shape[0], dtype=torch.float32, device=t.device) if f.sink_dtype else None
            operands = tuple(flat(o) for o, on in ((ops.mask, f.mask != "none"), (ops.sinks, f.sink_dtype)) if on)
            values = tuple(f32_bits(v) for v, on in ((ops.scale, f.scale), (ops.softcap, f.softcap)) if on)
            runtime.launch(loaded, rows, out, operands=operands, p_sink=p, values=values, with_row=f.needs_row)
            return from_rows(out, t, spec), (None if p is None else p.view(p_shape))
        return (lambda t: run_fused(t)[0]) if spec.is_plain else run_fused

    def run_rows(self, rows: torch.Tensor, out: torch.Tensor, spec: SoftmaxSpec) -> str:
        """The plain result of contiguous (M, N) `rows` into `out`; returns how it arrived (`runtime.launch`)."""
        loaded, _ = self._kernel(spec, rows.device)
        return runtime.launch(loaded, rows, out)


def as_rows(x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
    """`x` as a contiguous (rows, N) tensor, N the reduced dim: a view when `dim` is last and `x`
    contiguous (the common case: each torch call costs microseconds), else a copy."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    if spec.dim == x.dim() - 1 and x.is_contiguous():
        return x.view(-1, spec.n_cols)
    return x.movedim(spec.dim, -1).contiguous().view(-1, spec.n_cols)


def from_rows(out: torch.Tensor, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
    """The (rows, N) result back in `x`'s shape, contiguous (a copy only when `dim` is not last)."""
    if x.dim() == 0:
        return out.view(())
    if spec.dim == x.dim() - 1:
        return out.view(x.shape)
    return out.view(x.movedim(spec.dim, -1).shape).movedim(-1, spec.dim).contiguous()
