"""The `triton` backend's one-read sharded softmax (docs/kernels.md, "sharded split"): one cooperative launch
where a row's local chunks fit on the GPU at once, else two; the epoch and mailbox half are per-call integers."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...core.cache import OnceCache
from ...core.layout import RowLayout, new_output, next_power_of_2
from ...core.lse_merge import row_shape
from .._triton_common import interpreter
from .._triton_common.launcher import Binding, bind_kernel, device_guard, row_counters
from .._triton_common.plan import PLAIN_SCALARS, VALUE_NAMES, row_strides, scalars, wide_cols
from .._triton_common.softmax_launchers import logical_rows
from . import heuristics
from .device import compiled_programs_per_sm, device_index, device_props

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


def plan(layout: RowLayout, elem_bytes: int, device: torch.device, resident_of) -> ShardedPlan:
    """Chunks and grid of one shard (`resident_of(chunk, chunks, warps)`: programs resident)."""
    interpreted = device.type != "cuda" or interpreter.interpreting()
    sms = None if interpreted else device_props(device_index(device)).multiprocessor_count
    tile = heuristics.split_tile(layout, elem_bytes, sms)
    chunk = min(tile["block_n"], next_power_of_2(max(layout.n_cols, 1)))
    chunks = max(1, -(-layout.n_cols // chunk))
    warps = heuristics.by_bound(heuristics.table()["split_warps_by_chunk"], chunk)
    items = layout.n_rows * chunks
    if interpreted:
        # Programs run one after another: never a barrier of several local chunks (a one-chunk
        # row has none; a program waits only on the peers' same rows).
        grid = max(1, min(items, heuristics.table()["interpreter_programs"]))
        return ShardedPlan(chunk, chunks, grid, warps, (0,) if chunks == 1 else (1, 2))
    resident = resident_of(chunk, chunks, warps)
    if resident >= chunks:
        return ShardedPlan(chunk, chunks, max(1, min(items, resident // chunks * chunks)), warps, (0,))
    return ShardedPlan(chunk, chunks, max(1, min(items, resident)), warps, (1, 2))


def launcher(x: torch.Tensor, dim: int, *, log: bool, has_scale: bool, has_cap: bool, mask, has_sink: bool,
             want_lse: bool, rank: int, world: int, words: torch.Tensor, peers: torch.Tensor):
    """The launcher of one request bound to one mailbox: `f(x, mask, sinks, scale, softcap, epoch,
    slot_base) -> (y, lse)`, this rank's shard of the global softmax in x's dtype and the rows'
    global lse in float32 (keepdim; None unless `want_lse`). `words`: this rank's int64 mailbox,
    `peers`: every rank's `words` address; `mask`: additive, broadcastable to x; 16/32-bit x."""
    from .._triton_common.sharded import sharded_split_kernel as kernel

    device, dtype, shape = x.device, x.dtype, tuple(x.shape)
    keep = row_shape(shape, dim)
    mask = None if mask is None else mask.expand(shape)
    copy, layout, operand_args = logical_rows(shape, tuple(x.stride()), dim,
                                              None if mask is None else tuple(mask.stride()), has_sink)
    flags = dict(LOG=log, W_POW2=next_power_of_2(world), HAS_SCALE=has_scale, HAS_CAP=has_cap,
                 MASK=0 if mask is None else 2, HAS_SINK=has_sink, WRITE_LSE=want_lse, PRECISE=x.dtype.itemsize > 2)
    ints = dict(n_rows=layout.n_rows, n_cols=layout.n_cols, n_chunks=1, rank=rank, world=world, epoch=1,
                slot_base=0, **row_strides(layout), **operand_args)
    prefetch = bool(heuristics.table()["sharded_prefetch_32bit" if x.element_size() == 4 else
                                       "sharded_prefetch_16bit"])

    def metas(chunk: int, chunks: int, phases: tuple, options: dict) -> tuple:
        return tuple(dict(flags, WIDE_COLS=wide_cols(layout, chunk), CHUNK=chunk, G_POW2=next_power_of_2(chunks),
                          PHASE=p, PREFETCH=p == 0 and prefetch, **options) for p in phases)

    def pointers(a):  # (x, y, mask, sinks, lse, words, peers, stats, counts): absent ones stood in for
        x_, y_, m_, s_, lse_, words_, peers_, stats_, counts_ = a
        return (x_, y_, x_ if m_ is None else m_, x_ if s_ is None else s_, y_ if lse_ is None else lse_, stats_,
                counts_, words_, peers_)

    def resident_of(chunk: int, chunks: int, warps: int) -> int:
        meta = metas(chunk, chunks, (0,), {})[0]
        index = device_index(x.device)
        key = (tuple(sorted(meta.items())), warps, x.dtype, None if mask is None else mask.dtype, index)

        def measure() -> int:
            stats = torch.empty(2 * layout.n_rows * chunks, dtype=torch.float32, device=x.device)
            args = pointers((x, x, mask, None, x, words, peers, stats, row_counters(x.device, layout.n_rows)))
            named = {**dict(zip(POINTERS, args)), **ints, "n_chunks": chunks, **dict(zip(VALUE_NAMES, PLAIN_SCALARS))}
            return device_props(index).multiprocessor_count * compiled_programs_per_sm(kernel, index, **named,
                                                                                       num_warps=warps, **meta)

        return _occupancy.get(key, measure)

    with device_guard(device):
        p = plan(layout, x.element_size(), device, resident_of)
    n_stats = max(2 * layout.n_rows * p.chunks, 1)

    def scratch(device):
        return torch.empty(n_stats, dtype=torch.float32, device=device), row_counters(device, layout.n_rows)

    def bound(sp: ShardedPlan, phases: tuple, options: dict, replan=None):
        binding = Binding(kernel, sp.grid, POINTERS, pointers, dict(ints, n_chunks=sp.chunks),
                          metas(sp.chunk, sp.chunks, phases, options), VALUE_NAMES, PLAIN_SCALARS, ("epoch", "slot_base"))
        return bind_kernel(binding, scratch=scratch, replan=replan, device=device)

    compiled = device.type == "cuda" and not interpreter.interpreting()
    options = dict(num_warps=p.num_warps) if compiled else {}
    if p.phases == (0,) and compiled:
        # One cooperative launch; where the driver refuses it (MPS, green contexts), two launches.
        cooperative = dict(options, launch_cooperative_grid=True)
        launch = bound(p, (0,), cooperative, lambda: bound(p, (1, 2), options))
    else:
        launch = bound(p, p.phases, options)

    def run(x, mask, sinks, scale, softcap, epoch: int, slot_base: int):
        if mask is not None:
            mask = mask.expand(shape).contiguous() if copy else mask.expand(shape)
        if copy:
            x = x.contiguous()
        y = new_output(shape, dtype, device)
        s = None if sinks is None else sinks.detach().to(torch.float32).expand(keep).contiguous()
        lse = torch.empty(keep, dtype=torch.float32, device=device) if want_lse else None
        launch((x, y, mask, s, lse, words, peers), scalars(1.0 if scale is None else scale,
                                                           1.0 if softcap is None else softcap), (epoch, slot_base))
        return y, lse

    return run
