"""anysoftmax.compat.flashinfer: FlashInfer's sampling signatures served by
`anysoftmax.sampling`, against the float64 reference and against FlashInfer's documented
behaviour (re-implemented below in torch) on distinct probabilities; the documented
differences (ties, greedy temperature, ids of invalid rows) and bad input."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.compat import flashinfer as fi
from anysoftmax.sampling.reference import reference_kept, reference_probs
from anysoftmax.sampling.spec import SamplingSpec

ROWS, VOCAB = 6, 40


def _distinct_probs(gen, rows=ROWS, vocab=VOCAB):
    """Rows of distinct probabilities (a random permutation of distinct weights)."""
    w = torch.stack([torch.randperm(vocab, generator=gen).double() for _ in range(rows)])
    logits = (w * 0.15 + torch.rand(rows, vocab, generator=gen, dtype=torch.float64) * 0.01).float()
    return logits, torch.softmax(logits.double(), -1).float()


def _flashinfer_top_k(probs, k):
    """FlashInfer's documented top-k: keep the k largest probabilities (distinct), renormalise."""
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, probs.topk(k, -1).indices, True)
    kept = torch.where(keep, probs.double(), 0)
    return keep, kept / kept.sum(-1, keepdim=True)


def _flashinfer_top_p(probs, p):
    """FlashInfer's documented top-p: keep probs >= the threshold at which the mass of
    ``probs[probs >= threshold]`` reaches top_p, renormalise."""
    q = probs.double() / probs.double().sum(-1, keepdim=True)
    srt, order = q.sort(-1, descending=True)
    before = srt.cumsum(-1) - srt  # mass of the larger probabilities
    keep = torch.zeros_like(q, dtype=torch.bool).scatter_(-1, order, before < p)
    kept = torch.where(keep, q, 0)
    return keep, kept / kept.sum(-1, keepdim=True)


def test_softmax_with_temperature_matches_the_float64_reference(gen):
    logits = torch.randn(ROWS, VOCAB, generator=gen) * 4
    t = torch.rand(ROWS, generator=gen) + 0.3
    for temperature in (None, 0.7, t):
        got = fi.softmax(logits, temperature=temperature)
        want = torch.softmax(logits.double() / (1.0 if temperature is None else
                                                 (temperature[:, None] if isinstance(temperature, torch.Tensor)
                                                  else temperature)), -1)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=1e-6)
    greedy = fi.softmax(logits, temperature=torch.zeros(ROWS))  # (FlashInfer divides by 0)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.equal(greedy.sum(-1), torch.ones(ROWS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_renorm_probs_match_flashinfers_documented_sets(gen, dtype):
    _, probs = _distinct_probs(gen)
    probs = probs.to(dtype)
    k = torch.randint(1, VOCAB, (ROWS,), generator=gen)
    p = torch.rand(ROWS, generator=gen) * 0.8 + 0.1
    for got, (keep, want) in ((fi.top_k_renorm_probs(probs, 7), _flashinfer_top_k(probs, 7)),
                              (fi.top_p_renorm_probs(probs, 0.6), _flashinfer_top_p(probs, 0.6)),
                              (fi.top_p_renorm_probs(probs, p), _flashinfer_top_p(probs, p[:, None].double()))):
        assert got.dtype == dtype and torch.equal(got > 0, keep)
        torch.testing.assert_close(got.double(), want, rtol=2e-2 if dtype == torch.bfloat16 else 2e-5, atol=1e-6)
    for row, kk in enumerate(k.tolist()):  # per-row top_k
        keep, _ = _flashinfer_top_k(probs[row:row + 1], kk)
        assert torch.equal(fi.top_k_renorm_probs(probs, k)[row:row + 1] > 0, keep)


def test_top_k_mask_logits_keeps_the_top_k_and_ties_at_the_kth(gen):
    logits, _ = _distinct_probs(gen)
    got = fi.top_k_mask_logits(logits, 5)
    keep, _ = _flashinfer_top_k(logits, 5)
    assert torch.equal(got, logits.masked_fill(~keep, -math.inf))
    assert torch.equal(fi.top_k_mask_logits(logits, 0), logits) and torch.equal(fi.top_k_mask_logits(logits, VOCAB),
                                                                                  logits)
    ties = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.5]], dtype=torch.bfloat16)  # k = 2: both 2.0 kept (documented)
    assert torch.equal(fi.top_k_mask_logits(ties, 2), torch.tensor([[3.0, -math.inf, 2.0, 2.0, -math.inf]],
                                                                    dtype=torch.bfloat16))


