"""Kernel choice by shape for the `triton` backend; the numbers live in `tuning.yaml` beside it.
`override(...)` replaces table values in a `with` block (tests force the long-row paths with it)."""

from __future__ import annotations

from ...config import Overrides, load_tuning
from ...core.layout import ColumnView, RowLayout, cdiv, column_view, next_power_of_2

override = Overrides("triton")


def table() -> dict:
    """The tuning table with any active overrides applied."""
    extra = override.active()
    return {**load_tuning("triton"), **extra} if extra else load_tuning("triton")


def by_bound(rows: list, value: int):
    """The value of the first [upper bound, value] row whose bound holds `value` (else the last)."""
    return next((v for bound, v in rows if value <= bound), rows[-1][1])


def by_elem_size(value, elem_bytes: int):
    """A table value, or by_bound of its [element bytes bound, value] rows."""
    return by_bound(value, elem_bytes) if isinstance(value, list) else value


def choose_kernel(layout: RowLayout, elem_bytes: int, sm_count: int | None = None, backward: bool = False,
                  out_bytes: int | None = None) -> dict:
    """{kind, block_m, block_n, num_warps, chunks} for a request: column tiles for a reduction across
    contiguous rows (forward), whole rows in one tile, else the online or split kernel."""
    t = table()
    view = None if backward else column_view(layout)
    if view is not None and view.n_inner >= t["cols_min_inner"]:
        return choose_cols_tile(view, elem_bytes, sm_count)
    block_n = next_power_of_2(max(layout.n_cols, 1))
    if backward and (block_n * elem_bytes > t["bwd_max_tile_bytes"] or block_n > t["max_tile_elems"]):
        return split_tile(layout, elem_bytes, sm_count, backward=True)
    if block_n <= t["max_tile_elems"]:
        block_m = min(max(1, t["rows_tile_elems"] // block_n), next_power_of_2(layout.n_rows))
        return dict(kind="tile", block_m=block_m, block_n=block_n, chunks=1,
                    num_warps=by_bound(t["warps_by_tile_elems"], block_m * block_n))
    if t["long_rows"] == "online":
        return dict(kind="online", block_m=1, block_n=min(t["online_block_n"], t["max_tile_elems"]),
                    num_warps=t["online_warps"], chunks=1)
    return split_tile(layout, elem_bytes, sm_count, out_bytes=out_bytes)


def split_tile(layout: RowLayout, elem_bytes: int = 4, sm_count: int | None = None, backward: bool = False,
               out_bytes: int | None = None) -> dict:
    """Rows cut into chunks on different programs: `split_chunk_bytes` (backward: `bwd_...`) of the wider
    of x's and y's elements, halved while too few to fill `sm_count` SMs; `forms`: `phase0_forms`."""
    t = table()
    prefix = "bwd_split_" if backward else "split_"
    wide = max(elem_bytes, out_bytes or elem_bytes)
    chunk_bytes = by_elem_size(t[prefix + "chunk_bytes"], wide)
    chunk = min(max(chunk_bytes // wide, 1), t["max_tile_elems"])
    if sm_count:
        wanted = t["split_items_per_sm"] * sm_count
        while chunk // 2 >= t["split_min_chunk_elems"] and layout.n_rows * cdiv(layout.n_cols, chunk) < wanted:
            chunk //= 2
    warps = by_bound(t[prefix + "warps_by_chunk"], chunk)
    return dict(kind="split", block_m=1, block_n=chunk, num_warps=warps,
                chunks=cdiv(layout.n_cols, chunk), forms=phase0_forms(elem_bytes, backward))


def phase0_forms(elem_bytes: int, backward: bool = False) -> dict:
    """The cooperative split kernels' PHASE 0 forms on for x (backward: y) of `elem_bytes`: {name: True},
    {"stages": n} for a pipelined item loop; ValueError for both prefetch and stages."""
    t = table()
    prefix = "bwd_split_" if backward else "split_"
    forms = dict(prefetch=by_elem_size(t[prefix + "prefetch"], elem_bytes),
                 relaxed_depart=by_elem_size(t[prefix + "relaxed_depart"], elem_bytes))
    if not backward:
        forms["hold_input"] = elem_bytes == 2 and bool(t["split_hold_input_16bit"])
    on = {name: True for name, value in forms.items() if value}
    stages = int(by_elem_size(t[prefix + "stages"], elem_bytes))
    if stages > 1:
        if on.get("prefetch"):
            raise ValueError(f"tuning: {prefix}prefetch and {prefix}stages = {stages} both load the next work item "
                             f"ahead (registers, shared memory); set one")
        on["stages"] = stages
    return on


def choose_cols_tile(view: ColumnView, elem_bytes: int, sm_count: int | None = None) -> dict:
    """Tile for a reduction across contiguous rows (`ColumnView`): BLOCK_M inner positions
    (`cols_block_bytes` of them), BLOCK_N reduction steps; the whole reduction in one tile when
    it fits `cols_tile_bytes`, else split across programs like long rows (`cols_chunk_bytes`)."""
    t = table()
    block_i = min(max(t["cols_block_bytes"] // elem_bytes, 1), next_power_of_2(view.n_inner))
    red = next_power_of_2(max(view.n_red, 1))
    warps = t["cols_warps_by_tile_elems"]
    if red * block_i * elem_bytes <= t["cols_tile_bytes"]:
        return dict(kind="cols", block_m=block_i, block_n=red, num_warps=by_bound(warps, red * block_i), chunks=1)
    block_i = min(t["cols_split_block_i"], next_power_of_2(view.n_inner))
    steps = max(1, t["cols_chunk_bytes"] // (block_i * elem_bytes))
    if sm_count:  # a few groups still spread over the whole GPU
        groups = view.n_outer * cdiv(view.n_inner, block_i)
        while steps // 2 * block_i >= t["split_min_chunk_elems"] and \
                groups * cdiv(view.n_red, steps) < t["split_items_per_sm"] * sm_count:
            steps //= 2
    return dict(kind="cols_split", block_m=block_i, block_n=steps, num_warps=by_bound(warps, steps * block_i),
                chunks=cdiv(view.n_red, steps))


def fused_tile_warps(tile_bytes: int, plain_warps: int) -> int:
    """Warps of a forward tile whose prologue reads a mask or computes a softcap."""
    return by_bound(table()["fused_warps_by_tile_bytes"], tile_bytes) or plain_warps


def causal_vec(elem_bytes: int, backward: bool = False) -> int:
    """Elements per load of a causal prefix in the forward tile kernel or the backward kernel."""
    return by_bound(table()["causal_load_bytes_bwd" if backward else "causal_load_bytes"], elem_bytes) // elem_bytes

