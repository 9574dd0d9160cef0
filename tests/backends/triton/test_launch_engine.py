"""The one launch engine (`_triton_common/launcher.bind_kernel`) under every kernel family beside
the softmax's (tests/backends/triton/test_named_arguments.py): logsumexp's `lse_kernel`,
merge_states with more partials than one launch takes, and the sharded kernel. After a
request's first launch, its later calls go through Triton's low-level launcher (a recorder
stands in for it) with the call's addresses, the request's integers, the call's own integers
and floats, and the constexprs; an active launch hook sends them back through Triton's own path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import anysoftmax
from anysoftmax.backends._triton_common.plan import runtime_params
from anysoftmax.testing.compare import compare_logsumexp, compare_merge
from anysoftmax.core.lse_merge import MergeSpec, logsumexp_request
from anysoftmax.core.registry import get_backend
from helpers import active_launch_hook, bound_launchers, runnable_backends
from helpers.distributed import one_rank_sharded_launcher

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")


class _Recorder:
    """Stands in for a compiled kernel's launcher (Triton's generic one): records its arguments."""

    def __init__(self):
        self.seen = []

    def __call__(self, *args):
        self.seen.append(args)


def _prime(launch, args) -> _Recorder:
    """The fast path a GPU process has after `launch`'s first launch, around a recorder."""
    rec = _Recorder()
    launch.prime([SimpleNamespace(run=rec, function="fn", packed_metadata="packed")] * len(launch.binding.metas),
                 args, stream_of=lambda index: 7)
    return rec


def _split(launch, got: tuple) -> tuple:
    """(grid, stream, pointers, integers, floats, constexprs) of one recorded launch."""
    b = launch.binding
    assert got[4:9] == ("fn", "packed", None, None, None)
    rest = got[9:]
    n_p, n_i, n_f = len(b.pointer_names), len(b.ints), len(b.floats)
    return got[0], got[3], rest[:n_p], rest[n_p:n_p + n_i], rest[n_p + n_i:n_p + n_i + n_f], rest[n_p + n_i + n_f:]


def test_lse_kernel_launches_through_the_fast_path(gen):
    """A reduction over a non-innermost dim (a column plan: `lse_kernel`) is bound once; a later
    call passes its own addresses, and the kernel run from exactly what the recorder was given
    equals the float64 reference."""
    x = torch.randn(40, 64, generator=gen)
    spec, operands = logsumexp_request(x, 0)
    run = get_backend("triton").logsumexp_launcher(x, spec, operands)
    assert compare_logsumexp(run(x, operands), x, spec).ok  # (the first call binds: interpreted)
    (launch,) = bound_launchers(run)
    rec = _prime(launch, (x, torch.empty(1, 64), None, None, None))
    fresh = torch.randn(40, 64, generator=gen) * 3
    out = run(fresh, operands)
    (got,) = rec.seen
    grid, stream, ptrs, ints, floats, tail = _split(launch, got)
    assert stream == 7 and ptrs == (fresh.data_ptr(), out.data_ptr(), fresh.data_ptr(), out.data_ptr(),
                                    fresh.data_ptr())
    assert ints == tuple(launch.binding.ints.values()) and floats == launch.binding.values
    kernel = launch.binding.kernel
    out.fill_(float("nan"))
    tensors = {fresh.data_ptr(): fresh, out.data_ptr(): out}
    kernel[(grid,)](*[tensors[p] for p in ptrs], *ints, *floats, *tail)  # (constexprs last, in order)
    assert compare_logsumexp(out, fresh, spec).ok
    with active_launch_hook(launch.state["fast"]) as active:
        if active:
            rec.seen.clear()
            assert compare_logsumexp(run(fresh, operands), fresh, spec).ok and rec.seen == []


def test_merge_of_many_partials_binds_each_group_once(gen):
    """More partials than one launch takes (11 > MAX_K = 8) merge in two groups, each bound on
    the first call: later calls launch both through the fast path, the second reading the
    first's intermediate."""
    outputs = [torch.randn(3, 4, 8, generator=gen) for _ in range(11)]
    lses = [torch.randn(3, 4, generator=gen) for _ in range(11)]
    spec = MergeSpec.from_tensors(outputs, lses)
    run = get_backend("triton").merge_states_launcher(outputs, lses, spec)
    assert compare_merge(*run(outputs, lses, None, None), outputs, lses).ok
    first, last = sorted(bound_launchers(run), key=lambda launch: -launch.binding.metas[0]["K"])
    assert [launch.binding.metas[0]["K"] for launch in (first, last)] == [8, 4]
    inter = (torch.empty(3, 4, 8), torch.empty(3, 4))
    recs = [_prime(first, (*outputs[:8], *lses[:8], *inter)), _prime(last, (*inter, *outputs[8:], *lses[8:], *inter))]
    out, lse = run(outputs, lses, None, None)
    (a,), (b,) = recs[0].seen, recs[1].seen
    pa, pb = _split(first, a)[2], _split(last, b)[2]
    assert pa[:8] == tuple(t.data_ptr() for t in outputs[:8]) and pa[8:16] == tuple(t.data_ptr() for t in lses[:8])
    # The second group: the first's results (pointers 16, 17 of its launch), then the last three partials.
    assert pb[:4] == (pa[16], *(t.data_ptr() for t in outputs[8:])) and pb[8:12] == (pa[17], *(t.data_ptr()
                                                                                              for t in lses[8:]))
    assert pb[16:] == (out.data_ptr(), lse.data_ptr())


