"""`anysoftmax.sampling.probs`, `sample` and `logprobs` on CPU tensors: shapes and dtypes, every
keyword form, the off values, greedy rows, seeds and offsets, invalid rows, errors naming the
argument. Values are compared with the float64 reference (`anysoftmax.sampling.reference`)."""

from __future__ import annotations

import math
import os

import pytest
import torch

import anysoftmax
import anysoftmax.sampling as sampling
from anysoftmax.core.errors import UnsupportedRequestError
from anysoftmax.sampling.reference import reference_probs
from anysoftmax.sampling.spec import SamplingSpec

SEED = int(os.environ.get("ANYSOFTMAX_TEST_SEED", "0"))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(SEED)


def _close(a, b):
    torch.testing.assert_close(a.double(), b.double(), atol=1e-6, rtol=2e-5, equal_nan=True)


def _ref(x, **kw):
    return reference_probs(x, SamplingSpec.from_request("probs", x, **kw))


def test_lazy_attribute_and_exports():
    assert anysoftmax.sampling is sampling
    assert set(sampling.__all__) == {"SamplingSpec", "logprobs", "probs", "sample"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_shapes_and_dtypes(gen, dtype):
    x = (torch.randn(2, 3, 40, generator=gen) * 2).to(dtype)
    p = sampling.probs(x, top_k=5)
    assert p.dtype == torch.float32 and p.shape == x.shape
    ids, lp = sampling.sample(x, seed=1, return_logprobs=True)
    assert ids.dtype == torch.int64 and ids.shape == (2, 3) and lp.dtype == torch.float32 and lp.shape == (2, 3)
    out = sampling.logprobs(x, ids[..., None], top_n=3)
    assert [t.shape for t in out] == [(2, 3, 1), (2, 3, 3), (2, 3, 3)]
    assert out[0].dtype == out[1].dtype == torch.float32 and out[2].dtype == torch.int64
    one = sampling.sample(x[0, 0], seed=1)  # one row: a 0-dim id
    assert one.shape == () and 0 <= int(one) < 40
    _close(p, _ref(x, top_k=5))


def test_defaults_are_off(gen):
    x = torch.randn(5, 30, generator=gen) * 3
    _close(sampling.probs(x), torch.softmax(x.double(), -1))
    for off in (dict(top_k=0), dict(top_k=30), dict(top_k=10**9), dict(top_p=1.0), dict(min_p=0.0),
                dict(temperature=1.0), dict(temperature=None, top_k=None, top_p=None, min_p=None)):
        _close(sampling.probs(x, **off), torch.softmax(x.double(), -1))
    _close(sampling.probs(x, temperature=0.5), torch.softmax(x.double() / 0.5, -1))


def test_keyword_forms_agree(gen):
    """A number, a 0-dim tensor, and per-row tensors in each accepted shape give one answer."""
    x = torch.randn(2, 3, 60, generator=gen) * 2
    want = sampling.probs(x, temperature=0.7, top_k=9, top_p=0.8, min_p=0.02)
    forms = [
        dict(temperature=torch.tensor(0.7), top_k=torch.tensor(9), top_p=torch.tensor(0.8), min_p=torch.tensor(0.02)),
        dict(temperature=torch.full((2, 3), 0.7), top_k=torch.full((6,), 9), top_p=torch.full((2, 3, 1), 0.8),
             min_p=torch.full((6,), 0.02, dtype=torch.float64)),
    ]
    for kw in forms:
        _close(sampling.probs(x, **kw), want)
    seeds = dict(seed=7, offset=3)
    assert torch.equal(sampling.sample(x, temperature=0.7, top_k=9, top_p=0.8, min_p=0.02, **seeds),
                       sampling.sample(x, **forms[1], **seeds))


def test_per_row_keywords_apply_per_row(gen):
    x = torch.randn(4, 50, generator=gen) * 2
    kw = dict(temperature=torch.tensor([0.5, 1.0, 1.5, 0.8]), top_k=torch.tensor([0, 3, 10, 50]),
              top_p=torch.tensor([0.9, 1.0, 0.5, 0.7]), min_p=torch.tensor([0.0, 0.1, 0.0, 0.05]))
    p = sampling.probs(x, **kw)
    for r in range(4):
        row = {k: float(v[r]) if k != "top_k" else int(v[r]) for k, v in kw.items()}
        _close(p[r], sampling.probs(x[r], **row))
        _close(p[r], _ref(x[r], **row))


def test_ties_and_boundaries():
    x = torch.tensor([[5.0, 3, 3, 3, 1, 0]])
    assert (sampling.probs(x, top_k=2) > 0).tolist() == [[True, True, True, True, False, False]]
    # top_p: mass strictly above the tied tokens at 3 is p(5) < top_p, so all three stay
    p5 = float(torch.softmax(x.double(), -1)[0, 0])
    assert (sampling.probs(x, top_p=p5 + 1e-3) > 0).tolist() == [[True, True, True, True, False, False]]
    assert (sampling.probs(x, top_p=p5 - 1e-3) > 0).tolist() == [[True, False, False, False, False, False]]
    half = -float(torch.tensor(math.log(2.0)))  # weights 1, 1/2, 1/2: mass above the halves is 0.5
    y = torch.tensor([[0.0, half, half, -math.inf]])
    assert (sampling.probs(y, top_p=0.5) > 0).tolist() == [[True, False, False, False]]
    assert (sampling.probs(y, top_p=0.5 + 2**-10) > 0).tolist() == [[True, True, True, False]]
    assert (sampling.probs(torch.tensor([[2.0, 2, 1]]), min_p=1.0) > 0).tolist() == [[True, True, False]]


def test_top_p_sees_the_top_k_renormalised_distribution():
    x = torch.tensor([[1.0, 0.5] + [0.0] * 18])
    # top_k = 2 leaves (0.62, 0.38): top_p = 0.6 drops the second (on the full distribution the
    # mass above it is 0.12, and it would stay).
    assert (sampling.probs(x, top_k=2, top_p=0.6) > 0).sum() == 1
    assert (sampling.probs(x, top_k=2, top_p=0.7) > 0).sum() == 2


def test_greedy_rows():
    x = torch.tensor([[1.0, 3, 3, 2], [0, -math.inf, 5, 5], [2, 1, 0.5, 0]])
    t = torch.tensor([0.0, 0.0, 1.0])
    p = sampling.probs(x, temperature=t, top_k=1, top_p=0.1, min_p=0.9)
    assert p[0].tolist() == [0, 1, 0, 0] and p[1].tolist() == [0, 0, 1, 0]
    for seed in (1, 2, 3, None):
        ids, lp = sampling.sample(x, temperature=t, seed=seed, return_logprobs=True)
        assert ids[:2].tolist() == [1, 2] and lp[:2].tolist() == [0.0, 0.0]
    lp = sampling.logprobs(x, torch.tensor([[1, 2, 0], [2, 3, 1], [0, 1, 2]]), temperature=t)
    assert torch.allclose(lp[0], torch.tensor([-math.log(2), -math.log(2), -math.inf]))
    assert lp[1, 2] == -math.inf


def test_invalid_rows():
    x = torch.tensor([[0.0, math.nan, 1], [math.inf, 0, 1], [-math.inf] * 3, [0, -math.inf, 1]])
    p = sampling.probs(x)
    assert bool(torch.isnan(p[:3]).all()) and not bool(torch.isnan(p[3]).any()) and p[3, 1] == 0
    ids, lp = sampling.sample(x, seed=0, return_logprobs=True)
    assert ids[:3].tolist() == [-1, -1, -1] and bool(torch.isnan(lp[:3]).all()) and ids[3] in (0, 2)
    assert bool(torch.isnan(sampling.logprobs(x, torch.zeros(4, 1, dtype=torch.int64))[:3]).all())


def test_seeds_and_offsets(gen):
    x = torch.randn(16, 100, generator=gen) * 0.1
    a = sampling.sample(x, seed=11, offset=4)
    assert torch.equal(a, sampling.sample(x, seed=11, offset=4))
    assert torch.equal(a, sampling.sample(x, seed=torch.tensor(11), offset=torch.tensor(4)))
    assert not torch.equal(a, sampling.sample(x, seed=11, offset=5))
    assert not torch.equal(a, sampling.sample(x, seed=12, offset=4))
    # seeds and offsets are taken modulo 2**64
    assert torch.equal(sampling.sample(x, seed=-1, offset=-2), sampling.sample(x, seed=2**64 - 1, offset=2**64 - 2))
    # a per-row seed: the row index does not enter, so row 0 of a batch seeded per row draws as
    # a one-row batch with that int seed (whose stream is its index, 0)
    seeds = torch.randint(-2**63, 2**63 - 1, (16,), generator=gen)
    per_row = sampling.sample(x, seed=seeds, offset=9)
    for r in (0, 5, 15):
        assert per_row[r] == sampling.sample(x[r:r + 1], seed=int(seeds[r]), offset=9)[0]


def test_no_seed_draws_from_the_default_generator(gen):
    x = torch.randn(32, 100, generator=gen) * 0.1
    with torch.random.fork_rng():
        torch.manual_seed(5)
        a, b = sampling.sample(x), sampling.sample(x)
        torch.manual_seed(5)
        c = sampling.sample(x)
        state = torch.get_rng_state()
        sampling.probs(x)  # probs draws nothing
        assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_logprobs_against_log_softmax(gen):
    x = torch.randn(3, 4, 70, generator=gen) * 3
    ids = torch.randint(0, 70, (3, 4, 5), generator=gen)
    t = torch.rand(3, 4, generator=gen) + 0.5
    want = torch.log_softmax(x.double() / t[..., None].double(), -1)
    got, values, top_ids = sampling.logprobs(x, ids, temperature=t, top_n=6)
    torch.testing.assert_close(got.double(), want.gather(-1, ids), atol=2e-5, rtol=1e-5)
    top = want.sort(dim=-1, descending=True)
    torch.testing.assert_close(values.double(), top.values[..., :6], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(want.gather(-1, top_ids), values.double(), atol=2e-5, rtol=1e-5)
    flat = sampling.logprobs(x.reshape(12, 70), ids.reshape(12, 5), temperature=t.reshape(12))
    assert torch.equal(flat, got.reshape(12, 5))
    assert sampling.logprobs(x, ids, top_n=0).shape == ids.shape  # a tensor, not a tuple


def test_sample_logprobs_are_the_drawn_tokens(gen):
    x = torch.randn(20, 80, generator=gen) * 2
    kw = dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.01)
    ids, lp = sampling.sample(x, **kw, seed=3, return_logprobs=True)
    ref = _ref(x, **kw)
    assert bool((ref.gather(-1, ids[:, None]) > 0).all())
    torch.testing.assert_close(lp.double(), torch.log(ref.gather(-1, ids[:, None])[:, 0]), atol=2e-5, rtol=1e-5)


def test_inputs_untouched_views_and_empty_batches(gen):
    base = torch.randn(40, 6, generator=gen)
    x = base.t()  # a strided view: rows of 40 with stride 6
    before = x.clone()
    kw = dict(temperature=torch.rand(6, generator=gen) + 0.5, top_p=0.8)
    assert torch.equal(sampling.sample(x, **kw, seed=2), sampling.sample(x.contiguous(), **kw, seed=2))
    _close(sampling.probs(x, **kw), sampling.probs(x.contiguous(), **kw))
    assert torch.equal(x, before)
    g = torch.randn(3, 9, requires_grad=True)
    assert not sampling.probs(g).requires_grad
    empty = torch.randn(0, 9)
    assert sampling.probs(empty).shape == (0, 9) and sampling.sample(empty, seed=1).shape == (0,)
    assert sampling.sample(empty).shape == (0,)


BAD = [
    (dict(temperature=-0.1), ValueError, "temperature"),
    (dict(temperature=math.inf), ValueError, "temperature"),
    (dict(temperature=math.nan), ValueError, "temperature"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.01), ValueError, "top_p"),
    (dict(min_p=-0.01), ValueError, "min_p"),
    (dict(min_p=1.5), ValueError, "min_p"),
    (dict(top_k=-3), ValueError, "top_k"),
    (dict(top_k=True), TypeError, "top_k"),
    (dict(temperature=False), TypeError, "temperature"),
    (dict(top_k=2.0), TypeError, "top_k"),
    (dict(top_p="0.5"), TypeError, "top_p"),
    (dict(seed=2**64), ValueError, "seed"),
    (dict(seed=-2**63 - 1), ValueError, "seed"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(seed=True), TypeError, "seed"),
    (dict(offset=2**70), ValueError, "offset"),
    (dict(temperature=torch.ones(4)), ValueError, "temperature"),
    (dict(top_k=torch.ones(2, 3, dtype=torch.int64)), ValueError, "top_k"),
    (dict(top_p=torch.ones(3, 2)), ValueError, "top_p"),
    (dict(seed=torch.ones(5, dtype=torch.int64)), ValueError, "seed"),
    (dict(offset=torch.ones(1, 3, dtype=torch.int64)), ValueError, "offset"),
    (dict(temperature=torch.tensor([1.0, -1.0, 1.0])), ValueError, "temperature"),
    (dict(top_p=torch.tensor([0.5, 0.0, 1.0])), ValueError, "top_p"),
    (dict(min_p=torch.tensor([0.5, 2.0, 0.0])), ValueError, "min_p"),
    (dict(top_k=torch.tensor([1, -1, 0])), ValueError, "top_k"),
    (dict(temperature=torch.ones(3, dtype=torch.int64)), TypeError, "temperature"),
    (dict(top_k=torch.ones(3)), TypeError, "top_k"),
    (dict(top_k=torch.ones(3, dtype=torch.bool)), TypeError, "top_k"),
    (dict(seed=torch.ones(3)), TypeError, "seed"),
    (dict(temperature=torch.ones(3, device="meta")), ValueError, "temperature"),
    (dict(return_logprobs=1), TypeError, "return_logprobs"),
    (dict(backend=3), TypeError, "backend"),
    (dict(backend="wave"), UnsupportedRequestError, "no sampler"),
]


