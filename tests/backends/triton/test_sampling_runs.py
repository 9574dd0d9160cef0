"""The sampler's runs pre-pass (`runs_kernel`, `collect_kernel` in `sampling_kernels.py`): a top-k
row's candidates found from its runs' maxima instead of a search in every chunk. Through the
interpreter with plans small enough to cut rows of a few hundred tokens into several chunks of
several runs: the kit's sampler section with every request planned so; the same draws, probabilities
and log-probabilities as the scan alone on rows the pre-pass serves and on rows it must leave to
the scan (greedy, NaN, too many runs at the threshold, a chunk's candidates past its slots);
which rows it served; a sharded vocabulary; the overlapping form (a persistent runs launch
counting each row's blocks, the collect reading a row once its count is full)."""

from __future__ import annotations

import dataclasses
import functools
import threading

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.backends._triton_common import sampling_kernels
from anysoftmax.sampling import api as sampling_api
from anysoftmax.sampling.spec import SamplingSpec, check_ids
from anysoftmax.testing.kit import run_checks
from helpers import runnable_backends
from helpers.sampler_kit import interpreter_checks
from helpers.shards import sharded_sample

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

# Chunks of 128 in 16 runs of 8: top-k bounds up to 8 are served; 32 slots a chunk.
SCAN = triton_sampling.SamplingPlan(chunk=128, slots=32, grid=4, num_warps=4, tile=64)
RUNS = dataclasses.replace(SCAN, runs=True, run=8)
# (the runs launch of OVERLAP_RUNS x 2 programs, persistent over the rows' blocks; 2 collect programs)
OVERLAP = dataclasses.replace(RUNS, overlap=triton_sampling.OVERLAP_RUNS)
# (the kit's rows of 20000 in chunks of 2048, runs of 64: top-k bounds up to 16 served)
RUNS_WIDE = triton_sampling.SamplingPlan(chunk=2048, slots=64, grid=4, num_warps=4, tile=256, runs=True)


@pytest.fixture
def served_rows(monkeypatch):
    """How many rows `collect_kernel` served (the interpreter resolves its helper per call)."""
    count = [0]
    real = sampling_kernels._collect_row

    def spy(*args, **kwargs):
        served = real(*args, **kwargs)
        count[0] += int(served)
        return served
    monkeypatch.setattr(sampling_kernels, "_collect_row", spy)
    return count


@pytest.fixture
def runs_planned(monkeypatch):
    """Every request of the API planned as RUNS (RUNS_WIDE past 2048 tokens; the remembered
    requests and launchers dropped before and after)."""
    def drop():
        sampling_api._requests.clear()
        triton_sampling._bound.clear()
    drop()
    monkeypatch.setattr(triton_sampling, "plan_for",
                        lambda rows, vocab, device, programs=None, **_: RUNS if vocab <= 2048 else RUNS_WIDE)
    yield
    monkeypatch.undo()
    drop()


def test_the_kit_sampler_section_with_the_runs_prepass(runs_planned, served_rows, seed):
    triton = functools.partial(sampling.sample, backend="triton")
    # (less the kit's rows of 20000: the default plan serves them through the pre-pass in
    # test_sampling_kernels.py's run of the kit; the GPU tests run the whole section with it)
    checks = [c for c in interpreter_checks(triton, functools.partial(sampling.probs, backend="triton"),
                                            functools.partial(sampling.logprobs, backend="triton"))
              if "vocabulary-rows" not in c.name]
    report = run_checks(checks, "triton", "cpu", seed)
    assert not report.failed and not report.skipped, report.text()
    assert served_rows[0] > 20  # (the kit's top-k cases reach the pre-pass)