def test_sampling_functions_draw_anysoftmax_samplers_ids(gen):
    """Each function is `anysoftmax.sampling.sample` of the same distribution (probabilities
    as their logs): the same ids for the same seed and offset, int32, inside FlashInfer's set
    and the float64 reference's kept set."""
    logits, probs = _distinct_probs(gen, rows=64)
    logp = torch.log(probs)
    seed, offset = int(torch.randint(0, 2**62, (), generator=gen)), 3
    cases = [
        (fi.sampling_from_logits(logits, seed=seed, offset=offset), logits, {}),
        (fi.sampling_from_probs(probs, seed=seed, offset=offset), logp, {}),
        (fi.top_k_sampling_from_probs(probs, 5, seed=seed, offset=offset), logp, {"top_k": 5}),
        (fi.top_p_sampling_from_probs(probs, 0.5, seed=seed, offset=offset), logp, {"top_p": 0.5}),
        (fi.min_p_sampling_from_probs(probs, 0.3, seed=seed, offset=offset), logp, {"min_p": 0.3}),
        (fi.top_k_top_p_sampling_from_logits(logits, 9, 0.7, seed=seed, offset=offset), logits,
         {"top_k": 9, "top_p": 0.7}),
        (fi.top_k_top_p_sampling_from_probs(probs, 9, 0.7, seed=seed, offset=offset), logp,
         {"top_k": 9, "top_p": 0.7}),
    ]
    for got, source, kw in cases:
        assert got.dtype == torch.int32
        assert torch.equal(got.long(), sampling.sample(source, seed=seed, offset=offset, **kw)), kw
        kept = reference_kept(source, SamplingSpec.from_request("sample", source, **kw))
        assert kept.gather(-1, got.long()[:, None]).all(), kw
    keep_k, q = _flashinfer_top_k(probs, 9)  # FlashInfer's top_k_first: top-p on the top-k renormalised
    keep, _ = _flashinfer_top_p(q.float(), 0.7)
    assert keep.gather(-1, cases[5][0].long()[:, None]).all()
    keep_minp = probs >= 0.3 * probs.amax(-1, keepdim=True)
    assert keep_minp.gather(-1, cases[4][0].long()[:, None]).all()


def test_joint_order_filters_the_original_distribution(gen):
    """"joint": top-k and top-p each on the original distribution (FlashInfer's documented
    order), which keeps more tokens than top_k_first when top_k cuts mass off (top-p then
    counts the original, smaller probabilities)."""
    logits, probs = _distinct_probs(gen, rows=256, vocab=30)
    k, p = 4, 0.5
    joint = fi.top_k_top_p_sampling_from_logits(logits, k, p, filter_apply_order="joint", seed=5)
    keep = _flashinfer_top_k(probs, k)[0] & _flashinfer_top_p(probs, p)[0]
    assert keep.gather(-1, joint.long()[:, None]).all()
    first_k = _flashinfer_top_k(probs, k)
    assert (_flashinfer_top_p(first_k[1].float(), p)[0].sum() < keep.sum()).item()  # (the orders differ here)
    want = sampling.sample(logits.masked_fill(~keep, -math.inf), seed=5)
    assert (joint.long() == want).float().mean() >= 0.999  # (a boundary within float32 rounding may differ)


def test_indices_generator_and_per_request_seeds(gen):
    logits, _ = _distinct_probs(gen)
    indices = torch.tensor([5, 0, 0, 3], dtype=torch.int64)
    got = fi.top_k_top_p_sampling_from_logits(logits, 8, 0.9, indices=indices, seed=11)
    assert got.dtype == torch.int64
    assert torch.equal(got, sampling.sample(logits[indices], top_k=8, top_p=0.9, seed=11))
    joint = fi.top_k_top_p_sampling_from_logits(logits, 8, 0.9, indices=indices.int(), seed=11,
                                                filter_apply_order="joint")
    assert joint.dtype == torch.int32 and joint.shape == (4,)
    seeds = torch.randint(0, 2**62, (ROWS,), generator=gen)
    per_row = fi.sampling_from_logits(logits, seed=seeds, offset=torch.tensor([2]))
    assert torch.equal(per_row.long(), sampling.sample(logits, seed=seeds, offset=2))
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a, b = fi.sampling_from_logits(logits, generator=g1), fi.sampling_from_logits(logits, generator=g2)
    assert torch.equal(a, b)  # (a generator supplies the seed, and advances)
    assert not all(torch.equal(a, fi.sampling_from_logits(logits, generator=g1)) for _ in range(3))


def test_invalid_rows_give_minus_one_and_nan_probabilities():
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [float("nan"), 0.5, 0.5]])
    ids = fi.sampling_from_probs(probs, seed=1)
    assert ids[0].item() in (0, 1) and ids[1:].tolist() == [-1, -1]
    assert torch.isnan(fi.top_k_renorm_probs(probs, 1)[1:]).all()
    assert torch.equal(reference_probs(torch.log(probs[:1]), SamplingSpec.from_request("probs", probs[:1])).float(),
                       fi.top_p_renorm_probs(probs[:1], 1.0))


def test_bad_input_names_the_argument(gen):
    logits, probs = _distinct_probs(gen)
    with pytest.raises(ValueError, match="filter_apply_order"):
        fi.top_k_top_p_sampling_from_logits(logits, 3, 0.5, filter_apply_order="top_p_first")
    with pytest.raises(ValueError, match="top_p"):
        fi.top_p_renorm_probs(probs, 0.0)
    with pytest.raises(ValueError, match="top_k"):
        fi.top_k_mask_logits(logits, -1)
    with pytest.raises(ValueError, match="min_p"):
        fi.min_p_sampling_from_probs(probs, 1.5)
    with pytest.raises(TypeError, match="indices"):
        fi.sampling_from_logits(logits, indices=torch.tensor([0.0]))
    with pytest.raises(ValueError, match="indices"):
        fi.sampling_from_logits(logits, indices=torch.tensor([ROWS]))
    with pytest.raises(ValueError, match="check_nan"):
        fi.sampling_from_logits(logits.masked_fill(logits > logits.median(), math.nan), check_nan=True)
    with pytest.raises(TypeError, match="probs"):
        fi.sampling_from_probs(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="batch_size, vocab_size"):
        fi.sampling_from_logits(logits[None])
    with pytest.raises(TypeError, match="generator"):
        fi.sampling_from_logits(logits, generator=7)
    with pytest.raises(ValueError, match="temperature"):
        fi.softmax(logits, temperature=-1.0)
