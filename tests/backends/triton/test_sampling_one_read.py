"""The Triton sampler's one-read paths (`_triton_common/sampling_one_read.py`): `probs` with only
a temperature is the softmax kernel with the per-row scale, `logprobs` without top_n the
logsumexp kernel with it and a gather; the scan (`sampling.probs` / `sampling.logprobs`) never
runs for them. Greedy rows (temperature 0, ties at the max), invalid rows (a NaN, +inf or
all -inf row, an out-of-range per-row temperature or id) against the float64 reference;
requests with a filter still take the scan."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.backends._triton_common import sampling_one_read
from anysoftmax.core import registry
from anysoftmax.core.backend import as_backend
from anysoftmax.sampling.reference import reference_distribution, reference_logprobs
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.sampling import PROB_ATOL, PROB_RTOL
from helpers import runnable_backends
from helpers.spies import bound_softmax_plans, sampler_runs

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

ROWS, VOCAB = 6, 700
LP_ATOL, LP_RTOL = 2e-5, 1e-5


@pytest.fixture
def scan_calls(monkeypatch):
    """The calls that reach the scan and select (the functions of `sampling.runner`)."""
    return sampler_runs(monkeypatch)


@pytest.fixture
def row_scale_reads(monkeypatch):
    """(kernel kind, has a row scale) of every softmax launch the backend binds."""
    return bound_softmax_plans(monkeypatch)


def _logits(gen, dtype=torch.float32):
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    x[1, [40, 300, 650]] = 30.0  # a greedy row's tied maxima: the lowest index wins
    x[3, 17] = math.nan
    x[4] = -math.inf
    x[5, ::2] = -math.inf
    return x.to(dtype)


def _check_probs(got, x, spec):
    ref = reference_distribution(x, spec).probs.reshape(x.shape)
    nan = torch.isnan(ref)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.equal(torch.isnan(got), nan), "NaN rows differ"
    err = (got.double() - ref).abs()[~nan]
    assert bool((err <= PROB_ATOL + PROB_RTOL * ref[~nan]).all()), f"max error {float(err.max()):.3g}"


def _check_logprobs(got, x, ids, spec):
    vocab = x.shape[-1]
    ref = reference_logprobs(x, spec).reshape(-1, vocab).gather(-1, ids.clamp(0, vocab - 1))
    ref = torch.where((ids >= 0) & (ids < vocab), ref, math.nan)
    assert got.dtype == torch.float32 and got.shape == ids.shape
    assert torch.equal(torch.isnan(got), torch.isnan(ref)) and torch.equal(torch.isinf(got), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert torch.allclose(got.double()[fin], ref[fin], atol=LP_ATOL, rtol=LP_RTOL)


TEMPERATURES = {"none": lambda gen: None, "number": lambda gen: 0.8,
                "per-row": lambda gen: torch.tensor([0.7, 0.0, 1.3, 1.0, 0.9, 0.6]),
                "0-dim": lambda gen: torch.tensor(1.4)}


@pytest.mark.parametrize("form", list(TEMPERATURES))
def test_probs_with_only_a_temperature_is_the_softmax_with_the_row_scale(form, gen, scan_calls, row_scale_reads):
    x = _logits(gen)
    t = TEMPERATURES[form](gen)
    got = sampling.probs(x, temperature=t, backend="triton")
    _check_probs(got, x, SamplingSpec.from_request("probs", x, temperature=t))
    assert scan_calls == [], "the scan ran for a request without a filter"
    if isinstance(t, torch.Tensor):
        assert row_scale_reads and all(has for _, has in row_scale_reads)
    if form == "per-row":
        assert got[1, 40] == 1 and float(got[1].sum()) == 1  # greedy: the first of the tied maxima


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_probs_one_read_in_half_precision(dtype, gen, scan_calls):
    x = _logits(gen, dtype)
    t = TEMPERATURES["per-row"](gen)
    _check_probs(sampling.probs(x, temperature=t, backend="triton"), x,
                 SamplingSpec.from_request("probs", x, temperature=t))
    assert scan_calls == []


@pytest.mark.parametrize("form", list(TEMPERATURES) + ["greedy-number"])
def test_logprobs_of_ids_is_the_logsumexp_and_a_gather(form, gen, scan_calls):
    x = _logits(gen)
    t = 0.0 if form == "greedy-number" else TEMPERATURES[form](gen)
    ids = torch.randint(0, VOCAB, (ROWS, 5), generator=gen)
    ids[1, :2] = torch.tensor([300, 41])  # a tied maximum and a token below it on the greedy row
    got = sampling.logprobs(x, ids, temperature=t, backend="triton")
    _check_logprobs(got, x, ids, SamplingSpec.from_request("logprobs", x, temperature=t))
    assert scan_calls == [], "the scan ran for logprobs without top_n"


@pytest.mark.parametrize("programs", [1, None])
def test_the_gather_serves_every_row_on_any_grid(programs, gen):
    """Many rows with greedy rows (ties at the max) and invalid rows among them, on the default
    grid and on one program looping over every row (a fixed grid, as on an NPU)."""
    from anysoftmax.backends._triton_common import sampling as triton_sampling

    rows, vocab = 131, 300
    x = torch.randn(rows, vocab, generator=gen) * 3
    t = torch.rand(rows, generator=gen) + 0.5
    t[[3, 63, 64, 130]] = 0.0
    x[63, [7, 250]] = 40.0  # (tied maxima of a greedy row)
    x[65, 9] = math.nan
    ids = torch.randint(0, vocab, (rows, 3), generator=gen)
    ids[63, :2] = torch.tensor([250, 8])
    plans = None if programs is None else \
        (lambda spec: dataclasses.replace(triton_sampling.plan_for(spec.rows, spec.vocab, spec.device), grid=programs))
    sampler = sampling_one_read.Sampler(as_backend(registry.get_backend("triton")), plans)
    spec = SamplingSpec.from_request("logprobs", x, temperature=t)
    got = sampler.logprobs(spec, x, ids)
    _check_logprobs(got, x, ids, spec)
    assert got[63, 0] == -math.log(2) and got[63, 1] == -math.inf


@pytest.mark.parametrize("programs", [1, 8, 64])
def test_logprobs_of_ids_over_rows_of_many_chunks_in_one_launch(programs, gen, monkeypatch):
    """`logprobs_kernel` (the backend without plans) on a grid of `programs`: one program looping
    over every chunk of every row, fewer programs than chunks, a program a chunk; each row's
    chunk lses combined by its last arrival, greedy and invalid rows among them. A second call
    on other logits and temperatures (the arrival counts left at zero) is right as well."""
    monkeypatch.setattr(sampling_one_read, "programs_for_logprobs", lambda device: programs)
    chunk = sampling_one_read.LOGPROBS_CHUNK
    rows, vocab = 5, 3 * chunk + 77 + programs  # (a vocabulary per grid: the bound launchers are kept by form)
    for call in range(2):
        x = torch.randn(rows, vocab, generator=gen) * (3 + call)
        t = torch.rand(rows, generator=gen) + 0.5
        t[2] = 0.0
        x[2, [5, vocab - 1]] = 40.0  # (tied maxima of a greedy row, in its first and last chunk)
        x[3, chunk + 1] = math.nan
        x[4, :2 * chunk] = -math.inf  # (chunks holding nothing)
        ids = torch.randint(0, vocab, (rows, 4), generator=gen)
        ids[2, :2] = torch.tensor([vocab - 1, 6])
        ids[0, 0] = vocab - 1
        spec = SamplingSpec.from_request("logprobs", x, temperature=t)
        got = sampling.logprobs(x, ids, temperature=t, backend="triton")
        _check_logprobs(got, x, ids, spec)
        assert got[2, 0] == -math.log(2) and got[2, 1] == -math.inf


def test_logprobs_in_one_launch_on_strided_and_misaligned_rows_then_contiguous_ones(gen):
    """The same form through `logprobs_kernel` on rows cut from a wider tensor one element in
    (another row stride, an address off 16 bytes), then on contiguous logits, then strided again:
    each call right (its own launch binding for each layout)."""
    rows, vocab = 3, sampling_one_read.LOGPROBS_CHUNK + 501
    t = torch.rand(rows, generator=gen) + 0.5
    ids = torch.randint(0, vocab, (rows, 2), generator=gen)
    for layout in ("strided", "contiguous", "strided"):
        wide = torch.randn(rows, vocab + 3, generator=gen) * 3
        x = wide[:, 1:vocab + 1] if layout == "strided" else wide[:, :vocab].contiguous()
        got = sampling.logprobs(x, ids, temperature=t, backend="triton")
        _check_logprobs(got, x, ids, SamplingSpec.from_request("logprobs", x, temperature=t))


def test_logprobs_of_ids_above_the_one_launch_bound_take_the_logsumexp_and_the_gather(gen, monkeypatch):
    """A request of more than LOGPROBS_ONE_LAUNCH_MAX logits takes the logsumexp kernel and the gather."""
    monkeypatch.setattr(sampling_one_read, "LOGPROBS_ONE_LAUNCH_MAX", ROWS * (VOCAB + 3) - 1)
    x = torch.randn(ROWS, VOCAB + 3, generator=gen) * 3  # (a form of its own: runners are kept by form)
    t = torch.rand(ROWS, generator=gen) + 0.5
    spec = SamplingSpec.from_request("logprobs", x, temperature=t)
    assert not sampling_one_read.one_launch_logprobs(sampling_one_read.sampler_for(as_backend(
        registry.get_backend("triton"))), spec)
    ids = torch.randint(0, VOCAB + 3, (ROWS, 2), generator=gen)
    _check_logprobs(sampling.logprobs(x, ids, temperature=t, backend="triton"), x, ids, spec)


def test_two_samplers_of_one_backend_keep_their_own_logprobs_paths(gen):
    """The one launch bound for a sampler without plans is not the binding of a sampler of the
    same backend with plans (its three launches) on the same form, in either order."""
    backend = as_backend(registry.get_backend("triton"))
    x = torch.randn(ROWS, VOCAB + 5, generator=gen) * 3  # (a form of its own)
    t = torch.rand(ROWS, generator=gen) + 0.5
    ids = torch.randint(0, VOCAB + 5, (ROWS, 2), generator=gen)
    spec = SamplingSpec.from_request("logprobs", x, temperature=t)
    for sampler in (sampling_one_read.Sampler(backend), sampling_one_read.Sampler(backend, lambda spec: None),
                    sampling_one_read.Sampler(backend)):
        _check_logprobs(sampler.logprobs(spec, x, ids), x, ids, spec)


def test_out_of_range_per_row_temperatures_and_ids_give_nan():
    """Values the host does not read on an accelerator (the CPU API rejects them first: the
    request is built past that check here): the row, or the id, is NaN; the others unchanged."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 200, generator=gen)
    sampler = sampling_one_read.sampler_for(as_backend(registry.get_backend("triton")))
    ok = SamplingSpec.from_request("probs", x, temperature=torch.ones(3))
    for bad in (-1.0, math.inf, math.nan):
        spec = dataclasses.replace(ok, temperature=torch.tensor([1.0, bad, 0.5]))
        y = sampler.probs(spec, x)
        assert bool(torch.isnan(y[1]).all()) and not bool(torch.isnan(y[[0, 2]]).any()), bad
        lp = sampler.logprobs(dataclasses.replace(spec, op="logprobs"), x, torch.tensor([[0, 1]] * 3))
        assert bool(torch.isnan(lp[1]).all()) and not bool(torch.isnan(lp[[0, 2]]).any()), bad
    lp = sampler.logprobs(dataclasses.replace(ok, op="logprobs"), x, torch.tensor([[0, -1], [200, 5], [7, 199]]))
    assert torch.isnan(lp).tolist() == [[False, True], [True, False], [False, False]]


def test_requests_with_a_filter_or_top_n_take_the_scan(gen, scan_calls):
    x = torch.randn(2, 300, generator=gen)
    sampling.probs(x, temperature=0.7, top_p=torch.tensor([1.0, 1.0]), backend="triton")  # (rows not read)
    sampling.probs(x, temperature=0.0, backend="triton")  # every row greedy: the scan's argmax
    sampling.logprobs(x, torch.zeros(2, 1, dtype=torch.int64), top_n=3, backend="triton")
    assert scan_calls == ["probs", "probs", "logprobs"]
