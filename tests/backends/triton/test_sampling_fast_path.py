"""The Triton sampler's later calls through the launch engine's fast path: after a request's
first launch (it binds), its next call goes through Triton's low-level launcher (a recorder
stands in for it, as on a GPU after the first compile) with raw addresses only. Every pointer is
the address of the call's operand, or, where the call leaves one absent (a keyword given as a
number, no ids), of a stand-in of the element type the kernel loads from it; the kernels run
from exactly what the recorders were given (through the interpreter) give what the first call
gave. The interpreter's own launches never take this path, so only this test covers it on CPU."""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import numpy
import pytest
import torch

from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling.spec import SamplingSpec, check_ids
from helpers import runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

# The element type the kernels load from or store to through each pointer operand.
OPERAND_DTYPES = {"out_i_ptr": torch.int64, "out_f_ptr": torch.float32, "out_f2_ptr": torch.float32,
                  "ids_ptr": torch.int64, "t_ptr": torch.float32, "k_ptr": torch.int64, "p_ptr": torch.float32,
                  "mp_ptr": torch.float32, "seed_ptr": torch.int64, "off_ptr": torch.int64, "x_ptr": torch.float32,
                  "undecided_ptr": torch.int64,
                  "count_ptr": torch.int64}  # (int32 row counts; absent only where no kernel reads it)
PLAN = triton_sampling.SamplingPlan(chunk=128, slots=32, grid=3, num_warps=4, tile=64)
ROWS, VOCAB = 3, 300
GRIDS = itertools.count(2)  # (a plan per test: its request is bound there, not found bound by another)


class _Recorder:
    """Stands in for a compiled kernel's launcher (Triton's generic one): records its arguments."""

    def __init__(self):
        self.seen = []

    def __call__(self, *args):
        self.seen.append(args)


def _spying_bind(made: list):
    """`bind_kernel` whose launchers also keep each call's arguments (the tensors stay alive)."""
    real = triton_sampling.bind_kernel

    def bind(*args, **kwargs):
        launch = real(*args, **kwargs)

        def spy(call_args, values=launch.binding.values, per_call=()):
            spy.calls.append(call_args)
            return launch(call_args, values, per_call)
        spy.calls, spy.launch = [], launch
        made.append(spy)
        return spy
    return bind


def _request(op: str, gen, per_row: bool):
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    rows = lambda v, dtype=torch.float32: torch.full((ROWS,), v, dtype=dtype)
    if op == "logprobs":
        kw = dict(temperature=rows(0.8) if per_row else 0.8)
    elif per_row:  # top_k and min_p left out: their operands absent
        kw = dict(temperature=rows(0.9), top_p=rows(0.8))
        kw.update(dict(seed=torch.arange(ROWS) + 11, offset=rows(4, torch.int64)) if op == "sample" else {})
    else:  # every keyword a number: every keyword operand absent
        kw = dict(temperature=0.9, top_k=12, top_p=0.8, min_p=0.01)
        kw.update(dict(seed=11, offset=4) if op == "sample" else {})
    return x, SamplingSpec.from_request(op, x, **kw)


def _call(op: str, spec, x, plan):
    if op == "sample":
        return triton_sampling.sample(spec, x, True, plan=plan)
    if op == "probs":
        return (triton_sampling.probs(spec, x, plan=plan),)
    ids = check_ids(op, spec, torch.arange(ROWS * 2).reshape(ROWS, 2) * 7)
    return triton_sampling.logprobs(spec, x, ids, 2, plan=plan)


def _split(binding, got: tuple) -> tuple:
    """(grid, pointers, integers, floats, constexprs) of one recorded launch."""
    assert got[4:9] == ("fn", "packed", None, None, None)
    rest = got[9:]
    n_p, n_i, n_f = len(binding.pointer_names), len(binding.ints), len(binding.floats)
    return got[0], rest[:n_p], rest[n_p:n_p + n_i], rest[n_p + n_i:n_p + n_i + n_f], rest[n_p + n_i + n_f:]


def _prime(made: list) -> list:
    """The fast path a GPU process has after each launcher's first launch, around recorders."""
    recorders = []
    for spy in made:
        rec = _Recorder()
        spy.launch.prime([SimpleNamespace(run=rec, function="fn", packed_metadata="packed")]
                         * len(spy.launch.binding.metas), spy.calls[-1], stream_of=lambda index: 7)
        recorders.append(rec)
    return recorders


def _check_and_replay(made: list, recorders: list, device) -> None:
    """Each recorded launch's pointers are the call's operands or the stand-ins of their element
    types; then the kernels run (interpreted, in launch order) from exactly those arguments."""
    f_stand, i_stand = triton_sampling.stand_ins(device)
    stand_in = {torch.float32: f_stand.data_ptr(), torch.int64: i_stand.data_ptr()}
    replay = []
    for spy, rec in zip(made, recorders):
        b, call_args = spy.launch.binding, spy.calls[-1]
        assert len(rec.seen) == len(b.metas)
        for got in rec.seen:
            grid, ptrs, ints, floats, tail = _split(b, got)
            assert got[3] == 7 and all(isinstance(p, int) and p != 0 for p in ptrs)
            for name, given, ptr in zip(b.pointer_names, call_args, ptrs):
                want = given.data_ptr() if given is not None else stand_in[OPERAND_DTYPES[name]]
                assert ptr == want, f"{b.kernel.__name__}: {name} gets {ptr}, not {want}"
            replay.append((b.kernel, grid, ptrs, ints, floats, tail, call_args))
    for kernel, grid, ptrs, ints, floats, tail, call_args in replay:
        tensors = {t.data_ptr(): t for t in (*(t for t in call_args if t is not None), f_stand, i_stand)}
        with numpy.errstate(invalid="ignore", divide="ignore"):  # (masked lanes: -inf - -inf, by design)
            kernel[(grid,)](*[tensors[p] for p in ptrs], *ints, *floats, *tail)


