"""vmap rules of anysoftmax's operators (`torch.vmap`, and torch.func transforms that batch).

Softmax along a dimension treats every other dimension as independent rows, so a batch
dimension is just one more: move it to the front, shift `dim` past it, call the operator once.
"""

from __future__ import annotations

import torch

from . import ops
from .core.spec import SoftmaxSpec


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
