"""The gloo tests' fixture of one rank, and the workers of those that need ranks to disagree
(`tests/distributed`): spawned processes import them from here."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def one_rank(tmp_path):
    """A default process group of one gloo rank in this process (removed after the test): a
    call with sinks takes the sharded path there, whose result is the local op's."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def mismatched_rows(rank: int, init: str, out: str) -> None:
    """Rank r calls with r more rows than rank 0; writes the error each rank got to out.<r>."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    import anysoftmax.distributed as asd

    try:
        asd.softmax(torch.randn(3 + rank, 5), -1)
        message = "no error"
    except RuntimeError as exc:
        message = str(exc)
    with open(f"{out}.{rank}", "w") as f:
        f.write(message)
    dist.destroy_process_group()


# The ops that read a tensor's value on the host: on a GPU each waits for the stream, so one
# between the collectives would serialise the ranks.
HOST_SYNCS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero", "aten::tolist")
COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::")


def _counts(fn, local_names: tuple[str, ...]):
    """Run `fn` once under torch.profiler: (collectives by name, host syncs by name outside the
    `local_names` ranges, host syncs inside them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    collectives, ours, local = {}, {}, {}
    for e in prof.events():
        if e.name.startswith(COLLECTIVE_PREFIXES):
            collectives[e.name] = collectives.get(e.name, 0) + 1
        elif e.name in HOST_SYNCS:
            parent, inside = e.cpu_parent, False
            while parent is not None:
                inside = inside or parent.name in local_names
                parent = parent.cpu_parent
            where = local if inside else ours
            where[e.name] = where.get(e.name, 0) + 1
    return collectives, ours, local


def profiled_calls(rank: int, init: str, out: str) -> None:
    """For each call form: the collectives and host syncs of one forward and of one backward
    (after a warm-up call), written as JSON to out.<rank>. The local fused softmax and
    logsumexp run inside profiler ranges named "local": syncs there are the backend's."""
    import json

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    import anysoftmax.distributed as asd
    from anysoftmax.distributed import functions, states

    def ranged(fn):
        def run(*args, **kwargs):
            with torch.profiler.record_function("local"):
                return fn(*args, **kwargs)
        return run

    functions._local_softmax = ranged(functions._local_softmax)
    states._local_lse = ranged(states._local_lse)
    g = torch.Generator().manual_seed(rank)
    mask = torch.rand(4, 9, generator=g) < 0.5
    mask[0] = True  # (row 0 is empty on this rank: empty on both)
    forms = {
        "softmax": (asd.softmax, {}),
        "log_softmax-scale-softcap": (asd.log_softmax, {"scale": 0.5, "softcap": 3.0}),
        "softmax-sinks": (asd.softmax, {"sinks": torch.randn(4, 1, generator=g)}),
        "softmax-bool-nan": (asd.softmax, {"mask": mask, "empty_rows": "nan"}),
        "softmax-bool-uniform": (asd.softmax, {"mask": mask, "empty_rows": "uniform"}),
        "softmax-additive": (asd.softmax, {"mask": torch.randn(4, 9, generator=g)}),
        "logsumexp-sinks": (asd.logsumexp, {"sinks": torch.randn(4, 1, generator=g)}),
    }
    result = {}
    for name, (fn, kw) in forms.items():
        x = torch.randn(4, 9, generator=g, requires_grad=True)
        fn(x, -1, **kw).sum().backward()  # warm-up (plans, memos)
        y = None

        def forward():
            nonlocal y
            y = fn(x, -1, **kw)

        inference = _counts(lambda: fn(x.detach(), -1, **kw), ("local",))
        fwd = _counts(forward, ("local",))
        bwd = _counts(lambda: y.backward(torch.ones_like(y)), ("local",))
        result[name] = {"inference": inference, "forward": fwd, "backward": bwd}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
