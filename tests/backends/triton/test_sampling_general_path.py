"""The Triton sampler's general path (`sampling_kernels._general_cut`): rows whose candidates
cannot decide the kept set (top-p / min-p cutting below what the chunks kept, a top-k above
their capacity, ties past it) search the whole row. Each read of the row evaluates many cut
points at once, so an undecided row costs a few reads, and the kept set is the float64
reference's exactly: top-p only, min-p only, both, a top-k above the capacity, flat rows, a
cut inside a cluster of adjacent floats, ties at the cut, -inf logits, many seeds."""

from __future__ import annotations

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.backends._triton_common import sampling_kernels
from anysoftmax.sampling.reference import reference_distribution
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.sampling import PROB_ATOL, PROB_RTOL
from helpers import runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

# Chunks of 128 with 32 candidate slots (a top-k above 16 and most top-p / min-p cuts of flat
# rows are undecided); the select's loops step 64 elements at a time.
SMALL = triton_sampling.SamplingPlan(chunk=128, slots=32, grid=4, num_warps=4, tile=64)
# Reads of the row an undecided row may take for `probs` (the draw adds one): a top-k search,
# a top-p search over its survivors (each a few reads), min-p's one read.
MAX_READS = 16


@pytest.fixture
def reads(monkeypatch):
    """Reads of a row by the general path: calls of `_row_z` at the row's first tile (the
    interpreter resolves a kernel's helpers when called)."""
    count = [0]
    real = sampling_kernels._row_z

    def spy(x_row, start, *args, **kwargs):
        count[0] += int(start) == 0
        return real(x_row, start, *args, **kwargs)
    monkeypatch.setattr(sampling_kernels, "_row_z", spy)
    return count


def _check_probs(got, x, spec):
    ref = reference_distribution(x, spec).probs.reshape(x.shape)
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan), "NaN rows differ"
    kept, want = got[~nan] > 0, ref[~nan] > 0
    assert torch.equal(kept, want), f"kept sets differ: {int((kept != want).sum())} tokens"
    err = (got.double() - ref).abs()[~nan]
    assert bool((err <= PROB_ATOL + PROB_RTOL * ref[~nan]).all()), f"max error {float(err.max()):.3g}"


def _general(x, kw, reads=None, seed=None):
    """probs of every row through the general path (asserted), checked against the reference;
    with `seed`, also the torch sampler's draws. Returns the reads per row of `probs`."""
    spec = SamplingSpec.from_request("probs", x, **kw)
    assert triton_sampling.row_paths(spec, x, plan=SMALL) == ["general"] * x.shape[0]
    before = reads[0] if reads is not None else 0
    _check_probs(triton_sampling.probs(spec, x, plan=SMALL), x, spec)
    per_row = ((reads[0] - before) / x.shape[0]) if reads is not None else None
    if seed is not None:
        got = triton_sampling.sample(SamplingSpec.from_request("sample", x, **kw, seed=seed), x, plan=SMALL)
        assert torch.equal(got, sampling.sample(x, **kw, seed=seed, backend="torch"))
    return per_row


def _randn(gen, rows, vocab, scale=3.0):
    return torch.randn(rows, vocab, generator=gen) * scale


@pytest.mark.parametrize("filters", ["top_p", "min_p", "top_p+min_p", "top_k>cap", "top_k>cap+top_p"])
def test_undecided_rows_take_a_few_reads_and_keep_the_reference_set(filters, gen, reads):
    """Flat rows (temperature 4 to 40 on randn * 3): the cut lies far below the 16 largest z a
    chunk keeps. Each row costs at most MAX_READS reads (a bisection of 32-bit keys took one
    or two per step: about 40 to 60)."""
    rows, vocab = 4, 600
    x = _randn(gen, rows, vocab)
    kw = {"temperature": torch.tensor([4.0, 10.0, 25.0, 40.0])}
    if "top_p" in filters:
        kw["top_p"] = torch.tensor([0.5, 0.9, 0.97, 0.3])
    if "min_p" in filters:
        kw["min_p"] = torch.tensor([0.05, 0.3, 0.6, 0.7])
    if "top_k" in filters:
        kw["top_k"] = torch.tensor([40, 100, 300, 599])
    per_row = _general(x, kw, reads, seed=7)
    assert 1 <= per_row <= (1 if filters == "min_p" else MAX_READS), per_row


