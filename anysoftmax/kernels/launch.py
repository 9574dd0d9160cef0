"""Launching the shared softmax kernels: a `KernelPlan` (chosen by a backend) applied to rows."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import triton

from ..core.layout import RowLayout, column_view
from .softmax import softmax_online_kernel, softmax_split_kernel, softmax_tile_kernel
from .softmax_cols import softmax_cols_kernel, softmax_cols_split_kernel

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel, with which tile, on how many programs.

    kind: "tile" (a row fits in one BLOCK_N tile, BLOCK_M rows per step), "online" (a row is
    walked in BLOCK_N sub-blocks by one program) or "split" (a row is cut into `chunks` pieces of
    BLOCK_N held by different programs; `cooperative` fuses the two phases in one launch).
    "cols" / "cols_split" are the transposed forms for a reduction over a non-innermost dim
    (`core.layout.ColumnView`): BLOCK_N reduction steps x BLOCK_M contiguous inner positions.
    `options` are extra launch options a backend needs (`num_warps`/`num_stages` on GPUs,
    `multibuffer` on Ascend).
    """

    kind: str
    block_m: int
    block_n: int
    grid: int
    options: dict = field(default_factory=dict)
    chunks: int = 1
    cooperative: bool = False
    prefetch: bool = False


# (device, stream) -> counters, least recently used first; bounded: a program that makes
# streams on the fly must not grow it forever.
_counters: OrderedDict = OrderedDict()
_counters_lock = threading.Lock()
MAX_COUNTER_STREAMS = 64

# Triton compiles a kernel the first time a specialization is launched, with no lock of its
# own: threads launching the same new shape at once would each compile it. Launches of one
# kernel are therefore serialised (a launch is microseconds; a compile happens once). The
# interpreter patches triton.language globally while a kernel runs, so there every launch
# shares one lock.
_launch_locks: dict = {}
_launch_locks_lock = threading.Lock()
_interpreter_lock = threading.Lock()


def launch_lock(kernel) -> threading.Lock:
    """The lock held while `kernel` is launched (or warmed up): one per kernel function."""
    if interpreting():
        return _interpreter_lock
    with _launch_locks_lock:
        return _launch_locks.setdefault(kernel, threading.Lock())


def row_counters(device: torch.device, n_rows: int) -> torch.Tensor:
    """Zeroed (arrived, departed) int32 counters for `n_rows` rows, reused across launches.

    The cooperative kernels leave them zero again (the last program to leave a row resets
    it), so they are allocated and zeroed once per (device, stream) and grown when needed: no
    memset kernel per launch. One buffer per stream, because launches on different streams
    may overlap.
    """
    n = max(2 * n_rows, 2)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    with _counters_lock:
        buf = _counters.get(key)
        if buf is None or buf.numel() < n:
            buf = torch.zeros(max(n, 2 * (buf.numel() if buf is not None else 0)), dtype=torch.int32, device=device)
            _counters[key] = buf
        _counters.move_to_end(key)
        while len(_counters) > MAX_COUNTER_STREAMS:
            # Safe to drop: the caching allocator hands a block freed on a stream back only to
            # allocations on that same stream, which run after the kernels queued there.
            _counters.popitem(last=False)
        return buf


