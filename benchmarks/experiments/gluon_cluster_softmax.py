"""Prototype (issue 15): a long row split across the CTAs of one Hopper thread-block cluster.

A row of N elements is cut into C chunks (C = CTAs per cluster, 2..16); CTA `rank` of cluster
`cid` holds chunk `rank` of row `cid` (then row cid + n_clusters, ...). Each CTA reduces its
chunk to (max, sum of exp(x - max)), publishes the pair to a small global scratch, and the
cluster meets at `barrier.cluster` (arrive.release / wait.acquire). The hardware launches all
CTAs of a cluster together (co-scheduled), so the barrier cannot hang whatever else shares the
GPU (MPS, green contexts, other streams): unlike the grid-wide spin barrier of
`softmax_split_kernel`, no program waits for a program that might not be resident.

Written in Gluon (`triton.experimental.gluon`, Triton 3.6) because plain Triton's `num_ctas>1`
fails to compile reductions on sm_90 (TritonGPUPlanCTA pass) and Gluon's own cross-CTA
reduction (a tensor spread over the cluster by `cga_layout`) is not lowered in 3.6
(ReduceOpToLLVM asserts `isReduceWithinCTA`). So each CTA's tensors are replicated over the
cluster (broadcast CGA bases: every CTA computes its own chunk) and the cluster-level exchange
is written by hand: cluster ids through inline PTX, statistics through global memory (tiny,
L2-resident) read with .cg loads after the cluster barrier.

Two forms (constexpr RESIDENT):
* resident: the chunk (<= CHUNK elements) stays in registers between the statistics and the
  normalisation: one read and one write per element.
* streaming: chunks too long for registers are walked in SUB-wide blocks with the online
  normaliser, then re-read (mostly from L2: a CTA re-reads the piece it has just read) and
  written.

Limits of the prototype: 2-D contiguous rows, dim -1, softmax only (no log), fp32/bf16/fp16 in
and out of the same dtype, CUDA sm_90+ only. Not wired into the backend's dispatch.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LOG2E = 1.4426950408889634


@gluon.jit
def _cluster_rank():
    return gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _cluster_id():
    return gl.inline_asm_elementwise("mov.u32 $0, %clusterid.x;", "=r", [], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _num_clusters():
    return gl.inline_asm_elementwise("mov.u32 $0, %nclusterid.x;", "=r", [], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _cluster_barrier(dep):
    """Every thread of every CTA in the cluster; release/acquire at cluster scope orders the
    statistics stored before it against the loads after it. `dep` ties it after those stores."""
    return gl.inline_asm_elementwise(
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n\tmov.u32 $0, $1;",
        "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _finite(m):
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def cluster_softmax_kernel(
    x_ptr, y_ptr, st_ptr, n_rows, n_cols, chunk_len,
    C: gl.constexpr, CHUNK: gl.constexpr, SUB: gl.constexpr, RESIDENT: gl.constexpr,
    layout: gl.constexpr,
):
    """`layout`: a 2-D [C, width] layout whose CGA bases put tensor row i on CTA i of the
    cluster, so the reductions along axis 1 stay inside each CTA and nothing is replicated
    across CTAs (Triton stores replicated data from CTA 0 only)."""
    cid = _cluster_id()
    ncl = _num_clusters()
    chunk_ids = gl.arange(0, C, layout=gl.SliceLayout(1, layout))[:, None]  # this CTA's row of the tile
    lo = chunk_ids.to(gl.int64) * chunk_len
    hi = gl.minimum(lo + chunk_len, n_cols)
    g = gl.arange(0, C, layout=gl.SliceLayout(0, layout))[None, :]
    for row in range(cid, n_rows, ncl):
        x_row = x_ptr + row.to(gl.int64) * n_cols
        y_row = y_ptr + row.to(gl.int64) * n_cols
        st_row = st_ptr + row.to(gl.int64) * (2 * C)
        if RESIDENT:
            cols = lo + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))[None, :]
            x = gl.load(x_row + cols, mask=cols < hi, other=float("-inf")).to(gl.float32)
            m_raw = gl.max(x, axis=1)
            m_loc = _finite(m_raw)
            e = gl.exp2((x - m_loc[:, None]) * 1.4426950408889634)
            s_loc = gl.sum(e, axis=1)
        else:
            m = gl.full([C, SUB], float("-inf"), gl.float32, layout)
            s = gl.full([C, SUB], 0.0, gl.float32, layout)
            for start in range(0, chunk_len, SUB):
                cols = lo + start + gl.arange(0, SUB, layout=gl.SliceLayout(0, layout))[None, :]
                xs = gl.load(x_row + cols, mask=cols < hi, other=float("-inf")).to(gl.float32)
                m_new = gl.maximum(m, xs)
                m_sub = _finite(m_new)
                s = s * gl.exp2((m - m_sub) * 1.4426950408889634) + gl.exp2((xs - m_sub) * 1.4426950408889634)
                m = m_new
            m_raw = gl.max(m, axis=1)
            m_loc = _finite(m_raw)
            s_loc = gl.sum(s * gl.exp2((m - m_loc[:, None]) * 1.4426950408889634), axis=1)
        # Publish this chunk's (max, sum); every CTA then reads all C pairs of the row.
        gl.store(st_row + 2 * chunk_ids, m_raw[:, None])
        gl.store(st_row + 2 * chunk_ids + 1, s_loc[:, None])
        _cluster_barrier(cid)
        ms = gl.load(st_row + 2 * g + 0 * chunk_ids, cache_modifier=".cg")
        ss = gl.load(st_row + 2 * g + 1 + 0 * chunk_ids, cache_modifier=".cg")
        m_all = _finite(gl.max(ms, axis=1))
        total = gl.sum(gl.where(ms == float("-inf"), 0.0, ss * gl.exp2((ms - m_all[:, None]) * 1.4426950408889634)), axis=1)
        if RESIDENT:
            scale = gl.where(m_raw == float("-inf"), 0.0, gl.exp2((m_loc - m_all) * 1.4426950408889634)) / total
            gl.store(y_row + cols, (e * scale[:, None]).to(y_ptr.dtype.element_ty), mask=cols < hi)
        else:
            inv = (1.0 / total)[:, None]
            m_b = m_all[:, None]
            for start in range(0, chunk_len, SUB):
                cols = lo + start + gl.arange(0, SUB, layout=gl.SliceLayout(0, layout))[None, :]
                xs = gl.load(x_row + cols, mask=cols < hi, other=float("-inf")).to(gl.float32)
                y = gl.exp2((xs - m_b) * 1.4426950408889634) * inv
                gl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < hi)
        # The next row's statistics go to other addresses: no second barrier is needed.


def split_cga(ctas: int) -> list:
    """CGA bases of a 2-D [ctas, width] tile putting row i on CTA i (`ctas` a power of 2)."""
    return [[1 << i, 0] for i in range(ctas.bit_length() - 1)]


def tile_layout(ctas: int, vec: int, num_warps: int):
    """The kernel's [ctas, width] layout: 16-byte vectors along the row, one row per CTA."""
    return gl.BlockedLayout([1, vec], [1, 32], [1, num_warps], [1, 0], split_cga(ctas))