def _cases(gen) -> list:
    """(logits, keywords) that the pre-pass serves, and ones it must leave to the scan."""
    rows, vocab = 6, 600  # 5 chunks (the last of 88 tokens: a run cut by the vocabulary's end)
    x = torch.randn(rows, vocab, generator=gen) * 3
    x[1, 200:420] = float("-inf")  # masked tokens across chunks
    x[2, :] = x[2, :].round()  # ties at the k-th value
    ties = torch.zeros(rows, vocab)
    ties[:, ::7] = 1.0  # 86 tied maxima: more runs reach the threshold than RUN_CAP... or not: both ways checked
    few = torch.full((rows, vocab), float("-inf"))
    few[:, 3:6] = torch.randn(rows, 3, generator=gen)  # fewer finite tokens than k
    nan = x.clone()
    nan[4, 17] = float("nan")
    crowd = torch.arange(vocab, 0, -1, dtype=torch.float32).repeat(rows, 1)  # the top k in one chunk's first runs
    t = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.5])
    k = torch.tensor([5, 8, 3, 1, 9, 0])
    return [(x, dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05)),
            (x, dict(temperature=t, top_k=k, top_p=0.95)),
            (x.to(torch.bfloat16), dict(temperature=t, top_k=8, min_p=0.1)),
            (ties, dict(top_k=4)),
            (few, dict(top_k=8, temperature=t)),
            (nan, dict(top_k=3)),
            (crowd, dict(top_k=8, top_p=0.5))]


def test_the_same_draws_and_probabilities_as_the_scan_alone(gen):
    for i, (x, kw) in enumerate(_cases(gen)):
        spec = SamplingSpec.from_request("sample", x, **kw, seed=i, offset=3)
        ids, lp = triton_sampling.sample(spec, x, True, plan=RUNS)
        want, want_lp = triton_sampling.sample(spec, x, True, plan=SCAN)
        assert torch.equal(ids, want), (i, ids, want)
        assert torch.allclose(lp, want_lp, atol=1e-5, rtol=1e-5, equal_nan=True), i
        pspec = SamplingSpec.from_request("probs", x, **kw)
        got, ref = triton_sampling.probs(pspec, x, plan=RUNS), triton_sampling.probs(pspec, x, plan=SCAN)
        assert torch.equal(got > 0, ref > 0) and torch.allclose(got, ref, atol=1e-6, rtol=1e-5, equal_nan=True), i


def test_logprobs_top_n_the_same_as_the_scan_alone(gen):
    for x, _ in _cases(gen):
        spec = SamplingSpec.from_request("logprobs", x, temperature=0.7)
        ids = check_ids("logprobs", spec, torch.randint(0, x.shape[-1], (x.shape[0], 2), generator=gen))
        got = triton_sampling.logprobs(spec, x, ids, 6, plan=RUNS)
        want = triton_sampling.logprobs(spec, x, ids, 6, plan=SCAN)
        assert torch.equal(got[2], want[2])
        for a, b in zip(got[:2], want[:2]):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5, equal_nan=True)


def _served(spec, x, plan=RUNS) -> list:
    served, left = triton_sampling.runs_rows(spec, x, plan=plan)
    assert sorted(served + left) == list(range(spec.rows))
    return [int(r in served) for r in range(spec.rows)]


def test_which_rows_it_serves(gen):
    x = torch.randn(6, 600, generator=gen) * 3
    x[3, 9] = float("nan")
    t = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    k = torch.tensor([8, 8, 9, 8, 0, 1])
    # served: top-k <= 8 on a finite, non-greedy row; left: greedy, k = 9, NaN, no top-k
    assert _served(SamplingSpec.from_request("probs", x, temperature=t, top_k=k), x) == [1, 0, 0, 0, 0, 1]
    crowd = torch.arange(600, 0, -1, dtype=torch.float32).repeat(2, 1)
    crowd[1] = crowd[1].flip(0)
    # the largest values crowd one chunk's runs: the runs' 8th largest max lets 57 (row 0) or
    # 25 + 32 (row 1) values through, past a chunk's 32 slots: left to the scan
    assert _served(SamplingSpec.from_request("probs", crowd, top_k=8), crowd) == [0, 0]
    spread = torch.zeros(2, 600)
    spread[:, ::75] = torch.arange(8, dtype=torch.float32) + 1.0  # one of the top 8 in each of 8 runs
    assert _served(SamplingSpec.from_request("probs", spread, top_k=8), spread) == [1, 1]
    flat = torch.zeros(2, 600)  # every run at the threshold: more than RUN_CAP runs
    assert _served(SamplingSpec.from_request("probs", flat, top_k=8), flat) == [0, 0]
    # a chunk's candidates past its 32 slots: 40 ties at the threshold in one chunk
    slots = torch.full((1, 600), -1.0)
    slots[0, 128:168] = 1.0
    assert _served(SamplingSpec.from_request("probs", slots, top_k=8), slots) == [0]
    kept = triton_sampling.probs(SamplingSpec.from_request("probs", slots, top_k=8), slots, plan=RUNS)[0, 128:168]
    assert float(kept.sum()) == pytest.approx(1.0)


