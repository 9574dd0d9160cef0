"""`anysoftmax.distributed` under torch.func (grad, vmap, vmap of grad), torch.compile
(fullgraph) and double backward. In one gloo process a call with sinks takes the sharded path,
whose values and gradients are the local op's. Across ranks, the conformance kit's mode cases
(`anysoftmax.testing.distributed`, run by test_distributed_gloo.py over 2 and 3 processes)
check them against the float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import anysoftmax
from helpers.distributed import one_rank  # noqa: F401  (a fixture)

OPS = ("softmax", "log_softmax", "logsumexp")


def _ops(op: str):
    """(the sharded op, the local op)."""
    import anysoftmax.distributed as asd

    return getattr(asd, op), getattr(anysoftmax, op)


def _operands(gen):
    x = torch.randn(2, 3, 9, generator=gen, dtype=torch.float64)
    mask = torch.randn(2, 3, 9, generator=gen, dtype=torch.float64)
    sinks = torch.randn(2, 3, 1, generator=gen, dtype=torch.float64)
    return x, mask, sinks


def _close(got, want):
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", OPS)
def test_torch_func_grad_vmap_and_vmap_of_grad(one_rank, gen, op):
    sharded, local = _ops(op)
    x, mask, sinks = _operands(gen)
    w = torch.randn(sharded(x, -1, mask=mask, sinks=sinks).shape, generator=gen, dtype=torch.float64)

    def loss(fn):
        return lambda x, m, s: (fn(x, -1, mask=m, sinks=s, softcap=5.0) * w).sum()

    args = (x, mask, sinks)
    _close(torch.func.grad(loss(sharded), argnums=(0, 1, 2))(*args),
           torch.func.grad(loss(local), argnums=(0, 1, 2))(*args))
    per_row = (lambda fn: lambda x, s: fn(x, -1, sinks=s, scale=0.5))
    _close(torch.func.vmap(per_row(sharded))(x, sinks), torch.func.vmap(per_row(local))(x, sinks))
    _close(torch.func.vmap(torch.func.grad(loss(sharded), argnums=(0, 2)), in_dims=(0, 0, 0))(x, mask, sinks),
           torch.func.vmap(torch.func.grad(loss(local), argnums=(0, 2)), in_dims=(0, 0, 0))(x, mask, sinks))


@pytest.mark.parametrize("op", OPS)
def test_torch_compile_fullgraph(one_rank, gen, op):
    """One graph (fullgraph), forward and backward through AOTAutograd, with the default group
    and with a group object passed in."""
    sharded, local = _ops(op)
    x, mask, sinks = _operands(gen)
    for group in (None, dist.group.WORLD):
        torch._dynamo.reset()
        fn = torch.compile(lambda x, s: sharded(x, -1, group=group, sinks=s, scale=0.5), fullgraph=True,
                           backend="aot_eager")
        xs, ss = x.clone().requires_grad_(), sinks.clone().requires_grad_()
        got = fn(xs, ss)
        want = local(x, -1, sinks=sinks, scale=0.5)
        _close(got, want)
        w = torch.randn(got.shape, generator=gen, dtype=torch.float64)
        xl, sl = x.clone().requires_grad_(), sinks.clone().requires_grad_()
        _close(torch.autograd.grad(got, (xs, ss), w),
               torch.autograd.grad(local(xl, -1, sinks=sl, scale=0.5), (xl, sl), w))


@pytest.mark.parametrize("op", OPS)
def test_double_backward_is_refused_never_silently_zero(one_rank, gen, op):
    """A second derivative would drop the terms that cross ranks: torch raises instead of
    returning a gradient that does not depend on x."""
    sharded, _ = _ops(op)
    x, mask, sinks = (t.requires_grad_() for t in _operands(gen))
    out = sharded(x, -1, mask=mask, sinks=sinks)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out, x, torch.ones_like(out), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.func.grad(lambda v: torch.func.grad(lambda u: sharded(u, -1, sinks=sinks.detach()).sum())(v).sum())(
            x.detach())