def test_sharded_kernel_passes_each_calls_epoch_and_stands_aside_for_hooks(gen):
    """The sharded kernel (one rank here: its mailbox waits on no peer) through the engine: the
    call's epoch and mailbox half reach the launch as integers of their own, the request's
    integers around them; with a launch hook active the call runs through Triton's own path."""
    x = torch.randn(3, 24, generator=gen)
    run = one_rank_sharded_launcher(x)
    words, peers = run.mailbox
    y, _ = run(x, None, None, 0.5, None, 1, 0)
    torch.testing.assert_close(y, torch.softmax(x.double() * 0.5, 1).float())
    (launch,) = bound_launchers(run)
    rec = _prime(launch, (x, y, None, None, None, words, peers))
    y, _ = run(x, None, None, 0.5, None, 6, 8)
    for got in rec.seen:  # (one launch per phase)
        _, stream, ptrs, ints, floats, tail = _split(launch, got)
        assert ptrs[:5] == (x.data_ptr(), y.data_ptr(), x.data_ptr(), x.data_ptr(), y.data_ptr())
        assert ptrs[7:] == (words.data_ptr(), peers.data_ptr())
        names = runtime_params(launch.binding.kernel)[len(ptrs):len(ptrs) + len(ints)]
        assert dict(zip(names, ints)) == dict(launch.binding.ints, epoch=6, slot_base=8)
        assert floats == (0.5, 0.0, 1.0, 0.0)
    assert len(rec.seen) == len(launch.binding.metas)
    with active_launch_hook(launch.state["fast"]) as active:
        if active:
            rec.seen.clear()
            y, _ = run(x, None, None, 0.5, None, 7, 0)
            assert rec.seen == []
            torch.testing.assert_close(y, torch.softmax(x.double() * 0.5, 1).float())


def test_every_backend_entry_point_keeps_working(gen):
    """The public ops through the engine, on fresh data: logsumexp over a non-innermost dim and
    merge_states of many partials, twice each (bind, then the bound call)."""
    for _ in range(2):
        x = torch.randn(24, 6, 5, generator=gen)
        got = anysoftmax.logsumexp(x, 0, keepdim=True, backend="triton")
        assert compare_logsumexp(got, x, logsumexp_request(x, 0)[0]).ok
        outputs = [torch.randn(2, 3, 4, generator=gen).bfloat16() for _ in range(9)]
        lses = [torch.randn(2, 3, generator=gen) for _ in range(9)]
        assert compare_merge(*anysoftmax.merge_states(outputs, lses, backend="triton"), outputs, lses).ok


def test_split_scratch_is_kept_per_stream_and_each_call_computes_its_own(gen):
    """A split launch's partial statistics and row counters are kept by its launcher, one pair
    per stream (no allocation per call): the same buffers come back, and calls of one request on
    new values (each one's statistics far from the last's) still match the reference."""
    from anysoftmax.backends._triton_common.launcher import scratch_maker
    from anysoftmax.backends._triton_common.plan import make_plan
    from anysoftmax.backends._triton_common.softmax_launchers import forward_layout
    from anysoftmax.backends.triton import heuristics
    from anysoftmax.core.spec import SoftmaxSpec
    from anysoftmax.testing import check_backward, check_forward
    from helpers import LONG_ROW_PATHS_BACKWARD

    if "triton" not in runnable_backends("cpu"):
        pytest.skip("the triton backend does not run here (no GPU and no Triton interpreter)")
    x = torch.randn(3, 300, generator=gen)
    layout = forward_layout(x, SoftmaxSpec.from_tensor(x, -1))[2]
    make = scratch_maker(make_plan("split", 1, 64, 1, chunks=5), layout, torch.float32)
    first = make(x.device)
    assert all(a is b for a, b in zip(first, make(x.device)))
    with heuristics.override(**LONG_ROW_PATHS_BACKWARD["split"]):
        for scale in (1.0, 40.0, -7.0, 0.01):
            x = torch.randn(3, 300, generator=gen) * scale
            check_forward(x, -1, backend="triton")
            check_backward(x, -1, backend="triton")