def test_the_overlapping_plan_draws_what_the_runs_plan_draws_and_leaves_the_counts_zero(gen):
    """The persistent runs launch and the collect that waits for each row's count give the plain
    runs plan's results, bit for bit (the interpreter runs one launch after the other: every
    count is full when the collect reads it); the scan zeroes the counts for the next call."""
    for i, (x, kw) in enumerate(_cases(gen)):
        spec = SamplingSpec.from_request("sample", x, **kw, seed=i, offset=3)
        for got, want in zip(triton_sampling.sample(spec, x, True, plan=OVERLAP),
                             triton_sampling.sample(spec, x, True, plan=RUNS)):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"case {i}: {m}")
        assert not triton_sampling.row_counters(x.device, x.shape[0]).any(), i
        pspec = SamplingSpec.from_request("probs", x, **kw)
        got = triton_sampling.probs(pspec, x, plan=OVERLAP)
        torch.testing.assert_close(got, triton_sampling.probs(pspec, x, plan=RUNS), rtol=0, atol=0, equal_nan=True)
        assert _served(pspec, x, OVERLAP) == _served(pspec, x, RUNS), i
        lspec = SamplingSpec.from_request("logprobs", x, temperature=0.7)
        ids = check_ids("logprobs", lspec, torch.randint(0, x.shape[-1], (x.shape[0], 2), generator=gen))
        for got, want in zip(triton_sampling.logprobs(lspec, x, ids, 6, plan=OVERLAP),
                             triton_sampling.logprobs(lspec, x, ids, 6, plan=RUNS)):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"case {i}: {m}")
        assert not triton_sampling.row_counters(x.device, x.shape[0]).any(), i


@pytest.mark.parametrize("count", [0, 2, 5, 7])
def test_the_collect_wait_for_a_row_ends_when_its_count_never_fills(count):
    """`_wait_for_row` reads a row's count at most SPINS times and then goes on (on a GPU it next
    waits for the runs launch to end: PDL's wait, which cannot hang either): a count short of the
    row's blocks, as after a runs program that never ran, ends the wait instead of spinning forever."""
    import triton
    import triton.language as tl

    @triton.jit
    def wait_then_mark(count_ptr, done_ptr, ROW_BLOCKS: tl.constexpr, SPINS: tl.constexpr):
        sampling_kernels._wait_for_row(count_ptr, 1, ROW_BLOCKS, False, SPINS)
        tl.store(done_ptr, tl.load(count_ptr + 1) + 1)

    counts = torch.tensor([9, count, 9], dtype=torch.int32)
    done = torch.full((1,), -1, dtype=torch.int32)
    # (in a thread, so that a wait that never ends fails this test instead of hanging the run)
    waiter = threading.Thread(target=lambda: wait_then_mark[(1,)](counts, done, ROW_BLOCKS=5, SPINS=64), daemon=True)
    waiter.start()
    waiter.join(timeout=120)
    assert not waiter.is_alive(), f"the wait on a count of {count} (of 5 blocks) did not end"
    assert int(done) == count + 1 and counts.tolist() == [9, count, 9]


