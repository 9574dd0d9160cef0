"""vmap rules of the softmax operators: a batch dim is one more row dim, so it is moved to the
front, `dim` shifted past it, and the operator called once.
"""

from __future__ import annotations

import torch

from . import ops
from ..core.spec import SoftmaxSpec


def _physical_dim(x: torch.Tensor, dim: int, dtype=None, log: bool = False) -> int:
    """`dim` of a sample (x without its leading batch dim) as a dim of x, validated as unbatched."""
    sample = torch.empty(x.shape[1:], dtype=x.dtype, device="meta")
    return SoftmaxSpec.from_tensor(sample, dim, dtype, log=log).dim + 1


def front(t: torch.Tensor | None, bdim, batch: int, sample_ndim: int, full: bool = True) -> torch.Tensor | None:
    """`t` with its batch dim in front (None stays None), then size-1 dims up to the sample's rank
    (right-aligned broadcasting still lines up). An unbatched `t` is expanded over the batch, or
    with `full` False (an operand that broadcasts: mask, sinks) passed as it is."""
    if t is None:
        return None
    if bdim is None:
        if not full:
            return t
        t = t.expand(batch, *t.shape)
    else:
        t = t.movedim(bdim, 0)
    missing = sample_ndim - (t.dim() - 1)
    return t[(slice(None),) + (None,) * missing] if missing > 0 else t


def _scalar_rows(*tensors):
    # A 0-dim sample is a row of one: give every batched tensor a trailing size-1 dim.
    return tuple(None if t is None else t.unsqueeze(-1) for t in tensors)


def _unbatch(out, scalar: bool, has_sinks: bool):
    # (out, per-row statistic) back from a 0-dim sample's row of one; the statistic's batch dim.
    a, b = out
    if scalar:
        a, b = a.squeeze(1), (b.squeeze(1) if has_sinks else b)
    return (a, b), (0, 0 if has_sinks else None)


def _padded(in_dims, n: int) -> tuple:
    # A call of an operator omits its trailing arguments equal to their defaults (backend=None
    # last of all), and its vmap rule then gets fewer in_dims: those are unbatched.
    return (*in_dims, *(None,) * (n - len(in_dims)))


def softmax_vmap(info, in_dims, x, dim, dtype=None, log=False, mask=None, sinks=None, scale=None, softcap=None,
                 causal="none", empty_rows="zero", backend=None):
    in_dims = _padded(in_dims, 11)
    xd, md, sd = in_dims[0], in_dims[4], in_dims[5]
    tail = (scale, softcap, causal, empty_rows, backend)
    if xd is None and md is None and sd is None:
        return ops.softmax_op(x, dim, dtype, log, mask, sinks, *tail), (None, None)
    n = info.batch_size
    sample_ndim = x.dim() - (xd is not None)
    xb = front(x, xd, n, sample_ndim)
    mb, sb = front(mask, md, n, sample_ndim, False), front(sinks, sd, n, sample_ndim, False)
    scalar = sample_ndim == 0
    if scalar:
        xb, mb, sb = _scalar_rows(xb, mb, sb)
    pdim = 1 if scalar else _physical_dim(xb, dim, dtype, log)
    return _unbatch(ops.softmax_op(xb, pdim, dtype, log, mb, sb, *tail), scalar, sinks is not None)


def softmax_backward_vmap(info, in_dims, grad, y, dim, log=False, x=None, p_sink=None, mask=None, sinks=None,
                          scale=None, softcap=None, causal="none", empty_rows="zero", backend=None):
    in_dims = _padded(in_dims, 13)
    gd, yd, xd, pd, md, sd = in_dims[0], in_dims[1], in_dims[4], in_dims[5], in_dims[6], in_dims[7]
    tail = (scale, softcap, causal, empty_rows, backend)
    if all(d is None for d in (gd, yd, xd, pd, md, sd)):
        return ops.softmax_backward_op(grad, y, dim, log, x, p_sink, mask, sinks, *tail), (None, None)
    n = info.batch_size
    ref, ref_d = (y, yd) if yd is not None else (grad, gd)
    sample_ndim = ref.dim() - (ref_d is not None)
    gb, yb, xb = (front(t, d, n, sample_ndim) for t, d in ((grad, gd), (y, yd), (x, xd)))
    has_sinks = sinks is not None
    pb = front(p_sink, pd, n, sample_ndim) if has_sinks else None
    mb, sb = front(mask, md, n, sample_ndim, False), front(sinks, sd, n, sample_ndim, False)
    scalar = sample_ndim == 0
    if scalar:
        gb, yb, xb, pb, mb, sb = _scalar_rows(gb, yb, xb, pb, mb, sb)
    pdim = 1 if scalar else _physical_dim(yb, dim, log=log)
    return _unbatch(ops.softmax_backward_op(gb, yb, pdim, log, xb, pb, mb, sb, *tail), scalar, has_sinks)
