"""On a GPU: the Triton sampler's one-read paths (the softmax and logsumexp kernels with the
per-row scale; the long-row kernels at a real vocabulary) and its top-k select from compacted
candidates, against the float64 reference and the torch sampler's seeded draws, on rows
that are greedy (tied maxima), invalid (NaN, all -inf) or half -inf."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.sampling import torch_sampler
from anysoftmax.sampling.reference import reference_distribution, reference_logprobs
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.sampling import PROB_ATOL, PROB_RTOL

pytestmark = pytest.mark.gpu

VOCAB = 128256


def _logits(dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(47)
    x = torch.randn(6, VOCAB, generator=gen) * 3
    x[1, [40, 70000, 128000]] = 30.0  # greedy row: the lowest of the tied maxima
    x[3, 17] = math.nan
    x[4] = -math.inf
    x[5, ::2] = -math.inf
    return x.to(dtype).cuda()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_read_paths_and_the_top_k_select_on_the_gpu(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    x = _logits(dtype)
    t = torch.tensor([0.7, 0.0, 1.3, 1.0, 0.9, 0.6], device="cuda")
    y = sampling.probs(x, temperature=t, backend="triton")
    ref = reference_distribution(x.cpu(), SamplingSpec.from_request("probs", x.cpu(), temperature=t.cpu())).probs
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(y.cpu()), nan)
    err = (y.cpu().double() - ref).abs()[~nan]
    assert bool((err <= PROB_ATOL + PROB_RTOL * ref[~nan]).all()), float(err.max())
    ids = torch.randint(0, VOCAB, (6, 4), device="cuda")
    lp = sampling.logprobs(x, ids, temperature=t, backend="triton").cpu()
    want = reference_logprobs(x.cpu(), SamplingSpec.from_request("logprobs", x.cpu(), temperature=t.cpu()))
    want = want.gather(-1, ids.cpu())
    assert torch.equal(torch.isnan(lp), torch.isnan(want)) and torch.equal(torch.isinf(lp), torch.isinf(want))
    fin = torch.isfinite(want)
    assert torch.allclose(lp.double()[fin], want[fin], atol=2e-5, rtol=1e-5)
    rows = torch.tensor([0, 2])  # (the filters on the valid, non-greedy rows)
    kw = dict(temperature=t[rows], top_k=torch.full((2,), 50, device="cuda"),
              top_p=torch.full((2,), 0.9, device="cuda"), min_p=torch.full((2,), 0.05, device="cuda"))
    xs = x[rows.cuda()]
    spec = SamplingSpec.from_request("probs", xs, **kw)
    assert triton_sampling.row_paths(spec, xs) == ["candidates", "candidates"]
    for seed in range(4):
        got = sampling.sample(xs, **kw, seed=seed, backend="triton")
        assert torch.equal(got, sampling.sample(xs, **kw, seed=seed, backend="torch"))
    _, values, top_ids = sampling.logprobs(xs, ids[:2], temperature=kw["temperature"], top_n=20, backend="triton")
    _, want_v, want_i = sampling.logprobs(xs, ids[:2], temperature=kw["temperature"], top_n=20, backend="torch")
    assert torch.equal(top_ids, want_i)
    torch.testing.assert_close(values, want_v, atol=2e-5, rtol=1e-5)


def test_repeated_draws_on_two_streams_match_the_torch_sampler():
    """A request's runner keeps each stream's row counters: the same form drawn alternately on
    two streams (its launchers bound once), with new values each call, gives the torch
    sampler's seeded draws on every call."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    x = _logits(torch.bfloat16)[[0, 2, 5]]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    got, want = [], []
    for i in range(6):
        kw = dict(temperature=torch.rand(3, device="cuda") + 0.5, top_k=50, top_p=0.9,
                  seed=torch.randint(0, 2**62, (3,), device="cuda"), offset=i)
        # (the keyword tensors are made on the default stream: the side stream waits for them, as
        # any program handing tensors across streams must)
        streams[i % 2].wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(streams[i % 2]):
            got.append(sampling.sample(x, **kw, backend="triton"))
        torch.cuda.synchronize()
        want.append(torch_sampler.sample(SamplingSpec.from_request("sample", x, **kw), x))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_the_gather_over_blocks_of_rows_on_the_gpu():
    """`logprobs` of ids over 300 rows of 5000, every 37th row greedy with tied maxima, three
    calls on the same operands: the greedy limit on those rows, z - lse on the others."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    gen = torch.Generator().manual_seed(11)
    rows, vocab = 300, 5000
    x = torch.randn(rows, vocab, generator=gen) * 3
    t = torch.rand(rows, generator=gen) + 0.5
    greedy = torch.arange(0, rows, 37)
    t[greedy] = 0.0
    x[greedy, 17] = x[greedy, 4000] = 50.0
    ids = torch.randint(0, vocab, (rows, 3), generator=gen)
    ids[greedy, 0], ids[greedy, 1] = 4000, 18
    for _ in range(3):
        lp = sampling.logprobs(x.cuda(), ids.cuda(), temperature=t.cuda(), backend="triton").cpu()
        want = reference_logprobs(x, SamplingSpec.from_request("logprobs", x, temperature=t)).gather(-1, ids)
        assert torch.equal(torch.isinf(lp), torch.isinf(want)) and not bool(torch.isnan(lp).any())
        fin = torch.isfinite(want)
        assert torch.allclose(lp.double()[fin], want[fin], atol=2e-5, rtol=1e-5)
        assert bool((lp[greedy, 0] == -math.log(2)).all())