def test_an_overlapping_plan_is_refused_for_a_sharded_scan(gen):
    """A sharded vocabulary's scan runs no select: the runs' row counts would stay unzeroed."""
    x = torch.randn(4, 1200, generator=gen) * 3
    spec = SamplingSpec.from_request("sample", x, top_k=5, seed=7)
    with pytest.raises(ValueError, match="SamplingPlan.overlap"):
        triton_sampling.scan_shard(spec, x, 0, 1200, plan=OVERLAP)


def test_a_sharded_vocabulary_with_the_runs_prepass(gen):
    x = torch.randn(4, 1200, generator=gen) * 3
    kw = dict(temperature=torch.tensor([1.0, 0.7, 0.9, 1.2]), top_k=torch.tensor([5, 8, 0, 3]), seed=7, offset=2)
    assert torch.equal(sharded_sample(x, kw, RUNS), sampling.sample(x, **kw, backend="torch"))


def test_the_default_plan_takes_the_prepass_with_the_warps_its_rows_need():
    """The pre-pass from RUNS_MIN_ROWS rows on full chunks; the collect at 8 warps while every
    row has a multiprocessor (half the persistent programs), at 4 beyond; its select at 4."""
    from anysoftmax.backends._triton_common.sampling import RUNS_MIN_ROWS, plan_for

    cpu, sms = torch.device("cpu"), 132
    few = plan_for(RUNS_MIN_ROWS - 1, 128256, cpu, programs=2 * sms)
    assert not few.runs and (few.collect_warps, few.select_warps) == (8, 8)
    for rows, collect in ((RUNS_MIN_ROWS, 8), (sms, 8), (sms + 1, 4), (512, 4)):
        p = plan_for(rows, 128256, cpu, programs=2 * sms)
        assert p.runs and (p.collect_warps, p.select_warps) == (collect, 4), (rows, p)
    assert not plan_for(512, 3000, cpu, programs=2 * sms).runs  # (a chunk below the full width)


def test_runs_of_32_serve_the_bounds_where_they_were_measured_faster():
    """`short_runs_window`: runs of 32 for a top-k number of 65-128 from 32 rows and one up to 64
    up to 128 rows, for a per-row top_k tensor from 32 rows, for top-n past 64; no window without
    the pre-pass."""
    from anysoftmax.backends._triton_common.sampling import short_runs_window

    cpu = torch.device("cpu")
    assert short_runs_window(16, 128256, cpu) == (0, 64, False)
    assert short_runs_window(32, 128256, cpu) == short_runs_window(128, 128256, cpu) == (0, 128, True)
    assert short_runs_window(512, 128256, cpu) == (64, 128, True)
    assert short_runs_window(16, 128256, cpu, top_n=20) == (64, 64, False)
    assert short_runs_window(512, 128256, cpu, top_n=20) == (64, 128, False)
    assert short_runs_window(8, 128256, cpu) == short_runs_window(512, 3000, cpu) == (0, 0, False)


def test_a_top_k_tensor_past_64_is_served_by_runs_of_32(gen, served_rows):
    """32 rows of one full chunk (8192): a per-row top_k of 100 is past what its 128 runs of 64
    serve (64) but within what its 256 runs of 32 serve (128): the default plan serves it from
    the pre-pass and draws what the torch sampler draws."""
    x = torch.randn(32, 8192, generator=gen) * 3
    kw = dict(temperature=torch.rand(32, generator=gen) + 0.5, top_k=torch.full((32,), 100), seed=11, offset=3)
    triton_sampling._bound.clear()
    ids = sampling.sample(x, **kw, backend="triton")
    assert served_rows[0] == 32
    assert torch.equal(ids, sampling.sample(x, **kw, backend="torch"))
    served_rows[0] = 0
    spec = SamplingSpec.from_request("sample", x, **kw)
    assert torch.equal(triton_sampling.sample(spec, x, plan=triton_sampling.plan_for(32, 8192, x.device)), ids)
    assert served_rows[0] == 0  # (runs of 64: a bound of 100 is left to the scan)
