"""The Wave (tkw) softmax kernel: Wave's `test_fused_softmax` generalised to any N, any M, 16/32-bit
dtypes, log_softmax and the fused family (docs/wave.md, "The kernel"). `plan_row` is pure
arithmetic; `build_kernel` imports wave_lang lazily.
"""

# No `from __future__ import annotations` here: Wave evaluates the kernel's type hints
# (tkl.Memory[...]) with get_type_hints, which needs them as live objects.
import linecache
import math
from dataclasses import dataclass, field

from ...config import load_tuning
from ...core.reference import empty_row_value
from ...core.spec import SoftmaxSpec, dtype_name
from ...core.variant import MASK_BOOL
from .fusion import Fusion, Term, fusion_of
from .target import Target

# Element types the kernel reads and writes (torch dtype names).
DTYPES = ("float32", "float16", "bfloat16")

MAX_THREADS_PER_BLOCK = 1024  # CUDA's limit and a HIP workgroup's
# Elements per thread (target and limit): wave/tuning.yaml.
TARGET_ELEMS_PER_THREAD = load_tuning("wave")["target_elems_per_thread"]
MAX_ELEMS_PER_THREAD = load_tuning("wave")["max_elems_per_thread"]
# CUDA's grid y limit (one workgroup per row along y); HIP's is no smaller.
MAX_ROWS_PER_LAUNCH = 65535
# The function Wave generates with `iree_launch_async=True`: buffers, scalars, a wait fence
# and a signal fence in; the outputs (tied to the output buffers) back.
ENTRY_POINT = "isolated_benchmark$async"


@dataclass(frozen=True)
class KernelKey:
    """One compiled kernel: a canonical spec (`fusion.canonical`) on a target. Equality and
    hashing go through `request`, the spec's `kernel_key()` (the project's one cache key), so
    the variant's steps and operand layouts are in it and scale/softcap values are not."""

    spec: SoftmaxSpec = field(compare=False)
    target: Target
    request: tuple = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "request", self.spec.kernel_key())

    @property
    def n(self) -> int:
        return self.spec.shape[-1]

    @property
    def in_dtype(self) -> str:
        return dtype_name(self.spec.in_dtype)

    @property
    def out_dtype(self) -> str:
        return dtype_name(self.spec.out_dtype)

    @property
    def log(self) -> bool:
        return self.spec.log

    @property
    def fusion(self) -> Fusion:
        return fusion_of(self.spec)


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


def offset_expr(terms: tuple[Term, ...], row):
    """The sympy offset of row `row`'s first operand element (`fusion.row_terms`)."""
    total = 0
    for t in terms:
        index = row // t.period if t.period > 1 else row
        if t.size is not None:
            index = index % t.size
        total = total + index * t.stride
    return total


