"""The `triton` backend's one-read sharded softmax: plan and launch of
`_triton_common/sharded.sharded_split_kernel` for `anysoftmax.distributed`.

The plan is the split kernel's (`heuristics.split_tile`: chunks of `split_chunk_bytes`, halved
while too few to fill the GPU, never wider than the row), one cooperative launch when every
local chunk of a row fits on the GPU at once, else the two-launch form. Each rank plans its
own shard: the mailbox protocol is per row, so ranks with different shard lengths may take
different chunkings and phases.

A request is planned once (`launcher`, memoised by the caller under the request's key for its
mailbox); after its first launch it launches through Triton's low-level launcher
(`launcher._fast_calls`) with the call's epoch and mailbox half, which the kernel does not
specialise on.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...core.cache import OnceCache
from ...core.layout import RowLayout, contiguous_strides, new_output, next_power_of_2, row_operand_strides
from .._triton_common import interpreter
from .._triton_common.launcher import (_constexpr_tails, _cooperative_refused, _fast_calls, _raw_stream,
                                       device_guard, interpreter_quiet, launch_lock, row_counters)
from .._triton_common.plan import VALUE_NAMES, _wide_cols, runtime_params, scalars
from . import heuristics
from .device import device_props
from .occupancy import KernelResources, programs_per_sm

POINTERS = ("x_ptr", "y_ptr", "m_ptr", "s_ptr", "lse_ptr", "stats_ptr", "count_ptr", "words_ptr", "peers_ptr")


class ShardedPlan(NamedTuple):
    """Chunk width (elements), chunks per row, programs, warps, and the launches' PHASE values."""

    chunk: int
    chunks: int
    grid: int
    num_warps: int
    phases: tuple


# (constexprs, warps, dtypes, device index) -> programs the GPU holds at once.
_occupancy: OnceCache[int] = OnceCache(maxsize=256)


def _kernel():
    from .._triton_common.sharded import sharded_split_kernel
    return sharded_split_kernel


def _layout(x, y_strides, dim, mask, has_sink) -> tuple:
    """(copy x, copy mask, layout): rows in logical order (the mailbox slot of a row is its
    logical index on every rank); x or the mask are to be copied (contiguous) only when their
    strides leave more row dims than the kernels take."""
    shape = tuple(x.shape)
    ops = [] if mask is None else [tuple(mask.stride())]
    if has_sink:
        ops.append(row_operand_strides(shape, dim))
    layout = RowLayout.from_strides(shape, tuple(x.stride()), y_strides, dim, tuple(ops))
    if layout is not None:
        return False, False, layout
    xs = contiguous_strides(shape)
    if mask is not None:
        ops[0] = contiguous_strides(shape)
    return True, mask is not None, RowLayout.from_strides(shape, xs, y_strides, dim, tuple(ops))