def device_guard(device: torch.device):
    """Context making a CUDA/ROCm `device` current for a launch (Triton launches on the current
    device), entered only when it is not current already; nothing for other devices."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(softmax_tile_kernel).__name__ == "InterpretedFunction"


@functools.lru_cache(maxsize=None)
def interpreter_problem() -> str | None:
    """Why this machine's Triton interpreter cannot run the kernels, or None when it can.

    Probed once by running the tile kernel on a tiny CPU tensor: some Triton/numpy pairs break
    the interpreter's loops over program ids (Triton 3.6 with numpy >= 2.4: "only 0-dimensional
    arrays can be converted to Python scalars"), and that must read as "unavailable, because",
    not as a wrong or crashing backend.
    """
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = torch.empty_like(x)
    layout = RowLayout.from_strides((2, 3), (3, 1), (3, 1), 1)
    try:
        launch(KernelPlan("tile", 1, 4, 1), x, y, layout, False)
    except Exception as exc:  # the interpreter's own failure, reported as the reason
        import numpy
        return (f"the Triton {triton.__version__} interpreter fails here with numpy {numpy.__version__} "
                f"({type(exc).__name__}: {exc}); upgrade triton")
    if not torch.allclose(y, torch.softmax(x, 1)):
        return f"the Triton {triton.__version__} interpreter computes wrong results on this machine"
    return None


KERNELS = {"tile": softmax_tile_kernel, "online": softmax_online_kernel, "split": softmax_split_kernel,
           "cols": softmax_cols_kernel, "cols_split": softmax_cols_split_kernel}
SPLIT_KINDS = ("split", "cols_split")


def kernel_for(kind: str):
    return KERNELS[kind]


def phases(plan: KernelPlan, split: bool) -> tuple:
    """PHASE values of the launches that run a plan: one fused launch (0), or statistics then
    normalisation (1, 2) for a split plan that is not cooperative."""
    return (1, 2) if split and not plan.cooperative else (0,)


def strides_args(layout: RowLayout) -> tuple:
    _, s1, s2 = layout.row_sizes
    return (s1, s2, *layout.in_row_strides, layout.in_col_stride, *layout.out_row_strides, layout.out_col_stride)


def static_args(plan: KernelPlan, layout: RowLayout) -> tuple:
    """The integer arguments of the plan's kernel, after (x, y) and, for split kinds, the
    scratch (stats, counts)."""
    if plan.kind in ("cols", "cols_split"):
        v = column_view(layout)
        sizes = (v.n_outer, v.n_red, v.n_inner)
        strides = (v.in_outer_stride, v.in_red_stride, v.out_outer_stride, v.out_red_stride)
        return (*sizes, *strides) if plan.kind == "cols" else (*sizes, plan.chunks, *strides)
    if plan.kind == "split":
        return (layout.n_rows, layout.n_cols, plan.chunks, *strides_args(layout))
    return (layout.n_rows, layout.n_cols, *strides_args(layout))


def split_groups(plan: KernelPlan, layout: RowLayout) -> int:
    """Rows (or column groups) whose chunks meet at one barrier: the counters needed."""
    if plan.kind in ("cols", "cols_split"):
        v = column_view(layout)
        return v.n_outer * -(-v.n_inner // plan.block_m)
    return layout.n_rows


def work_items(plan: KernelPlan, layout: RowLayout) -> int:
    """Work items of `plan` on `layout`: the most programs that can have work."""
    if plan.kind in SPLIT_KINDS or plan.kind == "cols":
        return split_groups(plan, layout) * plan.chunks
    return -(-layout.n_rows // plan.block_m)


def kernel_constexprs(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype, phase: int = 0) -> dict:
    """Compile-time parameters of the plan's kernel."""
    # Column offsets are int32 unless the row's extent in elements could overflow it.
    col_extent = (layout.n_cols - 1) * max(abs(layout.in_col_stride), abs(layout.out_col_stride)) + plan.block_n
    if plan.kind in ("cols", "cols_split"):
        # Reduction steps past N are masked but still multiplied by the stride: cover the tile.
        reach = max(layout.n_cols, plan.block_n * plan.chunks) + layout.row_sizes[2]
        meta = dict(LOG=log, ACC_FP64=out_dtype == torch.float64,
                    WIDE=reach * max(abs(layout.in_col_stride), abs(layout.out_col_stride), 1) > INT32_MAX)
        if plan.kind == "cols":
            return dict(meta, BLOCK_N=plan.block_n, BLOCK_I=plan.block_m)
        return dict(meta, CHUNK=plan.block_n, BLOCK_I=plan.block_m, G_POW2=triton.next_power_of_2(plan.chunks),
                    PHASE=phase)
    meta = dict(LOG=log, ACC_FP64=out_dtype == torch.float64, WIDE_COLS=col_extent > INT32_MAX)
    if plan.kind == "tile":
        meta.update(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, NUM_STAGES=plan.options.get("num_stages", 1),
                    FLAT_ROWS=flat_rows(layout))
    elif plan.kind == "online":
        meta.update(BLOCK_N=plan.block_n)
    else:
        meta.update(CHUNK=plan.block_n, G_POW2=triton.next_power_of_2(plan.chunks), PHASE=phase,
                    PREFETCH=plan.prefetch)
    return meta


def flat_rows(layout: RowLayout) -> bool:
    """True when the rows form one (size, stride) dimension: the tile kernel then addresses
    them as `rows * stride` (no div/mod), the form triton-ascend lowers to bounded loads."""
    return layout.row_sizes[0] == 1 and layout.row_sizes[1] == 1


def launch_options(plan: KernelPlan) -> dict:
    return {k: v for k, v in plan.options.items() if k != "num_stages"}


def forward_calls(plan: KernelPlan, x, y, layout: RowLayout, log: bool, stats=None, counts=None) -> list:
    """[(kernel, args, constexprs)] of the launches that run `plan`: one, or the two phases of a
    split plan that is not cooperative. `stats`/`counts` are the split kernels' scratch."""
    kernel = kernel_for(plan.kind)
    split = plan.kind in SPLIT_KINDS
    args = ((x, y, stats, counts) if split else (x, y)) + static_args(plan, layout)
    return [(kernel, args, kernel_constexprs(plan, layout, log, y.dtype, phase)) for phase in phases(plan, split)]


