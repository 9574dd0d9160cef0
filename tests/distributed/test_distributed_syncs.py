"""What one call of `anysoftmax.distributed` costs beyond its kernels, read from torch.profiler
over two gloo ranks: exactly one collective per forward (the tensor form of the all-gather,
never the list form) and one per backward (none for logsumexp), and no op that reads a value
on the host in the package's own code (on a GPU such a read waits for the stream, and the
ranks' collectives serialise behind it). The local fused softmax and logsumexp run inside
profiler ranges: what the backend does there is the backend's (the torch backend reads
whether a bool mask left a row empty)."""

from __future__ import annotations

import json
import time

import pytest
import torch.multiprocessing as mp

from helpers.distributed import profiled_calls


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profiled")
    ctx = mp.start_processes(profiled_calls, args=(f"file://{tmp}/rendezvous", str(tmp / "out")), nprocs=2,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the profiled ranks hung")
    return [json.loads((tmp / f"out.{rank}").read_text()) for rank in (0, 1)]


FORMS = ("softmax", "log_softmax-scale-softcap", "softmax-sinks", "softmax-bool-nan", "softmax-bool-uniform",
         "softmax-additive", "logsumexp-sinks")


def _dispatched(collectives: dict) -> dict:
    # One c10d:: op per collective whatever the process group's backend (gloo adds its own record).
    return {k: v for k, v in collectives.items() if k.startswith("c10d::")}


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("form", FORMS)
def test_one_collective_per_pass_and_no_host_sync(counts, form, rank):
    got = counts[rank][form]
    for phase in ("inference", "forward"):
        collectives, ours, _ = got[phase]
        assert _dispatched(collectives) == {"c10d::_allgather_base_": 1}, (phase, collectives)
        assert ours == {}, f"{phase}: host syncs in anysoftmax.distributed's own code: {ours}"
    collectives, ours, _ = got["backward"]
    want = {} if form.startswith("logsumexp") else {"c10d::allreduce_": 1}
    assert _dispatched(collectives) == want, collectives
    assert ours == {}, f"backward: host syncs in anysoftmax.distributed's own code: {ours}"


def test_a_group_that_refuses_the_tensor_form_takes_the_list_form_from_then_on(monkeypatch):
    """gloo of some torch versions lacks the tensor-form all-gather: the refusal is met once
    per group, then that group takes the list form (into views of one tensor) without trying
    again; other groups keep the tensor form."""
    import torch

    from anysoftmax.distributed import collective

    tried, listed = [], []

    def tensor_form(out, state, group):
        tried.append(group)
        if group.name == "old":
            raise RuntimeError("ProcessGroupGloo does not support _allgather_base")
        out.copy_(torch.cat([state, state + 1]))

    def list_form(outs, state, group):
        listed.append(group)
        for r, o in enumerate(outs):
            o.copy_(state + r)

    class Group:  # (weakly referenced, as process groups are)
        def __init__(self, name):
            self.name = name

    monkeypatch.setattr(collective, "_gather_single", tensor_form)
    monkeypatch.setattr(collective.dist, "all_gather", list_form)
    old, new = Group("old"), Group("new")
    state = torch.arange(3.0)
    want = torch.stack([state, state + 1])
    for _ in range(3):
        assert torch.equal(collective.gather_states(state, 2, old), want)
        assert torch.equal(collective.gather_states(state, 2, new), want)
    assert [g.name for g in tried] == ["old", "new", "new", "new"]
    assert [g.name for g in listed] == ["old"] * 3
