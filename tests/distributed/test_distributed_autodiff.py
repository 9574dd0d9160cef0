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
    """One graph (fullgraph), forward and backward through AOTAutograd: with sinks and a bool
    mask that empties a row (the sharded path), without sinks (one rank: the same operator),
    with the default group and with a group object passed in."""
    sharded, local = _ops(op)
    x, _, sinks = _operands(gen)
    mask = torch.rand(x.shape, generator=gen) < 0.3
    mask[1, 2] = True
    kw = dict(scale=0.5, mask=mask) if op == "logsumexp" else dict(scale=0.5, mask=mask, empty_rows="uniform")
    for group, s in ((None, sinks), (dist.group.WORLD, None)):
        torch._dynamo.reset()
        fn = torch.compile(lambda x, s: sharded(x, -1, group=group, sinks=s, **kw), fullgraph=True,
                           backend="aot_eager")
        diff = (x.clone().requires_grad_(), None if s is None else s.clone().requires_grad_())
        got = fn(*diff)
        ref = (x.clone().requires_grad_(), None if s is None else s.clone().requires_grad_())
        want = local(ref[0], -1, sinks=ref[1], **kw)
        _close(got, want.detach())
        w = torch.randn(got.shape, generator=gen, dtype=torch.float64)
        _close(torch.autograd.grad(got, [t for t in diff if t is not None], w),
               torch.autograd.grad(want, [t for t in ref if t is not None], w))


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
