"""vmap rules of anysoftmax's operators (`torch.vmap`, and torch.func transforms that batch).

Softmax along a dimension treats every other dimension as independent rows, so a batch
dimension is just one more: move it to the front, shift `dim` past it, call the operator once.
"""

from __future__ import annotations

import torch

from . import ops
from ..core.spec import SoftmaxSpec


def _physical_dim(x: torch.Tensor, dim: int, dtype=None, log: bool = False) -> int:
    """`dim` of the per-sample tensor (x without its leading batch dimension) as a dim of x,
    validated like an unbatched call (same errors, in the sample's terms)."""
    sample = torch.empty(x.shape[1:], dtype=x.dtype, device="meta")
    return SoftmaxSpec.from_tensor(sample, dim, dtype, log=log).dim + 1


def _batched_input(x: torch.Tensor, bdim: int) -> tuple[torch.Tensor, bool]:
    # Batch first; a 0-dim sample (a row of one) becomes a 1-element row.
    x = x.movedim(bdim, 0)
    return (x.unsqueeze(1), True) if x.dim() == 1 else (x, False)


def _forward_vmap(log: bool):
    op = ops.log_softmax_op if log else ops.softmax_op

    def rule(info, in_dims, x, dim, dtype=None, backend=None):
        if in_dims[0] is None:
            return op(x, dim, dtype, backend), None
        xb, scalar = _batched_input(x, in_dims[0])
        pdim = 1 if scalar else _physical_dim(xb, dim, dtype, log)
        out = op(xb, pdim, dtype, backend)
        return (out.squeeze(1) if scalar else out), 0
    return rule


def _backward_vmap(info, in_dims, grad, y, dim, log, backend=None):
    g_dim, y_dim = in_dims[0], in_dims[1]
    if g_dim is None and y_dim is None:
        return ops.softmax_backward_op(grad, y, dim, log, backend), None
    # Both batched in front; an unbatched one is broadcast (a stride-0 view, no copy).
    grad = grad.movedim(g_dim, 0) if g_dim is not None else grad.expand(info.batch_size, *grad.shape)
    y = y.movedim(y_dim, 0) if y_dim is not None else y.expand(info.batch_size, *y.shape)
    if y.dim() == 1:
        return ops.softmax_backward_op(grad.unsqueeze(1), y.unsqueeze(1), 1, log, backend).squeeze(1), 0
    return ops.softmax_backward_op(grad, y, _physical_dim(y, dim, log=log), log, backend), 0


softmax_vmap = _forward_vmap(False)
log_softmax_vmap = _forward_vmap(True)
softmax_backward_vmap = _backward_vmap


# ---- the fused family -------------------------------------------------------------------------

def _front(t: torch.Tensor | None, bdim, batch: int, sample_ndim: int, full: bool) -> torch.Tensor | None:
    """`t` with its batch dim in front. `full`: t has the sample's rank (x, y, grad, p_sink): an
    unbatched one is broadcast (stride 0). Otherwise t broadcasts against the sample (mask,
    sinks): an unbatched one broadcasts as it is; a batched one gets size-1 dims after the batch
    dim up to the sample's rank, so right-aligned broadcasting still lines up."""
    if t is None:
        return None
    if bdim is None:
        return t.expand(batch, *t.shape) if full else t
    t = t.movedim(bdim, 0)
    missing = sample_ndim - (t.dim() - 1)
    return t[(slice(None),) + (None,) * missing] if missing > 0 else t


def _scalar_rows(*tensors):
    # A 0-dim sample is a row of one: give every batched tensor a trailing size-1 dim.
    return tuple(None if t is None else t.unsqueeze(-1) for t in tensors)


def softmax_fused_vmap(info, in_dims, x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log,
                       backend=None):
    xd, md, sd = in_dims[0], in_dims[1], in_dims[2]
    if xd is None and md is None and sd is None:
        return ops.softmax_fused_op(x, mask, sinks, dim, dtype, scale, softcap, causal, empty_rows, log, backend), (None, None)
    n = info.batch_size
    sample_ndim = x.dim() - (xd is not None)
    xb = _front(x, xd, n, sample_ndim, True)
    mb, sb = _front(mask, md, n, sample_ndim, False), _front(sinks, sd, n, sample_ndim, False)
    scalar = sample_ndim == 0
    if scalar:
        xb, mb, sb = _scalar_rows(xb, mb, sb)
        pdim = 1
    else:
        pdim = _physical_dim(xb, dim, dtype, log)
    y, p = ops.softmax_fused_op(xb, mb, sb, pdim, dtype, scale, softcap, causal, empty_rows, log, backend)
    if scalar:
        y = y.squeeze(1)
        p = p.squeeze(1) if sinks is not None else p
    return (y, p), (0, 0 if sinks is not None else None)


def softmax_fused_backward_vmap(info, in_dims, grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows,
                                log, backend=None):
    gd, yd, xd, md, sd, pd = in_dims[:6]
    if all(d is None for d in (gd, yd, xd, md, sd, pd)):
        return ops.softmax_fused_backward_op(grad, y, x, mask, sinks, p, dim, scale, softcap, causal, empty_rows, log,
                                             backend), (None, None)
    n = info.batch_size
    ref, ref_d = (y, yd) if yd is not None else (grad, gd)
    sample_ndim = ref.dim() - (ref_d is not None)
    gb, yb, xb = (_front(t, d, n, sample_ndim, True) for t, d in ((grad, gd), (y, yd), (x, xd)))
    has_sinks = sinks is not None
    pb = _front(p, pd, n, sample_ndim, True) if has_sinks else p
    mb, sb = _front(mask, md, n, sample_ndim, False), _front(sinks, sd, n, sample_ndim, False)
    scalar = sample_ndim == 0
    if scalar:
        gb, yb, xb, mb, sb = _scalar_rows(gb, yb, xb, mb, sb)
        pb = pb.unsqueeze(-1) if has_sinks else pb
        pdim = 1
    else:
        pdim = _physical_dim(yb, dim, log=log)
    dx, ds = ops.softmax_fused_backward_op(gb, yb, xb, mb, sb, pb, pdim, scale, softcap, causal, empty_rows, log,
                                           backend)
    if scalar:
        dx = dx.squeeze(1)
        ds = ds.squeeze(1) if has_sinks else ds
    return (dx, ds), (0, 0 if has_sinks else None)
