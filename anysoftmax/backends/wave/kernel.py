"""The Wave (tkw) softmax kernel: the seed's body, generalised.

The seed (Wave's `test_fused_softmax`) holds one row per wave, `vector_shapes={M: 1, N: N}`, and
computes read -> max -> broadcast -> subtract -> exp -> sum -> broadcast -> divide -> write.
It needs N to be a multiple of the wave size and a whole row in one wave's registers. Here:

* **Any N.** A row is split over `waves` waves of one workgroup, each holding `per_wave`
  columns (a multiple of the wave size, so Wave's cross-lane reduction applies); the padded
  tail is masked: loads and stores past N are predicated off by Wave's bounds, and the padded
  lanes are set to -inf before the max, so they add exp(-inf) = 0 to the sum. The reductions
  are `block=True`: a butterfly of shuffles inside each wave, then one shared-memory exchange
  between the waves.
* **Any M.** M is a dynamic symbol: one compiled kernel serves every row count (one workgroup
  per row, grid y = M; the runtime launches at most `MAX_ROWS_PER_LAUNCH` rows at a time).
* **fp16 / bf16 / fp32** inputs and outputs, accumulated in fp32 (cast after the read, cast
  back before the write); `dtype=` widening is a different output type.
* **log_softmax**: (x - max) - log(sum). tkw has no natural log, so ln(s) = log2(s) * ln(2).

`plan_row` is pure arithmetic (tested without Wave); `build_kernel` / `kernel_mlir` import
wave_lang lazily.
"""

# No `from __future__ import annotations` here: Wave evaluates the kernel's type hints
# (tkl.Memory[...]) with get_type_hints, which needs them as live objects.
import math
from dataclasses import dataclass

from ...config import load_tuning
from .target import Target

# Element types the kernel reads and writes (torch dtype names).
DTYPES = ("float32", "float16", "bfloat16")

MAX_THREADS_PER_BLOCK = 1024  # CUDA's limit and a HIP workgroup's
# Elements per thread (target and limit): wave/tuning.yaml.
TARGET_ELEMS_PER_THREAD = load_tuning("wave")["target_elems_per_thread"]
MAX_ELEMS_PER_THREAD = load_tuning("wave")["max_elems_per_thread"]
# CUDA's grid y limit (one workgroup per row along y); HIP's is no smaller.
MAX_ROWS_PER_LAUNCH = 65535


@dataclass(frozen=True)
class KernelKey:
    """Everything that selects one compiled kernel (M is dynamic, so it is not part of it)."""

    n: int
    in_dtype: str
    out_dtype: str
    log: bool
    target: Target

    @property
    def name(self) -> str:
        """File-name stem, e.g. 'log_softmax_n781_float16-float32'."""
        op = "log_softmax" if self.log else "softmax"
        return f"{op}_n{self.n}_{self.in_dtype}-{self.out_dtype}"


@dataclass(frozen=True)
class RowPlan:
    """How one row of `n` columns is spread over one workgroup."""

    n: int
    threads_per_wave: int
    waves: int
    elems_per_thread: int

    @property
    def per_wave(self) -> int:
        return self.elems_per_thread * self.threads_per_wave

    @property
    def block_n(self) -> int:
        """Columns covered by the workgroup (>= n; the rest is masked)."""
        return self.per_wave * self.waves