def build_kernel(key: KernelKey):
    """The tkw kernel for `key` and its compile options' `subs` and `dynamic_symbols`. Its
    arguments: x, [mask], [sinks], y, [p_sink], [scale], [softcap], [row0]."""
    import wave_lang.kernel.lang as tkl
    import wave_lang.kernel.wave as tkw

    types = {"float32": tkl.f32, "float16": tkl.f16, "bfloat16": tkl.bf16, "bool": tkl.i8}
    in_t, out_t, f32 = types[key.in_dtype], types[key.out_dtype], tkl.f32
    f = key.fusion
    plan = plan_row(key.n, key.target.threads_per_wave)
    M, N, ADDRESS_SPACE = tkl.sym.M, tkl.sym.N, tkl.sym.ADDRESS_SPACE
    MASK_LEN, SINK_LEN, ROW0 = tkl.sym.MASK_LEN, tkl.sym.SINK_LEN, tkl.sym.ROW0
    m, n = tkl.sym.m, tkl.sym.n  # iterators of the operands' index expressions
    GLOBAL = ADDRESS_SPACE

    constraints = [
        tkw.HardwareConstraint(threads_per_wave=plan.threads_per_wave,
                               vector_shapes={M: 1, N: plan.per_wave}),
        tkw.WorkgroupConstraint(M, 1, 1),  # one row per workgroup, rows along grid y
        tkw.WorkgroupConstraint(N, plan.block_n, 0),  # the whole row in one workgroup
        tkw.WaveConstraint(M, 1),
        tkw.WaveConstraint(N, plan.per_wave),  # `waves` waves share the row
        tkw.IteratorBindings({m: M, n: N}),
    ]
    ln2 = math.log(2.0)
    neg_inf = float("-inf")
    row = m + ROW0  # the global row index (ROW0: the launch's first row)

    def body(x, mask, sinks, y, p_sink, scale, softcap, row0):
        if f.needs_row:
            tkw.set_symbol(ROW0, row0)  # index expressions below use the launch's first row
        v = tkw.read(x)  # columns >= N are masked off (they read 0)
        if in_t != f32:
            v = tkw.cast(v, f32)
        z = v
        # (Wave's bitcast takes registers with a shape, not scalars: broadcast first.)
        if f.scale:
            z = z * tkw.bitcast(tkw.broadcast(scale, target_shape=[M, N]), f32)
        if f.softcap:
            cap = tkw.bitcast(tkw.broadcast(softcap, target_shape=[M, N]), f32)
            z = cap * tkw.tanh(z / cap)
        col = tkw.broadcast(tkw.self_index(N, tkl.i32), target_shape=[M, N])
        sq, off = f.causal_sq, f.causal_offset
        if f.causal_sq:
            # Kept: j <= q + offset. Wave 3.9.1 emits index arithmetic with overflow<nsw, nuw>, so a
            # negative index is poison (bottom_right rows came out empty on the H100): a negative
            # offset moves to the other side, j + (-offset) <= q.
            r = tkw.broadcast(tkw.self_index(M, tkl.i32), target_shape=[M, N])
            if off >= 0:
                live = tkw.apply_expr([r, col], lambda i, j: (j < N) & (j <= (i + ROW0) % sq + off))
            else:
                live = tkw.apply_expr([r, col], lambda i, j: (j < N) & (j - off <= (i + ROW0) % sq))
        else:
            live = tkw.apply_expr(col, lambda j: j < N)
        live = tkw.cast(live, tkw.i1)
        excluded = None
        if f.mask != "none":
            if f.mask_col == 1 and not f.mask_terms:  # one row of mask for every row: Memory[N]
                mv = tkw.broadcast(tkw.read(mask), target_shape=[M, N])
            elif f.mask_col:
                mv = tkw.read(mask, source=(offset_expr(f.mask_terms, row) + n * f.mask_col,), target=(m, n))
            else:  # one mask value per row (broadcast along the row): read once, broadcast
                mv = tkw.broadcast(tkw.read(mask, source=(offset_expr(f.mask_terms, row),), target=(m,),
                                            elements_per_thread=1), target_shape=[M, N])
            if f.mask == MASK_BOOL:
                excluded = tkw.cast(mv, tkw.i1)  # torch's bool is one byte, 0 or 1
            else:
                z = z + (mv if types[f.mask_dtype] == f32 else tkw.cast(mv, f32))
        z = tkw.select(live, z, tkl.Register[M, N, f32](neg_inf))  # padding, causal (and scale < 0)
        if excluded is not None:
            z = tkw.select(excluded, tkl.Register[M, N, f32](neg_inf), z)
        row_max = tkw.max(z, dim=N, block=True)
        if f.sink_dtype:
            s = tkw.read(sinks, source=(offset_expr(f.sink_terms, row),), target=(m,), elements_per_thread=1)
            if types[f.sink_dtype] != f32:
                s = tkw.cast(s, f32)
            row_max = tkw.maximum(row_max, s)
        shifted = z - tkw.broadcast(row_max, [M, N])
        e = tkw.exp(shifted)
        total = tkw.sum(e, dim=N, block=True)
        if f.sink_dtype:
            e_sink = tkw.exp(s - row_max)
            total = total + e_sink
            p = e_sink / total
        if key.log:
            log_total = tkw.log2(total) * tkl.Register[M, f32](ln2)
            out = shifted - tkw.broadcast(log_total, [M, N])
        else:
            out = e / tkw.broadcast(total, [M, N])
        empty = None
        if f.empty == "count":
            kept = tkw.select(live, tkl.Register[M, N, f32](1.0), tkl.Register[M, N, f32](0.0))
            kept = tkw.select(excluded, tkl.Register[M, N, f32](0.0), kept)
            empty = tkw.sum(kept, dim=N, block=True) < tkl.Register[M, f32](0.5)
        elif f.empty == "causal":  # q + offset < 0, i.e. q < -offset (offset < 0 here; see above)
            empty = tkw.apply_expr(tkw.self_index(M, tkl.i32), lambda i: (i + ROW0) % sq < -off)
        if empty is not None:
            empty = tkw.cast(empty, tkw.i1)
            fill = tkl.Register[M, N, f32](empty_row_value(f.empty_rows, key.n, key.log))
            out = tkw.select(tkw.broadcast(empty, [M, N]), fill, out)
            if f.sink_dtype:
                p = tkw.select(empty, tkl.Register[M, f32](0.0), p)
        if out_t != f32:
            out = tkw.cast(out, out_t)
        tkw.write(out, y)
        if f.sink_dtype:
            tkw.write(p, p_sink, elements_per_thread=1)

    kernel = _signature(tkw, tkl, constraints, body, f, in_t, out_t, types, M, N, MASK_LEN, SINK_LEN, GLOBAL)
    subs = {N: key.n, ADDRESS_SPACE: tkl.AddressSpace.GLOBAL_MEMORY.value}
    flat_mask = f.mask != "none" and not (f.mask_col == 1 and not f.mask_terms)
    dynamic = [M] + ([MASK_LEN] if flat_mask else []) + ([SINK_LEN] if f.sink_dtype else [])
    return kernel, subs, dynamic