@pytest.mark.parametrize("op", ["sample", "probs", "logprobs"])
@pytest.mark.parametrize("per_row", [False, True])
def test_later_calls_pass_the_operands_or_typed_stand_ins(op, per_row, gen, monkeypatch):
    made: list = []
    monkeypatch.setattr(triton_sampling, "bind_kernel", _spying_bind(made))
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    x, spec = _request(op, gen, per_row)
    first = _call(op, spec, x, plan)  # binds (interpreted)
    assert len(made) == 2 + (op == "probs")
    recorders = _prime(made)
    again = _call(op, spec, x, plan)  # the fast path: recorded, nothing runs
    _check_and_replay(made, recorders, x.device)
    for a, b in zip(first, again):
        torch.testing.assert_close(b, a, equal_nan=True, rtol=0, atol=0)


def test_a_sharded_select_without_the_logits_takes_the_fast_path(gen, monkeypatch):
    """`select_shards` launches with no logits operand (its first): the bound device places the
    stand-ins, and later calls take the fast path like any other."""
    x, _ = _request("sample", gen, per_row=False)
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    parts = []
    for lo in (0, VOCAB // 2):
        shard = x[:, lo:lo + VOCAB // 2].contiguous()
        ws, space, _ = triton_sampling.scan_shard(_request_of(shard), shard, lo, VOCAB, plan=plan)
        parts.append(ws[:space.shard_words])
    gathered, spec = torch.stack(parts), _request_of(x[:, :VOCAB // 2])
    made: list = []
    monkeypatch.setattr(triton_sampling, "bind_kernel", _spying_bind(made))
    first = triton_sampling.select_shards(spec, gathered, 2, VOCAB, plan, return_logprobs=True)
    assert len(made) == 1 and made[0].calls[-1][0] is None
    recorders = _prime(made)
    again = triton_sampling.select_shards(spec, gathered, 2, VOCAB, plan, return_logprobs=True)
    _check_and_replay(made, recorders, x.device)
    for a, b in zip(first, again):
        torch.testing.assert_close(b, a, equal_nan=True, rtol=0, atol=0)


def _request_of(shard):
    return SamplingSpec.from_request("sample", shard, temperature=0.9, top_k=12, seed=11, offset=4)


def test_a_keyword_as_a_number_after_a_tensor_is_another_request(gen, monkeypatch):
    """A keyword given as a number leaves its operand absent: another request than the call that
    gave a tensor (an aligned one keyed alike would reuse a launch bound to read that operand)."""
    made: list = []
    monkeypatch.setattr(triton_sampling, "bind_kernel", _spying_bind(made))
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    per_row = SamplingSpec.from_request("sample", x, temperature=torch.full((ROWS,), 0.9), seed=11)
    ids = triton_sampling.sample(per_row, x, plan=plan)
    _prime(made)
    first_launchers = len(made)
    again = triton_sampling.sample(SamplingSpec.from_request("sample", x, temperature=0.9, seed=11), x, plan=plan)
    assert len(made) == 2 * first_launchers  # (bound anew: scan, and select unless the plan fuses it)
    torch.testing.assert_close(again, ids, rtol=0, atol=0)


def test_workspace_and_unread_logprobs_are_kept_per_stream(gen, monkeypatch):
    """A form's scan and select fill a workspace kept per stream, and a draw without
    `return_logprobs` writes its logprobs to a kept buffer: a later call allocates only its ids.
    Each call still computes its own: draws on new logits equal those of a runner bound afresh."""
    made: list = []
    monkeypatch.setattr(triton_sampling, "bind_kernel", _spying_bind(made))
    plan = dataclasses.replace(PLAN, grid=next(GRIDS))
    xs = [torch.randn(ROWS, VOCAB, generator=gen) * s for s in (3.0, 0.5, 8.0)]
    specs = [SamplingSpec.from_request("sample", x, temperature=0.9, top_k=12, top_p=0.9, seed=11, offset=i)
             for i, x in enumerate(xs)]
    run = triton_sampling.runner("sample", specs[0], plan=plan)  # (one form's: what the API keeps)
    drawn = [run(x, triton_sampling.keyword_values(spec)) for spec, x in zip(specs, xs)]
    scan, select = made
    workspaces = {call[1].data_ptr() for call in scan.calls} | {call[2].data_ptr() for call in select.calls}
    unread = {call[4].data_ptr() for call in select.calls}  # (out_f: the logprobs)
    assert len(scan.calls) == len(select.calls) == 3 and len(workspaces) == 1 and len(unread) == 1
    asked = [run(x, triton_sampling.keyword_values(spec), True)[1] for spec, x in zip(specs, xs)]
    assert len({lp.data_ptr() for lp in asked}) == 3  # (returned logprobs are the caller's own)
    fresh = dataclasses.replace(PLAN, grid=next(GRIDS))
    for spec, x, ids in zip(specs, xs, drawn):
        torch.testing.assert_close(triton_sampling.sample(spec, x, plan=fresh), ids, rtol=0, atol=0)