def max_waves(threads_per_wave: int) -> int:
    # Wave's block reduction exchanges one value per wave through a single shuffle stage,
    # so it handles at most `threads_per_wave` waves; a workgroup holds at most 1024 threads.
    return min(threads_per_wave, MAX_THREADS_PER_BLOCK // threads_per_wave)


def max_row_length(threads_per_wave: int) -> int:
    """The longest row one workgroup holds (262144 for both wave sizes)."""
    return max_waves(threads_per_wave) * threads_per_wave * MAX_ELEMS_PER_THREAD


def plan_row(n: int, threads_per_wave: int) -> RowPlan:
    """Waves per workgroup and columns per thread for rows of `n` columns."""
    if n < 1:
        raise ValueError(f"row length must be positive, got {n}")
    if n > max_row_length(threads_per_wave):
        raise ValueError(f"row length {n} exceeds {max_row_length(threads_per_wave)}, the longest row "
                         f"one workgroup holds; longer rows need a looped kernel, which the wave backend lacks")
    waves = min(max_waves(threads_per_wave), math.ceil(n / (threads_per_wave * TARGET_ELEMS_PER_THREAD)))
    waves = max(waves, 1)
    elems = math.ceil(n / (waves * threads_per_wave))
    return RowPlan(n, threads_per_wave, waves, elems)


def build_kernel(key: KernelKey):
    """The tkw kernel for `key` and its compile options' `subs` and `dynamic_symbols`."""
    import wave_lang.kernel.lang as tkl
    import wave_lang.kernel.wave as tkw

    types = {"float32": tkl.f32, "float16": tkl.f16, "bfloat16": tkl.bf16}
    in_t, out_t, f32 = types[key.in_dtype], types[key.out_dtype], tkl.f32
    plan = plan_row(key.n, key.target.threads_per_wave)
    M, N, ADDRESS_SPACE = tkl.sym.M, tkl.sym.N, tkl.sym.ADDRESS_SPACE

    constraints = [
        tkw.HardwareConstraint(threads_per_wave=plan.threads_per_wave,
                               vector_shapes={M: 1, N: plan.per_wave}),
        tkw.WorkgroupConstraint(M, 1, 1),  # one row per workgroup, rows along grid y
        tkw.WorkgroupConstraint(N, plan.block_n, 0),  # the whole row in one workgroup
        tkw.WaveConstraint(M, 1),
        tkw.WaveConstraint(N, plan.per_wave),  # `waves` waves share the row
    ]
    ln2 = math.log(2.0)

    @tkw.wave(constraints)
    def softmax(x: tkl.Memory[M, N, ADDRESS_SPACE, in_t], y: tkl.Memory[M, N, ADDRESS_SPACE, out_t]):
        v = tkw.read(x)  # columns >= N are masked off (they read 0)
        if in_t != f32:
            v = tkw.cast(v, f32)
        col = tkw.self_index(N, tkl.i32)
        in_row = tkw.cast(tkw.broadcast(tkw.apply_expr(col, lambda c: c < N), target_shape=[M, N]), tkw.i1)
        v = tkw.select(in_row, v, tkl.Register[M, N, f32](float("-inf")))
        row_max = tkw.max(v, dim=N, block=True)
        shifted = v - tkw.broadcast(row_max, [M, N])
        e = tkw.exp(shifted)
        total = tkw.sum(e, dim=N, block=True)
        if key.log:
            log_total = tkw.log2(total) * tkl.Register[M, f32](ln2)
            out = shifted - tkw.broadcast(log_total, [M, N])
        else:
            out = e / tkw.broadcast(total, [M, N])
        if out_t != f32:
            out = tkw.cast(out, out_t)
        tkw.write(out, y)

    subs = {N: key.n, ADDRESS_SPACE: tkl.AddressSpace.GLOBAL_MEMORY.value}
    return softmax, subs, [M]


def kernel_mlir(key: KernelKey) -> str:
    """Wave's MLIR for `key` (before any CUDA rewrite); its entry point is
    `isolated_benchmark(x: tensor<?xNxT>, y: tensor<?xNxU>) -> tensor<?xNxU>` (synchronous)."""
    from .env import import_wave

    import_wave()
    from wave_lang.kernel.wave.compile import WaveCompileOptions, wave_compile

    kernel, subs, dynamic = build_kernel(key)
    options = WaveCompileOptions(
        subs=subs, dynamic_symbols=dynamic, canonicalize=True, compile_to_mlir=True,
        device=key.target.device, target=key.target.chip,
        iree_launch_async=False,  # a plain synchronous entry point: runnable from iree.runtime alone
    )
    return wave_compile(options, kernel).asm
