"""Compiling one kernel to an IREE module (.vmfb bytes): Wave -> MLIR -> (CUDA rewrite) -> iree-compile.

Wave's own `wave_compile` can also produce the .vmfb, but only for HIP; going through its
MLIR text for both targets keeps one path, and the CUDA rewrite slots in between.
The entry point is Wave's asynchronous one, `kernel.ENTRY_POINT(buffers..., scalars...,
wait_fence, signal_fence) -> outputs` (`iree_launch_async=True`): it returns once the work is
queued, so the caller decides how to wait (`runtime`).
Needs wave-lang and iree-base-compiler (the `wave` extra); imported lazily.
"""

from __future__ import annotations

from .cuda_mlir import to_cuda
from .env import compiler_missing, import_wave, require
from .kernel import KernelKey, build_kernel


def kernel_mlir(key: KernelKey) -> str:
    """Wave's MLIR for `key` (before any CUDA rewrite)."""
    import_wave()
    from wave_lang.kernel.wave.compile import WaveCompileOptions, wave_compile

    kernel, subs, dynamic = build_kernel(key)
    options = WaveCompileOptions(
        subs=subs, dynamic_symbols=dynamic, canonicalize=True, compile_to_mlir=True,
        device=key.target.device, target=key.target.chip,
        iree_launch_async=True,  # fences in and out: no wait inside the entry point
    )
    return wave_compile(options, kernel).asm


def target_mlir(key: KernelKey) -> str:
    """The MLIR that iree-compile receives for `key` (rewritten for CUDA on the CUDA target)."""
    mlir = kernel_mlir(key)
    return to_cuda(mlir) if key.target.device == "cuda" else mlir


def compile_vmfb(key: KernelKey) -> bytes:
    """Compile `key` to .vmfb bytes. Raises BackendUnavailableError when the compiler is missing."""
    require(compiler_missing())
    import_wave()
    from iree.compiler import compile_str

    return compile_str(target_mlir(key), extra_args=key.target.compile_flags())