def plan(n_rows: int, n_cols: int, elem_bytes: int, sm_count: int = 132, ctas: int | None = None,
         max_resident_bytes: int = 32768, num_warps: int | None = None, waves: int = 4,
         grid: int | None = None) -> dict:
    """Cluster size, chunk and launch shape for rows of n_cols elements. Default: the smallest
    power-of-2 cluster (<= 16) whose chunk fits `max_resident_bytes` (as fp32, in registers)
    per CTA, else 16 CTAs streaming; grid (clusters, each looping over rows): `grid`, or enough
    for `waves` CTAs per SM, at most one per row."""
    if ctas is None:
        ctas = 2
        while ctas < 16 and -(-n_cols // ctas) * 4 > max_resident_bytes:
            ctas *= 2
    chunk_len = -(-n_cols // ctas)
    chunk = triton.next_power_of_2(chunk_len)
    resident = chunk * 4 <= max_resident_bytes
    vec = max(1, 16 // elem_bytes)
    if num_warps is None:
        width = chunk if resident else 8192
        num_warps = 16 if width >= 16384 else 8 if width >= 8192 else 4
    sub = min(chunk, 4096 if elem_bytes == 4 else 8192)
    clusters = grid or max(1, min(n_rows, waves * sm_count // ctas))
    return dict(ctas=ctas, chunk_len=chunk_len, chunk=chunk, sub=sub, resident=resident, vec=vec,
                num_warps=num_warps, grid=clusters)


def cluster_softmax(x: torch.Tensor, y: torch.Tensor, **plan_kw) -> dict:
    """y = softmax(x, -1) for a 2-D contiguous CUDA tensor on sm_90+ (prototype; returns the plan)."""
    if x.dim() != 2 or not x.is_contiguous() or not y.is_contiguous() or y.shape != x.shape:
        raise ValueError(f"cluster_softmax needs 2-D contiguous x and y of one shape, got {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or y.dtype != x.dtype:
        raise ValueError(f"cluster_softmax supports fp32/bf16/fp16 in and out alike, got {x.dtype}->{y.dtype}")
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] < 9:
        raise ValueError("cluster_softmax needs a CUDA GPU with thread-block clusters (sm_90+)")
    n_rows, n_cols = x.shape
    sm = torch.cuda.get_device_properties(x.device).multi_processor_count
    p = plan(n_rows, n_cols, x.element_size(), sm_count=sm, **plan_kw)
    c = p["ctas"]
    width = p["chunk"] if p["resident"] else p["sub"]
    lanes = 32 * p["num_warps"]
    vec = max(1, min(p["vec"], width // lanes))
    layout = tile_layout(c, vec, p["num_warps"])
    stats = torch.empty(n_rows * 2 * c, device=x.device, dtype=torch.float32)
    cluster_softmax_kernel[(p["grid"],)](
        x, y, stats, n_rows, n_cols, p["chunk_len"],
        C=c, CHUNK=p["chunk"], SUB=p["sub"], RESIDENT=p["resident"], layout=layout,
        num_warps=p["num_warps"], num_ctas=c)
    return p
