"""`anysoftmax.distributed` over gloo on the CPU: 1, 2, 3 and 4 processes each run the
conformance set (`anysoftmax.testing.distributed`: uneven and empty shards, every dtype,
forward and backward, the fused keywords, special values, torch.func and torch.compile) once;
one process checks the errors, rows with nothing kept but a sink on every backend, and the
collectives each call makes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from anysoftmax.distributed import collective
from anysoftmax.testing.distributed import spawn_checks
from helpers import backends_that_run
from helpers.distributed import one_rank  # noqa: F401  (a fixture)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_conformance_over_gloo(world, seed):
    # (one rank: the local op without sinks, the sharded path with them. 1 and 4 ranks: float32
    # and bfloat16, eager only; 2 and 3 ranks: every dtype, and torch.func, vmap, torch.compile)
    from anysoftmax.testing.distributed import CASES

    quick = world in (1, 4)
    failures = spawn_checks(world, seed=seed, quick=quick, cases=[c for c in CASES if not quick or c.mode is None],
                            timeout=240)
    assert failures == [], f"seed {seed}:\n" + "\n".join(failures)


def test_triton_backend_over_gloo(seed):
    """The local values come from the chosen backend's fused kernel (here the triton kernels,
    interpreted): the sink that stands for the other ranks goes through it."""
    from anysoftmax.testing.distributed import CASES

    failures = spawn_checks(2, "triton", seed=seed, dtypes=(torch.float32,), ops=("softmax", "log_softmax",
                                                                                   "logsumexp"),
                            cases=[c for c in CASES if c.name in ("plain", "bool-nan-sinks", "additive-sinks",
                                                                  "nan-posinf", "bool-rows-sinks")],
                            timeout=240)
    assert failures == [], f"seed {seed}:\n" + "\n".join(failures)


@pytest.mark.parametrize("backend", backends_that_run("cpu", torch.float32, fused={
    "mask": torch.zeros(6, dtype=torch.bool), "sinks": torch.zeros(3, 1, 1)}))
def test_logsumexp_of_a_row_with_nothing_kept_but_its_sink_is_the_sink(one_rank, gen, backend):
    """`anysoftmax.logsumexp`'s rule, sharded: a row a bool mask leaves empty on every rank
    gives its sink s (not -inf), and the sink's gradient there is the row's gradient (d s/d s)."""
    import anysoftmax.distributed as asd
    from anysoftmax.core.lse_merge import logsumexp_formula
    from anysoftmax.core.spec import SoftmaxSpec

    x = torch.randn(4, 3, 10, generator=gen, requires_grad=True)
    mask = torch.rand(4, 3, 10, generator=gen) < 0.5
    mask[0] = True
    mask[2, 1] = True
    sinks = torch.randn(4, 3, 1, generator=gen, requires_grad=True)
    got = asd.logsumexp(x, -1, mask=mask, sinks=sinks, scale=0.5, backend=backend)
    g = torch.randn(got.shape, generator=gen)
    dx, ds = torch.autograd.grad(got, (x, sinks), g)
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(mask=mask, sinks=sinks, scale=0.5))
    x64, s64 = x.detach().double().requires_grad_(), sinks.detach().double().requires_grad_()
    want = logsumexp_formula(x64, spec.variant, 2, mask, s64, torch.float64).squeeze(2)
    want_dx, want_ds = torch.autograd.grad(want, (x64, s64), g.double())
    assert torch.equal(got[0], sinks[0, :, 0].detach()) and got[2, 1] == sinks[2, 1, 0]
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=2e-6)
    assert torch.equal(ds[0, :, 0], g[0]) and ds[2, 1, 0] == g[2, 1]
    torch.testing.assert_close(ds.double(), want_ds, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(dx.double(), want_dx, rtol=2e-6, atol=2e-6)


def test_errors_name_the_argument(one_rank, gen):
    import anysoftmax.distributed as asd

    x = torch.randn(3, 8, generator=gen)
    with pytest.raises(ValueError, match="causal"):
        asd.softmax(x, -1, causal=True)
    with pytest.raises(ValueError, match="mask"):
        asd.log_softmax(x, -1, mask=torch.zeros(4, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="sinks"):
        asd.softmax(x, -1, sinks=torch.zeros(3, 8))
    with pytest.raises(ValueError, match="empty_rows"):
        asd.softmax(x, -1, empty_rows="ones")
    with pytest.raises(ValueError, match="softcap"):
        asd.logsumexp(x, -1, softcap=-1.0)
    with pytest.raises(IndexError, match="dim"):
        asd.softmax(x, 2)
    with pytest.raises(TypeError, match="dtype"):
        asd.softmax(x.to(torch.int32), -1)
    with pytest.raises(ValueError, match="0-dim"):
        asd.softmax(torch.tensor(1.0), 0)


def test_uninitialised_group_is_refused():
    import anysoftmax.distributed as asd

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        asd.softmax(torch.randn(2, 3), -1)


def test_one_gather_forward_one_reduce_backward(one_rank, gen, monkeypatch):
    """Forward: one gather of row states; backward: one sum of one float per row (softmax,
    log_softmax), none for logsumexp. With one rank, the results are the local ones."""
    import anysoftmax
    import anysoftmax.distributed as asd

    calls = []
    gather, reduce = collective.gather_states, collective.sum_rows

    def counted_gather(state, world, group):
        calls.append(("gather", tuple(state.shape)))
        return gather(state, world, group)

    def counted_reduce(t, world, group):
        calls.append(("sum", tuple(t.shape)))
        return reduce(t, world, group)

    from anysoftmax.distributed import functions, states
    monkeypatch.setattr(states, "gather_states", counted_gather)
    monkeypatch.setattr(functions, "sum_rows", counted_reduce)
    x = torch.randn(4, 5, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(5, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    for fn, local in ((asd.softmax, anysoftmax.softmax), (asd.log_softmax, anysoftmax.log_softmax)):
        calls.clear()
        y = fn(x, -1, scale=0.5, sinks=sinks)
        assert calls == [("gather", (20,))]
        dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad(y, (x, sinks), dy)
        assert calls == [("gather", (20,)), ("sum", (4, 5, 1))]
        want_y = local(x, -1, scale=0.5, sinks=sinks)
        torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-14)
        for a, b in zip(got, torch.autograd.grad(want_y, (x, sinks), dy)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    calls.clear()
    lse = asd.logsumexp(x, -1, sinks=sinks, keepdim=True)
    got = torch.autograd.grad(lse.sum(), (x, sinks))
    assert calls == [("gather", (20,))] and lse.shape == (4, 5, 1)
    want = torch.logsumexp(torch.cat([x, sinks.expand(4, 5, 1)], -1), -1, keepdim=True)
    torch.testing.assert_close(lse, want, rtol=1e-12, atol=0)
    for a, b in zip(got, torch.autograd.grad(want.sum(), (x, sinks))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_one_rank_without_sinks_runs_the_local_op(one_rank, gen, monkeypatch):
    """A group of one rank holds the whole dim: without sinks the call is the local op itself
    (no collective, x read once), with its values and gradients, empty_rows included."""
    import anysoftmax
    import anysoftmax.distributed as asd
    from anysoftmax.distributed import functions, states

    def no_collective(*args):
        raise AssertionError("a collective in a group of one rank without sinks")

    monkeypatch.setattr(states, "gather_states", no_collective)
    monkeypatch.setattr(functions, "sum_rows", no_collective)
    x = torch.randn(4, 5, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(4, 5, 16, generator=gen) < 0.4
    mask[0, 0] = True  # (an empty row)
    dy = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    for fn, local in ((asd.softmax, anysoftmax.softmax), (asd.log_softmax, anysoftmax.log_softmax)):
        for kw in (dict(), dict(scale=0.5, mask=mask, softcap=4.0, empty_rows="uniform")):
            y = fn(x, -1, **kw)
            want = local(x, -1, **kw)
            assert torch.equal(y, want)
            assert torch.equal(torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(want, x, dy)[0])
    lse = asd.logsumexp(x, 1, mask=mask.transpose(1, 2).contiguous().transpose(1, 2), keepdim=True)
    assert torch.equal(lse, anysoftmax.logsumexp(x, 1, mask=mask, keepdim=True))
    with pytest.raises(AssertionError, match="a collective"):  # (sinks: the sharded path)
        asd.softmax(x, -1, sinks=torch.zeros(4, 5, 1, dtype=torch.float64))


def test_excluded_logits_never_reach_the_softcap_gradient(one_rank, gen):
    """The sharded path (one rank with sinks) as the local op: NaN or inf at a position the bool
    mask excludes gives a gradient of 0 there, with softcap as without."""
    import anysoftmax
    import anysoftmax.distributed as asd

    x = torch.randn(4, 5, 16, generator=gen, dtype=torch.float64)
    mask = torch.rand(4, 5, 16, generator=gen) < 0.3
    poisoned = x.masked_fill(mask, float("nan"))
    poisoned[..., ::2] = poisoned[..., ::2].masked_fill(mask[..., ::2], float("inf"))
    sinks = torch.randn(5, 1, generator=gen, dtype=torch.float64)
    for fn, local in ((asd.softmax, anysoftmax.softmax), (asd.log_softmax, anysoftmax.log_softmax),
                      (asd.logsumexp, anysoftmax.logsumexp)):
        got_x, want_x = poisoned.clone().requires_grad_(), x.clone().requires_grad_()
        y = fn(got_x, -1, scale=0.5, softcap=3.0, mask=mask, sinks=sinks)
        want = local(want_x, -1, scale=0.5, softcap=3.0, mask=mask, sinks=sinks)
        dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
        if y.shape == mask.shape:
            dy = dy.masked_fill(mask, 0.0)  # (log_softmax: -inf constants there)
        got, = torch.autograd.grad(y, got_x, dy)
        assert torch.equal(got[mask], torch.zeros_like(got[mask])), fn.__name__
        torch.testing.assert_close(got, torch.autograd.grad(want, want_x, dy)[0], rtol=1e-10, atol=1e-12)


def test_a_repeated_request_is_checked_once_and_never_reused_stale(one_rank, gen):
    """A request is validated once (memoised by its key); operands that differ only in
    strides or offset are other requests, and scale's and softcap's values are the call's
    (checked on every call): each result is the local one (one rank)."""
    import anysoftmax
    import anysoftmax.distributed as asd
    from anysoftmax.distributed import calls

    base = torch.randn(6, 40, generator=gen, dtype=torch.float64)
    xs = [base[:4, :16].clone(), base[1:5, 3:19], torch.randn(16, 4, generator=gen, dtype=torch.float64).t()]
    full = torch.rand(4, 16, generator=gen) < 0.3
    full[0] = True  # (row 0 empty: empty_rows applies)
    masks = [full, full[:, :1].expand(4, 16), full.t().contiguous().t()]
    sinks = torch.randn(4, 1, generator=gen, dtype=torch.float64)
    calls.memo.clear()
    for _ in range(2):
        for x in xs:
            for m in masks:
                for scale in (0.5, 2.0):
                    kw = dict(scale=scale, mask=m, sinks=sinks, empty_rows="uniform")
                    torch.testing.assert_close(asd.softmax(x, -1, **kw), anysoftmax.softmax(x, -1, **kw),
                                               rtol=1e-12, atol=1e-14)
                    got = asd.logsumexp(x, 1, scale=scale, mask=m, softcap=3.0 / scale)
                    want = anysoftmax.logsumexp(x, 1, scale=scale, mask=m, softcap=3.0 / scale)
                    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert len(calls.memo) == 2 * len(xs) * len(masks)
    with pytest.raises(ValueError, match="softcap"):  # (a memoised request, a new value)
        asd.logsumexp(xs[0], 1, scale=1.0, mask=masks[0], softcap=-1.0)
    y = asd.log_softmax(xs[0].float(), -1, dtype=torch.float64)
    assert y.dtype == torch.float64 and asd.log_softmax(xs[0].float(), -1, dtype=torch.float64).dtype == torch.float64
    torch.testing.assert_close(y, anysoftmax.log_softmax(xs[0].float(), -1, dtype=torch.float64))


def test_import_anysoftmax_leaves_distributed_unloaded():
    code = ("import sys, anysoftmax; assert 'anysoftmax.distributed' not in sys.modules; "
            "assert anysoftmax.distributed.softmax is not None")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_ranks_that_disagree_on_the_rows_are_named_in_debug_mode(tmp_path, monkeypatch):
    """The contract (the same rows on every rank) is not checked by default; with
    TORCH_DISTRIBUTED_DEBUG=DETAIL, as docs/semantics.md says, torch names the mismatch."""
    import torch.multiprocessing as mp

    from helpers.distributed import mismatched_rows

    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")  # (read by the spawned ranks)
    ctx = mp.start_processes(mismatched_rows, args=(f"file://{tmp_path}/rendezvous", str(tmp_path / "err")),
                             nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):  # (False until every rank is done)
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks hung instead of naming the mismatch")
    for rank in (0, 1):
        message = (tmp_path / f"err.{rank}").read_text()
        assert "mismatch between collectives" in message and "TensorShape=[3]" in message, message