@pytest.mark.parametrize("kw", [dict(top_p=0.95, min_p=0.7), dict(top_k=500, min_p=0.7)], ids=["top_p", "top_k"])
def test_a_min_p_cut_above_the_others_decides_in_one_read(kw, gen, reads):
    """Flat rows whose min-p cut lies above top-p's (or inside top-k's set): min-p's one read
    decides, no search runs. Uniform logits in [-9, 9) at temperature 25 (z within 0.36 of 0):
    min-p 0.7 keeps z >= max z - 0.357, about half of each row, far more than its 5 chunks' 160
    candidate slots, and top-p 0.95 about 93 %. (Normal logits would let a row whose max is an
    outlier keep few enough tokens for the candidates to decide it.)"""
    x = torch.rand(4, 600, generator=gen) * 18.0 - 9.0
    assert _general(x, dict(temperature=25.0, **kw), reads, seed=5) == 1


def test_flat_rows_ties_at_the_cut_and_minus_inf(gen, reads):
    """Row 0 all equal (top-p keeps every tie); row 1 pairs of equal values with the cut among
    them; row 2 half -inf; row 3 a cut inside a cluster of 300 adjacent floats (keys one apart)
    with ties in it."""
    vocab = 600
    x = torch.zeros(4, vocab)
    x[1] = (torch.randn(vocab // 2, generator=gen) * 0.1).repeat_interleave(2)
    x[2] = torch.randn(vocab, generator=gen) * 0.1
    x[2, torch.randperm(vocab, generator=gen)[: vocab // 2]] = float("-inf")
    cluster = torch.arange(1 << 23, (1 << 23) + 300, dtype=torch.int32).view(torch.float32)  # 2**-126 * ..., adjacent
    x[3] = torch.full((vocab,), -1e-3)
    x[3, :300] = (cluster * 2.0**126).flip(0)  # adjacent floats just above 1.0
    x[3, 300:320] = x[3, 150]  # ties inside the cluster
    for kw in (dict(top_p=torch.tensor([0.3, 0.6, 0.8, 0.5])), dict(min_p=torch.tensor([0.99, 0.7, 0.6, 0.999])),
               dict(top_k=torch.tensor([30, 101, 200, 160]), top_p=torch.tensor([0.9, 0.5, 0.7, 0.95]))):
        per_row = _general(x, kw, reads, seed=3)
        assert 1 <= per_row <= MAX_READS, (kw, per_row)


@pytest.mark.parametrize("case", range(8))
def test_random_rows_and_keywords_match_the_reference(case, gen):
    """Fresh logits, temperatures and keywords per case: the kept set and the draws."""
    rows, vocab = 4, 300
    x = _randn(gen, rows, vocab) * (torch.rand(rows, 1, generator=gen) * 3 + 0.1)
    kw = dict(temperature=torch.rand(rows, generator=gen) * 20 + 2,
              top_p=torch.rand(rows, generator=gen) * 0.9 + 0.09,
              min_p=torch.where(torch.rand(rows, generator=gen) < 0.5, 0.0, torch.rand(rows, generator=gen) * 0.5),
              top_k=torch.where(torch.rand(rows, generator=gen) < 0.5, 0,
                                torch.randint(17, vocab, (rows,), generator=gen)))
    spec = SamplingSpec.from_request("probs", x, **kw)
    _check_probs(triton_sampling.probs(spec, x, plan=SMALL), x, spec)
    got = triton_sampling.sample(SamplingSpec.from_request("sample", x, **kw, seed=case), x, plan=SMALL)
    assert torch.equal(got, sampling.sample(x, **kw, seed=case, backend="torch"))