def _signature(tkw, tkl, constraints, body, f: Fusion, in_t, out_t, types, M, N, MASK_LEN, SINK_LEN, GLOBAL):
    """The @tkw.wave function for `f`'s arguments, generated: Wave traces it through torch.fx, which
    reads the parameters from the code object (no *args) and their types from the annotations."""
    # Scale and softcap arrive as a float32's bits in an i32: IREE's Python runtime pushes floats as
    # f64, which its VM does not convert to an f32 argument (it reads 0) and iree-compile demotes.
    hints = {"x": tkl.Memory[M, N, GLOBAL, in_t], "y": tkl.Memory[M, N, GLOBAL, out_t],
             "p_sink": tkl.Memory[M, GLOBAL, tkl.f32], "scale": tkl.i32, "softcap": tkl.i32, "row0": tkl.i32}
    if f.mask != "none":
        # A mask that is one row for all rows is read like x (an [N] Memory, no index
        # expression); any other is a flat buffer read through its offsets.
        length = N if f.mask_col == 1 and not f.mask_terms else MASK_LEN
        hints["mask"] = tkl.Memory[length, GLOBAL, types[f.mask_dtype]]
    if f.sink_dtype:
        hints["sinks"] = tkl.Memory[SINK_LEN, GLOBAL, types[f.sink_dtype]]
    names = argument_names(f)  # the hints of these only
    call = ", ".join(f"{k}={k if k in names else None}"
                     for k in ("x", "mask", "sinks", "y", "p_sink", "scale", "softcap", "row0"))
    source = f"def softmax({', '.join(names)}):\n    _body({call})\n"
    # Wave reads source locations (inspect.getsourcelines): the generated text goes to linecache.
    filename = f"<anysoftmax-wave-kernel {'-'.join(names)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"_body": body}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (the names are ours)
    kernel = namespace["softmax"]
    kernel.__annotations__ = {name: hints[name] for name in names}
    return tkw.wave(constraints)(kernel)


def argument_names(f: Fusion) -> tuple[str, ...]:
    """The kernel's arguments in order (the runtime pushes its buffers and values in this order)."""
    names = ["x"] + (["mask"] if f.mask != "none" else []) + (["sinks"] if f.sink_dtype else []) + ["y"]
    names += ["p_sink"] if f.sink_dtype else []
    names += (["scale"] if f.scale else []) + (["softcap"] if f.softcap else []) + (["row0"] if f.needs_row else [])
    return tuple(names)
