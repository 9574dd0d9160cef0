"""The sampler with programmatic dependent launch (`SamplingPlan.pdl`) on a CUDA GPU of sm_90 or
later: each launch's programs are placed while the launch before it finishes and wait for it
before any load, so every result must be the one the plain launches give, bit for bit — on the
fused plan (one launch), the two-launch plan, the runs pre-pass's chain of five, `probs`' second
pass and top-n `logprobs`; back to back without a sync, and replayed from a CUDA graph. A wait
left out of one kernel would read a workspace the launch before it is still writing. The
overlapping plan (`SamplingPlan.overlap`: the collect reads a row as soon as the persistent runs
launch has counted its blocks) alike, with the default's runs programs and with 6 at fewer
registers, its row counts left zero. (Compiled for sm_90 on any
machine: test_sampler_compiles.py checks the attribute, the waits and the overlap's registers.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from anysoftmax.backends._triton_common import launcher
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling.spec import SamplingSpec, check_ids

pytestmark = pytest.mark.gpu

VOCAB = 128256


def _needs_sm90():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip(f"programmatic dependent launch needs sm_90 or later: {torch.cuda.get_device_name()} is "
                    f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}")


def _request(rows: int, dtype: torch.dtype, top_k):
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, VOCAB, device="cuda", generator=g) * 3).to(dtype)
    t = torch.rand(rows, device="cuda", generator=g) + 0.3
    kw = dict(temperature=t, top_k=top_k, top_p=0.9, min_p=0.05)
    return x, kw, torch.randint(0, 2**62, (rows,), device="cuda", generator=g)


def _assert_same_results(rows: int, dtype: torch.dtype, top_k, variant) -> None:
    """`sample` (four calls back to back, no sync between: each call's first launch follows the
    last one's), `probs` and top-20 `logprobs` on `variant(plan)` give the results of `plan`, the
    default plan with plain launches, bit for bit; the row counters are left zero."""
    x, kw, seeds = _request(rows, dtype, top_k)
    plain = dataclasses.replace(triton_sampling.plan_for(rows, VOCAB, x.device, wide_k=top_k > 64), pdl=False)
    spec = SamplingSpec.from_request("sample", x, **kw, seed=seeds, offset=3)
    want_ids, want_lp = triton_sampling.sample(spec, x, True, plan=plain)
    for ids, lp in [triton_sampling.sample(spec, x, True, plan=variant(plain)) for _ in range(4)]:
        assert torch.equal(ids, want_ids)
        assert torch.equal(lp, want_lp)
    pspec = SamplingSpec.from_request("probs", x, **kw)
    got = triton_sampling.probs(pspec, x, plan=variant(plain))
    assert torch.equal(got, triton_sampling.probs(pspec, x, plan=plain))
    lspec = SamplingSpec.from_request("logprobs", x, temperature=kw["temperature"])
    ids = check_ids("logprobs", lspec, torch.randint(0, VOCAB, (rows, 2), device="cuda"))
    lp_plain = dataclasses.replace(triton_sampling.plan_for(rows, VOCAB, x.device, top_n=20), pdl=False)
    for a, b in zip(triton_sampling.logprobs(lspec, x, ids, 20, plan=variant(lp_plain)),
                    triton_sampling.logprobs(lspec, x, ids, 20, plan=lp_plain)):
        assert torch.equal(a, b)
    assert not launcher.row_counters(x.device, rows).any()


def _assert_replays_alike(rows: int, variant) -> None:
    """`sample` on `variant(plan)` captured in a CUDA graph replays the draws of `plan` (the
    default plan with plain launches) as the offset it reads changes."""
    x, kw, seeds = _request(rows, torch.bfloat16, torch.full((rows,), 50, device="cuda"))
    offset = torch.zeros((), dtype=torch.int64, device="cuda")
    spec = SamplingSpec.from_request("sample", x, **kw, seed=seeds, offset=offset)
    plain = dataclasses.replace(triton_sampling.plan_for(rows, VOCAB, x.device), pdl=False)
    assert plain.runs  # the chain of five launches
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        triton_sampling.sample(spec, x, plan=variant(plain))  # compiles, binds this stream's workspace
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = triton_sampling.sample(spec, x, plan=variant(plain))
    torch.cuda.synchronize()
    for step in range(3):
        offset.fill_(step)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, triton_sampling.sample(spec, x, plan=plain)), step


def _with_pdl(plan):
    return dataclasses.replace(plan, pdl=True)


def _overlapping(plan, runs: int = triton_sampling.OVERLAP_RUNS):
    return dataclasses.replace(plan, pdl=True, overlap=runs, collect_warps=4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,top_k", [(2, 50), (8, 50), (64, 50), (64, 100), (300, 20)])
def test_pdl_launches_give_the_plain_launches_results(rows, top_k, dtype):
    _needs_sm90()
    assert triton_sampling.plan_for(rows, VOCAB, torch.device("cuda", torch.cuda.current_device())).pdl
    _assert_same_results(rows, dtype, top_k, _with_pdl)


def test_pdl_launches_replay_from_a_cuda_graph():
    _needs_sm90()
    _assert_replays_alike(64, _with_pdl)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,top_k", [(16, 50), (130, 50), (512, 50), (300, 20)])
def test_the_overlapping_plan_gives_the_plain_launches_results(rows, top_k, dtype):
    _needs_sm90()
    _assert_same_results(rows, dtype, top_k, _overlapping)


def test_six_runs_programs_a_collect_program_at_fewer_registers_give_the_same_results():
    _needs_sm90()
    _assert_same_results(512, torch.bfloat16, 50, lambda plan: _overlapping(plan, runs=6))


def test_the_overlapping_plan_replays_from_a_cuda_graph():
    _needs_sm90()
    _assert_replays_alike(256, _overlapping)
