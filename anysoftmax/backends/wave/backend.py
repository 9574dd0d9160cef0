"""The `wave` backend: Wave (tkw) kernels compiled by IREE, run with iree.runtime.

AMD GPUs run it normally (`device="hip"`, target read from the GPU). On NVIDIA it is an opt-in
validation path (ANYSOFTMAX_WAVE_ON_CUDA=1), never an automatic choice otherwise.

The kernel reads dense 2-D (rows, N) buffers, so `run` makes the rows contiguous:
``x.movedim(dim, -1).contiguous()`` (a copy unless `dim` is last and `x` contiguous) and writes
a contiguous (rows, N) result, moved back to `dim` (a second copy when `dim` is not last).
Kernels come from memory, then the disk cache, then the compiler (`diskcache`, `compiler`).
"""

from __future__ import annotations

import torch

from ...core.cache import BoundedDict, OnceCache
from ...core.layout import new_output
from ...core.registry import BackendUnavailableError
from ...core.spec import SoftmaxSpec, dtype_name
from . import diskcache, runtime
from .env import compiler_missing, runtime_missing
from . import limits
from .kernel import DTYPES, KernelKey
from .target import Target, detect_target

# KernelKey -> .vmfb bytes (from disk or freshly compiled).
_vmfbs: OnceCache[bytes] = OnceCache(maxsize=512)
# (spec, device) -> loaded kernel: a repeated request skips target detection and lookups.
_loaded: BoundedDict = BoundedDict(maxsize=1024)


def kernel_key(spec: SoftmaxSpec, target: Target) -> KernelKey:
    """The compiled kernel that serves `spec` on `target`."""
    return KernelKey(spec.n_cols, dtype_name(spec.in_dtype), dtype_name(spec.out_dtype), spec.log, target)


def vmfb_for(key: KernelKey) -> bytes:
    """The .vmfb of `key`: from the disk cache, else compiled now and stored there."""

    def build() -> bytes:
        data = diskcache.load(key)
        if data is None:
            reason = compiler_missing()
            if reason is not None:
                raise BackendUnavailableError(
                    f"no precompiled Wave kernel {diskcache.vmfb_path(key)} and {reason} "
                    f"(or precompile it elsewhere: python -m anysoftmax.backends.wave.aot "
                    f"--shapes {key.n} --dtypes {key.in_dtype} --out-dtypes {key.out_dtype} "
                    f"--ops {'log_softmax' if key.log else 'softmax'} --target {key.target.chip})")
            from .compiler import compile_vmfb

            data = compile_vmfb(key)
            diskcache.store(key, data)
        return data

    return _vmfbs.get(key, build)


class WaveBackend:
    name = "wave"
    devices = ("cuda",)  # ROCm tensors are torch device type "cuda" too
    priority = 50  # below triton (100), above torch (0)

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
        if spec.numel == 0:
            return None  # nothing to launch: the API returns the empty result itself
        target = detect_target(spec.device.index)
        if isinstance(target, str):
            return target
        longest = limits.max_row_length(target)
        if spec.n_cols > longest:
            return (f"rows of {spec.n_cols} elements exceed {longest}, the longest row the Wave kernel takes on "
                    f"{target.chip} ({limits.TUNING}: longer rows spill registers or exceed one workgroup); "
                    f"backend 'triton' handles them")
        missing = compiler_missing()
        if missing is not None and not diskcache.vmfb_path(kernel_key(spec, target)).is_file():
            return f"{missing}; and {diskcache.vmfb_path(kernel_key(spec, target))} is not precompiled"
        return None

    def run(self, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        rows = as_rows(x, spec)
        out = new_output(rows.shape, spec.out_dtype, x.device)  # NaN-filled in the tests
        self.run_rows(rows, out, spec)
        return from_rows(out, x, spec)

    def run_rows(self, rows: torch.Tensor, out: torch.Tensor, spec: SoftmaxSpec) -> str:
        """Write the result for contiguous (M, N) `rows` into contiguous `out`; returns how
        the result arrived ('in-place', 'copied' or 'host', see `runtime.launch`)."""
        loaded = _loaded.get((spec, rows.device))
        if loaded is None:
            target = detect_target(rows.device.index)
            if isinstance(target, str):
                raise BackendUnavailableError(target)
            key = kernel_key(spec, target)
            loaded = runtime.load(key, vmfb_for(key), target.device, rows.device)
            _loaded.put((spec, rows.device), loaded)
        return runtime.launch(loaded, rows, out)


def as_rows(x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
    """`x` as a contiguous (rows, N) tensor, N being the reduced dim: the one copy this backend
    makes (none when `dim` is last and `x` contiguous), since Wave reads dense 2-D buffers."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    return x.movedim(spec.dim, -1).contiguous().view(-1, spec.n_cols)


def from_rows(out: torch.Tensor, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
    """The (rows, N) result back in `x`'s shape, contiguous (a copy only when `dim` is not last)."""
    if x.dim() == 0:
        return out.view(())
    return out.view(x.movedim(spec.dim, -1).shape).movedim(-1, spec.dim).contiguous()
