"""merge_states for `triton` and `triton_ascend`: `merge_kernel` (K <= MAX_K partials into one,
persistent over BLOCK_R x BLOCK_D tiles; more merged MAX_K - 1 at a time into an fp32/64
intermediate) and its bound launcher on the backend's `MergePlan`; special values as `core.lse_merge`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core.layout import POISON_OUTPUTS, contiguous_strides, new_output_like, output_maker
from ...core.lse_merge import MergeSpec
from .fused import exp_acc
from .launcher import Binding, bind_kernel
from .plan import INT32_MAX

MAX_K = 8
POINTERS = (*(f"o{i}" for i in range(MAX_K)), *(f"l{i}" for i in range(MAX_K)), "out_ptr", "lse_ptr")


@triton.jit
def _load_part(o_ptr, l_ptr, o_off, l_off, cols, osd, live, row_ok, ACC_FP64: tl.constexpr):
    lse = tl.load(l_ptr + l_off, mask=row_ok, other=float("-inf"))
    o = tl.load(o_ptr + o_off[:, None] + cols[None, :] * osd, mask=live, other=0.0)
    return lse.to(tl.float64 if ACC_FP64 else tl.float32), o


@triton.jit
def _add_part(lse, o, m_sub, s, acc, ACC_FP64: tl.constexpr):
    w = exp_acc(lse - m_sub, ACC_FP64)
    w = tl.where(lse == float("-inf"), 0.0, w)
    # A partial of weight 0 is selected away: an empty segment's output (NaN too) never counts.
    acc += tl.where((w == 0)[:, None], 0.0, w[:, None] * o.to(acc.dtype))
    return s + w, acc


@triton.jit
def _as_element_of(v, ptr):
    """v as `ptr`'s element type, fp64 through fp32 (the interpreter's fp64 -> bf16 is NaN)."""
    ty = ptr.dtype.element_ty
    if v.dtype == tl.float64:
        if ty != tl.float64:
            v = v.to(tl.float32)
    return v.to(ty)


@triton.jit
def merge_kernel(
    o0, o1, o2, o3, o4, o5, o6, o7, l0, l1, l2, l3, l4, l5, l6, l7, out_ptr, lse_ptr,
    n_rows, D, S1, os0, os1, osd, ls0, ls1, ys0, ys1, ysd, zs0, zs1,
    K: tl.constexpr, ACC_FP64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, WIDE: tl.constexpr,
):
    """out = sum_i exp(l_i - lse) o_i, lse = log sum_i exp(l_i); row r at (r // S1, r % S1) of
    each tensor kind's two strides. Every partial of a tile is loaded before the first is used
    (one round trip). 32-bit offsets unless an operand spans 2**31 elements (`WIDE`): 64-bit row
    arithmetic was most of the issue-bound merge's instructions (docs/speed.md)."""
    acc_ty = tl.float64 if ACC_FP64 else tl.float32
    n_dt = tl.cdiv(D, BLOCK_D)
    n_tiles = tl.cdiv(n_rows, BLOCK_R) * n_dt
    for t in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rb = t // n_dt
        dt = t % n_dt
        if WIDE:
            rows = tl.cast(rb, tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        else:
            rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = dt * BLOCK_D + tl.arange(0, BLOCK_D)
        row_ok = rows < n_rows
        live = row_ok[:, None] & (cols < D)[None, :]
        r0 = rows // S1
        r1 = rows % S1
        o_off = r0 * os0 + r1 * os1
        l_off = r0 * ls0 + r1 * ls1
        p0, v0 = _load_part(o0, l0, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 1:
            p1, v1 = _load_part(o1, l1, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 2:
            p2, v2 = _load_part(o2, l2, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 3:
            p3, v3 = _load_part(o3, l3, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 4:
            p4, v4 = _load_part(o4, l4, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 5:
            p5, v5 = _load_part(o5, l5, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 6:
            p6, v6 = _load_part(o6, l6, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        if K > 7:
            p7, v7 = _load_part(o7, l7, o_off, l_off, cols, osd, live, row_ok, ACC_FP64)
        m = p0
        bad = p0 != p0
        if K > 1:
            m, bad = tl.maximum(m, p1), bad | (p1 != p1)
        if K > 2:
            m, bad = tl.maximum(m, p2), bad | (p2 != p2)
        if K > 3:
            m, bad = tl.maximum(m, p3), bad | (p3 != p3)
        if K > 4:
            m, bad = tl.maximum(m, p4), bad | (p4 != p4)
        if K > 5:
            m, bad = tl.maximum(m, p5), bad | (p5 != p5)
        if K > 6:
            m, bad = tl.maximum(m, p6), bad | (p6 != p6)
        if K > 7:
            m, bad = tl.maximum(m, p7), bad | (p7 != p7)
        # -inf: every partial empty (weights 0, out 0); +inf: weights inf/inf (NaN, by design).
        m_sub = tl.where((m == float("-inf")) | (m == float("inf")), 0.0, m)
        s = tl.zeros([BLOCK_R], acc_ty)
        acc = tl.zeros([BLOCK_R, BLOCK_D], acc_ty)
        s, acc = _add_part(p0, v0, m_sub, s, acc, ACC_FP64)
        if K > 1:
            s, acc = _add_part(p1, v1, m_sub, s, acc, ACC_FP64)
        if K > 2:
            s, acc = _add_part(p2, v2, m_sub, s, acc, ACC_FP64)
        if K > 3:
            s, acc = _add_part(p3, v3, m_sub, s, acc, ACC_FP64)
        if K > 4:
            s, acc = _add_part(p4, v4, m_sub, s, acc, ACC_FP64)
        if K > 5:
            s, acc = _add_part(p5, v5, m_sub, s, acc, ACC_FP64)
        if K > 6:
            s, acc = _add_part(p6, v6, m_sub, s, acc, ACC_FP64)
        if K > 7:
            s, acc = _add_part(p7, v7, m_sub, s, acc, ACC_FP64)
        m_inf = m == float("inf")
        out = acc * tl.where(s == 0, 0.0, 1.0 / s)[:, None]  # (one division per row, not per element)
        out = tl.where((bad | m_inf)[:, None], float("nan"), out)
        tl.store(out_ptr + (r0 * ys0 + r1 * ys1)[:, None] + cols[None, :] * ysd, _as_element_of(out, out_ptr),
                 mask=live)
        lse = m_sub + tl.log(s)
        lse = tl.where(m_inf, float("inf"), lse)
        lse = tl.where(bad, float("nan"), lse)
        tl.store(lse_ptr + r0 * zs0 + r1 * zs1, _as_element_of(lse, lse_ptr), mask=row_ok & ((tl.zeros([BLOCK_R], tl.int32) + dt) == 0))


@dataclass(frozen=True)
class MergePlan:
    """Tiles and grid of one merge launch (the backend's choice)."""

    block_r: int
    block_d: int
    grid: int
    num_warps: int | None = None


def merge_launcher(spec: MergeSpec, plan_for, guard=None):
    """`f(outputs, lses, out, lse_out) -> (out, lse)` bound to one merge request on `plan_for(k, n_rows,
    d) -> MergePlan`; more than MAX_K partials are merged in groups, each through its own launcher."""
    acc, k, steps = spec.acc_dtype, spec.k, []
    while k > MAX_K:
        steps.append(_group_launcher(MAX_K, acc, acc, spec, plan_for, guard))
        k -= MAX_K - 1
    last = _group_launcher(k, spec.dtype, spec.out_lse_dtype, spec, plan_for, guard)
    if not steps:
        return last

    def run(outputs, lses, out, lse_out):
        outputs, lses = list(outputs), list(lses)
        for step in steps:
            o, l_ = step(outputs[:MAX_K], lses[:MAX_K], None, None)
            outputs, lses = [o, *outputs[MAX_K:]], [l_, *lses[MAX_K:]]
        return last(outputs, lses, out, lse_out)

    return run


def _prepared(ts: list, cast: bool, copy: bool, acc: torch.dtype) -> list:
    # The partials (or lses) as the kernel reads them: of one dtype (`acc` where they mix) and
    # sharing one row layout (contiguous copies where they do not).
    if cast:
        ts = [t.to(acc) for t in ts]
    return [t.contiguous() for t in ts] if copy else ts


def _group_launcher(k: int, out_dtype, lse_dtype, spec: MergeSpec, plan_for, guard):
    """`f(outputs, lses, out, lse_out) -> (out, lse)` of k <= MAX_K partials; the first call decides
    from its tensors which are converted or copied and binds `merge_kernel` (`f.state["launch"]`)."""
    lead, acc, pad = len(spec.shape) - 1, spec.acc_dtype, MAX_K - k
    state = {"launch": None, "how": None}
    bound = [None]  # (launch, prepare, new_out, new_lse) once bound: one read a call

    def pointers(a):  # (partials and lses past K stand in as the first ones: never read, K being a constexpr)
        return (*a[:k], *a[:1] * pad, *a[k:2 * k], *a[k:k + 1] * pad, a[2 * k], a[2 * k + 1])

    def bind_first(outputs, lses, out, lse_out):
        cast_o, cast_l = len({t.dtype for t in outputs}) > 1, len({t.dtype for t in lses}) > 1
        outputs, lses = _prepared(outputs, cast_o, False, acc), _prepared(lses, cast_l, False, acc)
        copy_o, copy_l = _shared_strides(outputs, lead) is None, _shared_strides(lses, lead) is None
        outputs, lses = _prepared(outputs, False, copy_o, acc), _prepared(lses, False, copy_l, acc)
        state["how"] = how = (cast_o, copy_o, cast_l, copy_l)
        out = new_output_like(outputs[0], out_dtype) if out is None else out
        lse_out = new_output_like(lses[0], lse_dtype) if lse_out is None else lse_out
        ints = _row_args(outputs, lses, out, lse_out, lead)
        plan = plan_for(k, ints["n_rows"], ints["D"])
        meta = dict(K=k, ACC_FP64=acc == torch.float64, BLOCK_R=plan.block_r, BLOCK_D=plan.block_d,
                    WIDE=_wide(outputs[0], lses[0], out, lse_out, rows=ints["n_rows"] + plan.block_r))
        if plan.num_warps is not None:
            meta["num_warps"] = plan.num_warps
        binding = Binding(merge_kernel, max(1, plan.grid), POINTERS, pointers, ints, (meta,))
        state["launch"] = launch = bind_kernel(binding, device=spec.device, guard=guard)
        # A kept template for the (small) lse, the cheapest allocation; none for the output.
        bound[0] = (launch, any(how), _allocator(outputs[0], out_dtype),
                    output_maker(tuple(lses[0].shape), lse_dtype, lses[0].device), getattr(launch, "at", None))
        return outputs, lses, out, lse_out

    def run(outputs, lses, out, lse_out):
        hot = bound[0]
        if hot is None:
            outputs, lses, out, lse_out = bind_first(outputs, lses, out, lse_out)
            hot = bound[0]
        elif hot[1]:
            how = state["how"]
            outputs, lses = _prepared(outputs, how[0], how[1], acc), _prepared(lses, how[2], how[3], acc)
        launch, _, new_out, new_lse, _ = hot
        out = new_out(outputs[0]) if out is None else out
        lse_out = new_lse() if lse_out is None else lse_out
        launch((*outputs, *lses, out, lse_out))
        return out, lse_out

    def addressed(addresses, outputs, lses, out, lse_out):
        # `run`'s, (*outputs, *lses)'s addresses read and proved by the caller: not read again.
        hot = bound[0]
        if hot is None or hot[1] or hot[4] is None:
            return run(outputs, lses, out, lse_out)
        launch, _, new_out, new_lse, at = hot
        out = new_out(outputs[0]) if out is None else out
        lse_out = new_lse() if lse_out is None else lse_out
        if not at(addresses, (out, lse_out)):
            launch((*outputs, *lses, out, lse_out))
        return out, lse_out

    run.state = state
    # `addressed(addresses, outputs, lses, out, lse_out)`: the same, given the addresses of the
    # partials and lses as the caller read them (aligned, on the request's device).
    run.addressed = addressed
    return run


def _allocator(t: torch.Tensor, dtype: torch.dtype):
    """`f(like)`: a new contiguous tensor of `like`'s shape in dtype, for tensors laid out as `t`
    (`empty_like` alone where t is one: its dtype and format keywords cost a third more)."""
    if not POISON_OUTPUTS and t.dtype == dtype and tuple(t.stride()) == contiguous_strides(tuple(t.shape)):
        return torch.empty_like
    return lambda like: new_output_like(like, dtype)


def _two_row_dims(t: torch.Tensor, lead: int) -> tuple[int, int] | None:
    """(stride of r // S1, of r % S1) of t's first `lead` dims, or None if the outer ones don't chain."""
    if lead == 0:
        return 0, 0
    shape, st = t.shape, t.stride()
    outer = [(shape[d], st[d]) for d in range(lead - 1) if shape[d] != 1]
    for (_, a), (size_b, b) in zip(outer, outer[1:]):
        if a != size_b * b:
            return None
    return (outer[-1][1] if outer else 0), st[lead - 1]


def _shared_strides(ts, lead):
    """One (stride0, stride1[, stride_d]) for every tensor of `ts`, or None (then copied)."""
    first = _two_row_dims(ts[0], lead)
    if first is None:
        return None
    for t in ts[1:]:
        if _two_row_dims(t, lead) != first or (t.dim() > lead and t.stride()[lead] != ts[0].stride()[lead]):
            return None
    return first


def _wide(*tensors, rows: int) -> bool:
    """Whether merge_kernel needs 64-bit offsets: a tensor's furthest element or the rows past 2**31 - 1."""
    reach = max(sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n) for t in tensors)
    return max(reach, rows) > INT32_MAX


def _row_args(outputs, lses, out, lse_out, lead: int) -> dict:
    """`merge_kernel`'s integer arguments by name, rows numbered in the partials' own order (a
    tile's rows adjacent: faster than head-major at every shape measured, docs/speed.md)."""
    y_st, z_st = _two_row_dims(out, lead), _two_row_dims(lse_out, lead)
    if y_st is None or z_st is None:
        raise ValueError("merge_states: the output tensors' row dims do not collapse into two strides")
    shape = out.shape
    (os0, os1), (ls0, ls1) = _two_row_dims(outputs[0], lead), _two_row_dims(lses[0], lead)
    return dict(n_rows=math.prod(shape[:-1]), D=shape[-1], S1=shape[lead - 1] if lead else 1, os0=os0, os1=os1,
                osd=outputs[0].stride(-1), ls0=ls0, ls1=ls1, ys0=y_st[0], ys1=y_st[1], ysd=out.stride(-1),
                zs0=z_st[0], zs1=z_st[1])