def plan(layout: RowLayout, elem_bytes: int, device: torch.device, resident_of) -> ShardedPlan:
    """The chunking and grid of one shard (`resident_of(chunk, chunks, warps)`: programs the
    GPU holds at once; not asked under the interpreter)."""
    interpreted = device.type != "cuda" or interpreter.interpreting()
    sms = None if interpreted else device_props(_index(device)).multiprocessor_count
    tile = heuristics.split_tile(layout, elem_bytes, sms)
    chunk = min(tile["block_n"], next_power_of_2(max(layout.n_cols, 1)))
    chunks = max(1, -(-layout.n_cols // chunk))
    warps = heuristics.by_bound(heuristics.table()["split_warps_by_chunk"], chunk)
    items = layout.n_rows * chunks
    if interpreted:
        # Programs run one after another: never the row barrier of several local chunks. A
        # one-chunk row has none, and a program waits only on the peers' same rows, so the
        # one-launch form runs there.
        grid = max(1, min(items, heuristics.table()["interpreter_programs"]))
        return ShardedPlan(chunk, chunks, grid, warps, (0,) if chunks == 1 else (1, 2))
    resident = resident_of(chunk, chunks, warps)
    if resident >= chunks:
        return ShardedPlan(chunk, chunks, max(1, min(items, resident // chunks * chunks)), warps, (0,))
    return ShardedPlan(chunk, chunks, max(1, min(items, resident)), warps, (1, 2))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


class _Bound:
    """One request, planned: `__call__(x, mask, sinks, scale, softcap, epoch, slot_base)`."""

    def __init__(self, x, dim, log, has_scale, has_cap, mask, has_sink, want_lse, rank, world, words, peers):
        self.kernel = kernel = _kernel()
        self.device, self.dtype, self.shape = x.device, x.dtype, tuple(x.shape)
        self.keep = tuple(1 if d == dim else s for d, s in enumerate(x.shape))
        self.want_lse, self.words, self.peers = want_lse, words, peers
        self.copy_x, self.copy_mask, layout = _layout(x, contiguous_strides(self.shape), dim, mask, has_sink)
        self.layout = layout
        flags = dict(LOG=log, W_POW2=next_power_of_2(world), HAS_SCALE=has_scale, HAS_CAP=has_cap,
                     MASK=0 if mask is None else 2, HAS_SINK=has_sink, WRITE_LSE=want_lse,
                     PRECISE=x.dtype.itemsize > 2)
        (ms0, ms1, ms2), msn = (layout.op_row_strides[0], layout.op_col_strides[0]) if mask is not None else \
            ((0, 0, 0), 0)
        ss0, ss1, ss2 = layout.op_row_strides[-1] if has_sink else (0, 0, 0)
        _, s1, s2 = layout.row_sizes
        (xs0, xs1, xs2), (ys0, ys1, ys2) = layout.in_row_strides, layout.out_row_strides
        ints = dict(n_rows=layout.n_rows, n_cols=layout.n_cols, n_chunks=1, rank=rank, world=world, epoch=1,
                    slot_base=0, S1=s1, S2=s2, xs0=xs0, xs1=xs1, xs2=xs2, xsn=layout.in_col_stride, ys0=ys0,
                    ys1=ys1, ys2=ys2, ysn=layout.out_col_stride, ms0=ms0, ms1=ms1, ms2=ms2, msn=msn, ss0=ss0,
                    ss1=ss1, ss2=ss2)

        prefetch = bool(heuristics.table()["sharded_prefetch_32bit" if x.element_size() == 4 else
                                           "sharded_prefetch_16bit"])

        def metas(chunk: int, chunks: int, phases: tuple) -> list:
            return [dict(flags, WIDE_COLS=_wide_cols(layout, chunk), CHUNK=chunk, G_POW2=next_power_of_2(chunks), PHASE=p,
                         PREFETCH=p == 0 and prefetch) for p in phases]

        def resident_of(chunk: int, chunks: int, warps: int) -> int:
            meta = metas(chunk, chunks, (0,))[0]
            key = (tuple(sorted(meta.items())), warps, x.dtype, None if mask is None else mask.dtype, _index(x.device))

            def measure() -> int:
                stats = torch.empty(2 * layout.n_rows * chunks, dtype=torch.float32, device=x.device)
                args = self._named(x, x, mask, None, x, stats, row_counters(x.device, layout.n_rows),
                                   dict(ints, n_chunks=chunks), scalars(1.0, 1.0))
                with launch_lock(kernel):
                    compiled = kernel.warmup(**args, grid=(1,), num_warps=warps, **meta)
                compiled._init_handles()
                props = device_props(_index(x.device))
                res = KernelResources(n_regs=compiled.n_regs, shared_mem=compiled.metadata.shared, num_warps=warps)
                return props.multiprocessor_count * programs_per_sm(props, res)

            return _occupancy.get(key, measure)

        with device_guard(x.device):
            self.plan = p = plan(layout, x.element_size(), x.device, resident_of)
        self.ints = dict(ints, n_chunks=p.chunks)
        self.metas = metas(p.chunk, p.chunks, p.phases)
        self.options = {} if x.device.type != "cuda" else dict(num_warps=p.num_warps)
        if p.phases == (0,):
            self.options["launch_cooperative_grid"] = True
        self.n_stats = max(2 * layout.n_rows * p.chunks, 1)
        names = runtime_params(kernel)
        if names[:len(POINTERS)] != POINTERS or names[len(names) - len(VALUE_NAMES):] != VALUE_NAMES:
            raise RuntimeError(f"sharded_split_kernel's parameters are not (pointers, integers, floats): {names}")
        self.int_names = names[len(POINTERS):len(names) - len(VALUE_NAMES)]
        self.per_call = self.int_names.index("epoch"), self.int_names.index("slot_base")
        self.fast = None
        self.interpreted = type(kernel).__name__ == "InterpretedFunction"

    def _named(self, x, y, m, s, lse, stats, counts, ints, values) -> dict:
        return dict(x_ptr=x, y_ptr=y, m_ptr=x if m is None else m, s_ptr=x if s is None else s,
                    lse_ptr=y if lse is None else lse, stats_ptr=stats, count_ptr=counts, words_ptr=self.words,
                    peers_ptr=self.peers, **ints, **dict(zip(VALUE_NAMES, values)))

    def __call__(self, x, mask, sinks, scale, softcap, epoch: int, slot_base: int):
        if mask is not None:
            mask = mask.expand(self.shape)
        if self.copy_x:
            x = x.contiguous()
        if self.copy_mask:
            mask = mask.contiguous()
        y = new_output(self.shape, self.dtype, self.device)
        s = None if sinks is None else sinks.detach().to(torch.float32).expand(self.keep).contiguous()
        lse = torch.empty(self.keep, dtype=torch.float32, device=self.device) if self.want_lse else None
        stats = torch.empty(self.n_stats, dtype=torch.float32, device=self.device)
        counts = row_counters(self.device, self.layout.n_rows)
        values = scalars(1.0 if scale is None else scale, 1.0 if softcap is None else softcap)
        fast = self.fast
        if fast is not None:
            ints = list(fast[1])
            ints[self.per_call[0]], ints[self.per_call[1]] = epoch, slot_base
            ptrs = [t.data_ptr() for t in (x, y, x if mask is None else mask, x if s is None else s,
                                           y if lse is None else lse, stats, counts, self.words, self.peers)]
            stream = _raw_stream(self.device)
            for fn, before, after, tail in fast[0]:
                fn(*before, stream, *after, *ptrs, *ints, *values, *tail)
            return y, lse
        args = self._named(x, y, mask, s, lse, stats, counts, dict(self.ints, epoch=epoch, slot_base=slot_base),
                           values)
        with device_guard(self.device), launch_lock(self.kernel):
            if self.interpreted:
                with interpreter_quiet():
                    for meta in self.metas:
                        self.kernel[(self.plan.grid,)](**args, **meta)
                return y, lse
            compiled = self._first_launch(args)
        tails = _constexpr_tails(self.kernel, len(POINTERS) + len(self.int_names) + len(VALUE_NAMES), self.metas)
        if tails is not None and all(hasattr(c, "packed_metadata") for c in compiled):
            self.fast = (_fast_calls(compiled, tails, self.plan.grid), tuple(self.ints[n] for n in self.int_names),
                         compiled)
        return y, lse

    def _first_launch(self, args) -> list:
        try:
            return [self.kernel[(self.plan.grid,)](**args, **meta, **self.options) for meta in self.metas]
        except RuntimeError as exc:
            if not _cooperative_refused(exc):
                raise
        # The driver refused a cooperative grid (MPS limits, green contexts): the two-launch form.
        p = self.plan
        self.plan = p._replace(grid=max(1, min(self.layout.n_rows * p.chunks, p.grid)), phases=(1, 2))
        self.options.pop("launch_cooperative_grid", None)
        self.metas = [dict(self.metas[0], PHASE=phase, PREFETCH=False) for phase in (1, 2)]
        return [self.kernel[(self.plan.grid,)](**args, **meta, **self.options) for meta in self.metas]


def launcher(x: torch.Tensor, dim: int, *, log: bool, has_scale: bool, has_cap: bool, mask, has_sink: bool,
             want_lse: bool, rank: int, world: int, words: torch.Tensor, peers: torch.Tensor) -> _Bound:
    """The launcher of one request, bound to one mailbox: `f(x, mask, sinks, scale, softcap, epoch,
    slot_base) -> (y, lse)`, this rank's shard of the global softmax / log_softmax in x's dtype
    and the rows' global lse in float32 (x's shape with size 1 in `dim`; None unless
    `want_lse`). `words`: this rank's mailbox (int64), `peers`: every rank's `words` address
    (int64 [world]); `mask`: additive, broadcastable to x; sinks broadcastable to x's rows;
    16/32-bit x. The caller memoises it under the request's key (`core.request`)."""
    return _Bound(x, dim, log, has_scale, has_cap, None if mask is None else mask.expand(x.shape), has_sink,
                  want_lse, rank, world, words, peers)