def stats_numel(plan: KernelPlan, layout: RowLayout, backward: bool = False) -> int:
    """Elements (fp32; fp64 for fp64 outputs) of a launch's partial statistics, its only
    scratch besides the reused barrier counters: forward split rows keep (max, sum) per chunk
    (per inner position for column groups), backward split rows one sum per chunk; whole-row
    plans need none (one element is allocated all the same)."""
    if backward:
        return layout.n_rows * plan.chunks if plan.kind != "tile" else 0
    if plan.kind not in SPLIT_KINDS:
        return 0
    per_group = plan.chunks * 2 * (plan.block_m if plan.kind == "cols_split" else 1)
    return split_groups(plan, layout) * per_group


def scratch_maker(plan: KernelPlan, layout: RowLayout, out_dtype: torch.dtype, backward: bool = False):
    """A function `make(device) -> (stats, counts)`: the documented scratch of a launch, sized
    once here. `stats` holds the partial statistics (`stats_numel`; one element when there are
    none, the kernels still take a pointer), `counts` the reused barrier counters."""
    acc = torch.float64 if out_dtype == torch.float64 else torch.float32
    n_stats = max(stats_numel(plan, layout, backward), 1)
    counter_groups = split_groups(plan, layout) if plan.cooperative else 0

    def make(device) -> tuple:
        return torch.empty(n_stats, dtype=acc, device=device), row_counters(device, counter_groups)

    return make


def forward_launcher(plan: KernelPlan, layout: RowLayout, log: bool, out_dtype: torch.dtype):
    """A function `run(x, y)` that launches `plan` on tensors laid out as `layout`: the
    constexprs, options and integer arguments are worked out once here, so a call only
    allocates the split scratch and launches (backends keep these per request shape)."""
    kernel = kernel_for(plan.kind)
    opts = launch_options(plan)
    split = plan.kind in SPLIT_KINDS
    metas = [{**kernel_constexprs(plan, layout, log, out_dtype, phase), **opts} for phase in phases(plan, split)]
    static = static_args(plan, layout)
    scratch = scratch_maker(plan, layout, out_dtype)
    grid = (plan.grid,)
    lock = launch_lock(kernel)

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        head = (x, y, *scratch(x.device)) if split else (x, y)
        with lock:
            for meta in metas:
                kernel[grid](*head, *static, **meta)

    return run


def launch(plan: KernelPlan, x: torch.Tensor, y: torch.Tensor, layout: RowLayout, log: bool) -> None:
    """Run `plan` writing the softmax of rows of `x` into `y`."""
    forward_launcher(plan, layout, log, y.dtype)(x, y)


def backward_constexprs(plan: KernelPlan, log: bool, out_dtype: torch.dtype, phase: int = 0) -> dict:
    """Compile-time parameters of the backward kernel for a "tile" or "split" plan."""
    single = plan.kind == "tile"
    return dict(LOG=log, ACC_FP64=out_dtype == torch.float64, SINGLE=single,
                BLOCK_M=plan.block_m if single else 1, CHUNK=plan.block_n,
                G_POW2=triton.next_power_of_2(plan.chunks), PHASE=phase)


def backward_static_args(layout: RowLayout, chunks: int) -> tuple:
    """The integer arguments of the backward kernel, after (y, dy, dx, stats, counts)."""
    _, s1, s2 = layout.row_sizes
    return (layout.n_rows, layout.n_cols, chunks, s1, s2, *layout.in_row_strides, layout.in_col_stride)


def backward_args(y, dy, dx, layout: RowLayout, chunks: int, stats, counts) -> tuple:
    return (y, dy, dx, stats, counts, *backward_static_args(layout, chunks))


def backward_launcher(plan: KernelPlan, layout: RowLayout, log: bool, dtype: torch.dtype):
    """A function `run(y, dy, dx)` launching the backward `plan` (see `forward_launcher`)."""
    from .softmax_bwd import softmax_bwd_kernel

    opts = launch_options(plan)
    metas = [{**backward_constexprs(plan, log, dtype, phase), **opts} for phase in phases(plan, plan.kind != "tile")]
    static = backward_static_args(layout, plan.chunks)
    scratch = scratch_maker(plan, layout, dtype, backward=True)
    grid = (plan.grid,)
    lock = launch_lock(softmax_bwd_kernel)

    def run(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> None:
        stats, counts = scratch(y.device)
        with lock:
            for meta in metas:
                softmax_bwd_kernel[grid](y, dy, dx, stats, counts, *static, **meta)

    return run


def launch_backward(plan: KernelPlan, y, dy, dx, layout: RowLayout, log: bool) -> None:
    """dx for softmax (log_softmax) outputs `y` and output gradients `dy`, all laid out alike."""
    backward_launcher(plan, layout, log, dx.dtype)(y, dy, dx)