@pytest.mark.parametrize("kwargs,exc,word", BAD, ids=[f"{list(k)[0]}={k[list(k)[0]]!r}"[:40] for k, _, _ in BAD])
def test_bad_keywords_name_the_argument(kwargs, exc, word):
    x = torch.randn(3, 5)
    with pytest.raises(exc, match=word):
        sampling.sample(x, **kwargs)


@pytest.mark.parametrize("call,exc,word", [
    (lambda: sampling.probs(torch.arange(6).reshape(2, 3)), TypeError, "logits"),
    (lambda: sampling.probs(torch.ones(2, 3, dtype=torch.bool)), TypeError, "logits"),
    (lambda: sampling.probs(torch.ones(2, 3, dtype=torch.complex64)), TypeError, "logits"),
    (lambda: sampling.probs([[1.0, 2.0]]), TypeError, "logits"),
    (lambda: sampling.sample(torch.tensor(1.0)), ValueError, "logits"),
    (lambda: sampling.sample(torch.ones(3, 0)), ValueError, "logits"),
    (lambda: sampling.probs(torch.ones(2, 3), backend="cute"), UnsupportedRequestError, "cute"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.zeros(3, 1, dtype=torch.int64)), ValueError, "ids"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.zeros(2, dtype=torch.int64)), ValueError, "ids"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.zeros(2, 1)), TypeError, "ids"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.tensor([[0], [3]])), ValueError, "ids"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.tensor([[0], [-1]])), ValueError, "ids"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.zeros(2, 1, dtype=torch.int64), top_n=4), ValueError,
     "top_n"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.zeros(2, 1, dtype=torch.int64), top_n=1.0), TypeError,
     "top_n"),
    (lambda: sampling.logprobs(torch.ones(2, 3), torch.zeros(2, 1, dtype=torch.int64), temperature=-1.0),
     ValueError, "temperature"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_calls_name_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


def test_cpu_scalar_tensors_are_numbers_beside_other_devices():
    """A 0-dim CPU tensor is read on the host (no device sync); other CPU tensors must be on
    the logits' device."""
    x = torch.empty(3, 5, device="meta")
    spec = SamplingSpec.from_request("sample", x, temperature=torch.tensor(0.5), seed=torch.tensor(3))
    assert spec.temperature == 0.5 and spec.seed == 3
    with pytest.raises(ValueError, match="seed"):
        SamplingSpec.from_request("sample", x, seed=torch.ones(3, dtype=torch.int64))


@pytest.mark.parametrize("name", ["wave", "cute"])
def test_backends_without_a_sampler_say_why(name):
    for call in (lambda: sampling.sample(torch.randn(2, 5), seed=1, backend=name),
                 lambda: sampling.probs(torch.randn(2, 5), backend=name),
                 lambda: sampling.logprobs(torch.randn(2, 5), torch.zeros(2, 1, dtype=torch.int64), backend=name)):
        with pytest.raises(UnsupportedRequestError, match=f"backend '{name}' has no sampler: no sampler kernels \\("):
            call()


def test_an_unknown_backend_is_named():
    with pytest.raises(ValueError, match="probs: unknown backend 'tritn'.*did you mean 'triton'"):
        sampling.probs(torch.randn(2, 5), backend="tritn")


class _DuckSampler:
    """A duck-typed backend plugin declaring a sampler (the `torch` sampler's functions)."""

    name, devices, priority = "duck-sampler", ("cpu",), -1

    def is_available(self):
        return None

    def supports(self, spec):
        return None

    def run(self, x, spec):
        return torch.softmax(x, spec.dim)

    def sampler(self):
        from anysoftmax.sampling import torch_sampler

        return torch_sampler


def test_a_plugin_declares_a_sampler():
    from anysoftmax.core import registry

    registry.register(_DuckSampler())
    try:
        x = torch.randn(3, 40)
        assert torch.equal(sampling.sample(x, top_k=4, seed=9, backend="duck-sampler"),
                           sampling.sample(x, top_k=4, seed=9, backend="torch"))
    finally:
        registry.unregister("duck-sampler")
