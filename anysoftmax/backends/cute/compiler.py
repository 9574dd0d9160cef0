"""Compiling a `KernelKey` with `cute.compile` for this machine's GPU, else $CUTE_DSL_ARCH (sm_90a: how CI checks
every kernel kind). The fake tensors state what the compiler may assume: the last extent and the other strides
multiples of `vec`, the pointers aligned to a vector (one 16-byte load); TVM-FFI checks these at each call."""

from __future__ import annotations

from ...core.cache import OnceCache
from .env import import_dsl
from .plan import DTYPE_BYTES, KernelKey

_compiled: OnceCache = OnceCache(maxsize=256)
_CUTLASS_DTYPES = {"float32": "Float32", "float16": "Float16", "bfloat16": "BFloat16"}


def _fake(dtype: str, vec: int, rank: int):
    """A symbolic tensor of `rank`, its last stride 1: (rows, n) for the row kernels, (outer, n, inner)
    for the column kernels, (rows,) for a logsumexp's result (vec 1)."""
    cute = import_dsl()
    import cutlass

    shape = (*(cute.sym_int() for _ in range(rank - 1)), cute.sym_int(divisibility=vec))
    strides = (*(cute.sym_int64(divisibility=vec) for _ in range(rank - 1)), 1)
    return cute.runtime.make_fake_tensor(getattr(cutlass, _CUTLASS_DTYPES[dtype]), shape, stride=strides,
                                         assumed_align=vec * DTYPE_BYTES[dtype])


def compile_kernel(key: KernelKey, keep: bool = False):
    """The compiled entry point of `key` (not cached: `kernel`); with `keep`, its PTX and cubin on
    the result (`__ptx__`, `__cubin__`)."""
    cute = import_dsl()
    import cutlass

    from .kernels import entries

    kernels = entries()
    options = ["--enable-tvm-ffi"] if key.tvm_ffi else []
    fake_stream = cute.runtime.make_fake_stream
    stream = fake_stream(use_tvm_ffi_env_stream=True) if key.tvm_ffi else fake_stream()
    if keep:  # the DSL writes them as files too, into $CUTE_DSL_DUMP_DIR (see env.import_dsl)
        options += ["--keep-ptx", "--keep-cubin"]
    if key.arch:
        options.append(f"--gpu-arch={key.arch}")
    shape = (key.cluster, key.threads, key.vec, key.vectors)
    if key.states:  # logsumexp: x in, one float32 a row out
        consts, entry = (*shape, key.two_pass, key.scaled, key.capped), kernels.states_entry
    elif key.lanes:  # a column kernel
        consts = (key.log, *shape, key.lanes)
        entry = kernels.columns_backward_entry if key.backward else kernels.columns_forward_entry
    elif key.fused:
        consts = (key.log, *shape, key.two_pass, key.staged, key.scaled, key.capped)
        entry = kernels.fused_backward_entry if key.backward else kernels.fused_forward_entry
    else:
        consts = (key.log, *shape, key.two_pass, key.staged)
        entry = kernels.backward_entry if key.backward else kernels.forward_entry
    tensors = tuple(_fake(d, key.vec, 3 if key.lanes else 2) for d in key.operand_dtypes)
    if key.states:  # the lse: a vector of one float32 a row
        tensors = (tensors[0], _fake("float32", 1, 1))
    # Scale and softcap are run-time float32 arguments (a new value never recompiles).
    values = (cutlass.Float32(1.0), cutlass.Float32(1.0)) if key.fused or key.states else ()
    return cute.compile(entry, *tensors, *values, stream, *consts, options=" ".join(options))


def kernel(key: KernelKey):
    """The compiled entry point of `key`, compiled once per process."""
    return _compiled.get(key, lambda: compile_kernel(key))


def compiled_count() -> int:
    """How many kernels this process compiled (tests check that shape classes share one)."""
    return _compiled.builds
