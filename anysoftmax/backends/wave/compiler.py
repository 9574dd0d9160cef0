"""Compiling one kernel to IREE module bytes (.vmfb): Wave -> MLIR -> (CUDA rewrite) -> iree-compile,
one path for both targets (Wave's `wave_compile` makes a .vmfb for HIP only). The entry point is
Wave's asynchronous one (`kernel.ENTRY_POINT`): it returns once the work is queued (`runtime`).
Needs wave-lang and iree-base-compiler (the `wave` extra), imported lazily.
"""

from __future__ import annotations

from .cuda_mlir import to_cuda
from .env import import_wave
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
    import_wave()
    from iree.compiler import compile_str

    return compile_str(target_mlir(key), extra_args=key.target.compile_flags())
