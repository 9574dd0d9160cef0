"""A repeated sampling request (`anysoftmax.sampling`'s hit path): its form (the metadata of the
logits and keywords, which keywords are numbers) is checked and its implementation chosen once,
then each call checks only its values. The hit path must give what a fresh request gives when a
keyword changes between a number, a tensor and None, for other addresses and strides, and must
still refuse bad values on a later call of a form it has seen."""

from __future__ import annotations

import gc
import math
import os
import weakref

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.core import registry
from anysoftmax.core.backend import Backend
from anysoftmax.sampling import torch_sampler
from anysoftmax.sampling.reference import reference_probs
from anysoftmax.sampling.spec import SamplingSpec, SpecForm
from helpers import runnable_backends

SEED = int(os.environ.get("ANYSOFTMAX_TEST_SEED", "0"))
ROWS, VOCAB = 3, 40


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(SEED)


def _close(a, b):
    torch.testing.assert_close(a.double(), b.double(), atol=1e-6, rtol=2e-5, equal_nan=True)


def _forms(name: str, gen) -> list:
    """Values of keyword `name` in every form: numbers, per-row tensors (flat, [rows, 1], a
    strided view), a 0-dim tensor, None; each form twice over (the second a hit)."""
    def rows(lo, hi, dtype=torch.float32):
        if dtype == torch.int64:
            return torch.randint(lo, hi, (ROWS,), generator=gen)
        return torch.rand(ROWS, generator=gen) * (hi - lo) + lo
    if name == "temperature":
        made = [0.7, rows(0.3, 2.0), None, rows(0.3, 2.0)[:, None], torch.tensor(1.3), 0.0,
                rows(0.3, 2.0).repeat_interleave(2)[::2]]
    elif name == "top_k":
        made = [5, rows(0, VOCAB, torch.int64), None, rows(1, 8, torch.int64).to(torch.int32), torch.tensor(3), 0]
    elif name == "top_p":
        made = [0.8, rows(0.2, 1.0), None, rows(0.2, 1.0)[:, None], torch.tensor(0.5), 1.0]
    elif name == "min_p":
        made = [0.1, rows(0.0, 0.5), None, rows(0.0, 0.5)[:, None], torch.tensor(0.2), 0.0]
    else:  # seed, offset
        made = [7, rows(0, 2**62, torch.int64), None if name == "seed" else 0, torch.tensor(11),
                rows(0, 2**40, torch.int64)[:, None], 2**64 - 5]
    return made + made


@pytest.mark.parametrize("name", ["temperature", "top_k", "top_p", "min_p"])
def test_probs_follow_a_keyword_through_every_form(gen, name):
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    for value in _forms(name, gen):
        kw = {"top_k": 4, name: value}  # (with a filter beside: a form of two keywords)
        _close(sampling.probs(x, **kw), reference_probs(x, SamplingSpec.from_request("probs", x, **kw)))


@pytest.mark.parametrize("name", ["temperature", "top_k", "top_p", "min_p", "seed", "offset"])
def test_draws_follow_a_keyword_through_every_form(gen, name):
    """Each call's ids are those of the torch sampler on the request checked afresh."""
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    for value in _forms(name, gen):
        kw = {"seed": 5, name: value} if name != "seed" or value is not None else {name: value}
        if kw.get("seed") is None:
            state = torch.get_rng_state()
            got = sampling.sample(x, **kw)
            torch.set_rng_state(state)
        else:
            got = sampling.sample(x, **kw)
        assert torch.equal(got, torch_sampler.sample(SamplingSpec.from_request("sample", x, **kw), x)), (name, value)


def test_other_addresses_and_strides_of_one_form(gen):
    """The form holds shapes, not addresses or strides: a strided view of the logits and of a
    keyword, and new tensors of the same shapes, give what their contiguous copies give."""
    base = torch.randn(VOCAB, ROWS, generator=gen)
    x = base.t()
    t = (torch.rand(2 * ROWS, generator=gen) + 0.5)[::2]
    seeds = torch.randint(0, 2**62, (ROWS,), generator=gen)
    first = sampling.sample(x.contiguous(), temperature=t.contiguous(), top_p=0.9, seed=seeds)
    assert torch.equal(sampling.sample(x, temperature=t, top_p=0.9, seed=seeds.clone()), first)
    _close(sampling.probs(x, temperature=t, top_k=6), sampling.probs(x.contiguous(), temperature=t.contiguous(),
                                                                      top_k=6))
    y = torch.randn(ROWS, VOCAB, generator=gen)
    assert torch.equal(sampling.sample(y, temperature=t, top_p=0.9, seed=seeds),
                       torch_sampler.sample(SamplingSpec.from_request("sample", y, temperature=t, top_p=0.9,
                                                                      seed=seeds), y))


def test_logprobs_ids_of_one_form(gen):
    x = torch.randn(ROWS, VOCAB, generator=gen)
    for ids in (torch.randint(0, VOCAB, (ROWS, 2), generator=gen), torch.randint(0, VOCAB, (ROWS, 2), generator=gen),
                torch.randint(0, VOCAB, (ROWS, 2), generator=gen).to(torch.int32)):
        got, values, top_ids = sampling.logprobs(x, ids, temperature=0.5, top_n=3)
        want = torch.log_softmax(x.double() / 0.5, -1)
        _close(got, want.gather(-1, ids.long()))
        _close(values, want.topk(3, -1).values)


LATER_BAD = [  # (a good call, the same form with a bad value, the error, the word it names)
    (dict(temperature=0.5), dict(temperature=-1.0), ValueError, "temperature"),
    (dict(temperature=0.5), dict(temperature=math.nan), ValueError, "temperature"),
    (dict(temperature=0.5), dict(temperature="0.5"), TypeError, "temperature"),
    (dict(top_k=3), dict(top_k=2.0), TypeError, "top_k"),
    (dict(top_k=3), dict(top_k=True), TypeError, "top_k"),
    (dict(top_k=3), dict(top_k=-1), ValueError, "top_k"),
    (dict(top_p=0.5), dict(top_p=0.0), ValueError, "top_p"),
    (dict(min_p=0.5), dict(min_p=1.5), ValueError, "min_p"),
    (dict(seed=3), dict(seed=2**64), ValueError, "seed"),
    (dict(offset=3), dict(offset=-2**63 - 1), ValueError, "offset"),
    (dict(temperature=torch.ones(3)), dict(temperature=torch.tensor([1.0, -1.0, 1.0])), ValueError, "temperature"),
    (dict(top_p=torch.ones(3)), dict(top_p=torch.tensor([0.5, 0.0, 1.0])), ValueError, "top_p"),
    (dict(min_p=torch.zeros(3, 1)), dict(min_p=torch.tensor([[0.5], [2.0], [0.0]])), ValueError, "min_p"),
    (dict(top_k=torch.ones(3, dtype=torch.int64)), dict(top_k=torch.tensor([1, -1, 0])), ValueError, "top_k"),
    (dict(temperature=torch.ones(100)), dict(temperature=torch.ones(100).index_fill(0, torch.tensor([77]), -2.0)),
     ValueError, "temperature"),
    (dict(return_logprobs=True), dict(return_logprobs=1), TypeError, "return_logprobs"),
]


TRITON_ON_CPU = pytest.param("triton", marks=pytest.mark.skipif(
    "triton" not in runnable_backends("cpu"), reason="triton does not run on CPU here: TRITON_INTERPRET is not set"))


@pytest.mark.parametrize("backend", [None, TRITON_ON_CPU])
@pytest.mark.parametrize("good,bad,exc,word", LATER_BAD, ids=[f"{list(b)[0]}={b[list(b)[0]]!r}"[:40]
                                                             for _, b, _, _ in LATER_BAD])
def test_a_later_call_of_a_seen_form_checks_its_values(good, bad, exc, word, backend):
    rows = max([v.numel() for v in good.values() if isinstance(v, torch.Tensor)] + [3])
    x = torch.randn(rows, 5)
    sampling.sample(x, **{"seed": 1, **good}, backend=backend)
    for _ in range(2):  # (twice: a refused call leaves nothing behind)
        with pytest.raises(exc, match=word):
            sampling.sample(x, **{"seed": 1, **bad}, backend=backend)


@pytest.mark.parametrize("name", ["temperature", "seed"])
@pytest.mark.parametrize("backend", [TRITON_ON_CPU])
def test_triton_draws_follow_a_keyword_through_every_form(gen, name, backend):
    """The Triton sampler's runners: a keyword changing between a number, tensors of other
    shapes and strides, and None, is a request of another form (its own runner), and a form
    seen again reuses its runner with the call's values."""
    x = torch.randn(ROWS, VOCAB, generator=gen) * 3
    for value in _forms(name, gen):
        kw = {"seed": 5, "top_k": 6, name: value}
        state = torch.get_rng_state()
        got = sampling.sample(x, **kw, backend=backend)
        torch.set_rng_state(state)
        assert torch.equal(got, torch_sampler.sample(SamplingSpec.from_request("sample", x, **kw), x)), (name, value)


def test_a_later_call_checks_ids_and_top_n():
    x = torch.randn(2, 5)
    ids = torch.zeros(2, 1, dtype=torch.int64)
    sampling.logprobs(x, ids, top_n=1)
    with pytest.raises(ValueError, match="ids"):
        sampling.logprobs(x, torch.tensor([[0], [5]]), top_n=1)
    with pytest.raises(TypeError, match="top_n"):
        sampling.logprobs(x, ids, top_n=1.0)
    with pytest.raises(TypeError, match="ids"):
        sampling.logprobs(x, [[0], [1]], top_n=1)


class _CountingSampler(Backend):
    """A backend whose sampler is the torch sampler's, counting its availability probes."""

    name, devices, priority = "counting-sampler", ("cpu",), -1
    probes = 0

    def is_available(self):
        self.probes += 1
        return None

    def sampler(self):
        return torch_sampler


def test_a_repeated_request_is_checked_and_chosen_once(gen):
    """The implementation of a request seen before is found by its key: the backend is not
    probed again (a probe per call costs microseconds on every decode step)."""
    plugin = _CountingSampler()
    registry.register(plugin)
    try:
        x = torch.randn(ROWS, VOCAB, generator=gen)
        t = torch.rand(ROWS, generator=gen) + 0.5
        first = sampling.sample(x, temperature=t, top_k=4, seed=9, backend=plugin.name)
        probes = plugin.probes
        for _ in range(5):
            assert torch.equal(sampling.sample(x, temperature=t, top_k=4, seed=9, backend=plugin.name), first)
        assert plugin.probes == probes
    finally:
        registry.unregister(plugin.name)
    with pytest.raises(ValueError, match="unknown backend"):  # (a new registry generation: chosen afresh)
        sampling.sample(x, temperature=t, top_k=4, seed=9, backend=plugin.name)


@pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                    reason="triton does not run on CPU here: TRITON_INTERPRET is not set")
def test_the_triton_sampler_on_its_hit_path(gen):
    """Through the interpreter: a repeated request, and the same form with new values and
    tensors, draw what the torch sampler draws for those values (the draw's definition)."""
    x = torch.randn(2, 200, generator=gen) * 2
    for _ in range(2):
        t = torch.rand(2, generator=gen) + 0.5
        seeds = torch.randint(0, 2**62, (2,), generator=gen)
        kw = dict(temperature=t, top_k=torch.tensor([5, 0]), top_p=0.9, seed=seeds)
        got = sampling.sample(x, **kw, backend="triton")
        assert torch.equal(got, torch_sampler.sample(SamplingSpec.from_request("sample", x, **kw), x))
    with pytest.raises(ValueError, match="top_p"):
        sampling.sample(x, **{**kw, "top_p": 1.5}, backend="triton")


@pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                    reason="triton does not run on CPU here: TRITON_INTERPRET is not set")
def test_a_repeated_triton_request_builds_no_request(gen, monkeypatch):
    """A seen form of the Triton sampler runs its runner: each call's values are checked and go
    to the launches bound for the form, no `SamplingSpec` is built; the results are still those
    of the torch sampler on the request checked afresh."""
    x = torch.randn(2, 200, generator=gen) * 2
    ids = torch.randint(0, 200, (2, 3), generator=gen)

    def keywords(top_k):
        return dict(temperature=torch.rand(2, generator=gen) + 0.5, top_k=top_k, top_p=0.9,
                    seed=torch.randint(0, 2**62, (2,), generator=gen))
    calls = [("sample", keywords(5)), ("sample", keywords(9)), ("probs", dict(temperature=torch.rand(2) + 0.5)),
             ("probs", dict(temperature=torch.rand(2) + 0.2)), ("logprobs", dict(temperature=0.7)),
             ("logprobs", dict(temperature=1.3))]
    for op, kw in calls[::2]:  # (each form seen once)
        getattr(sampling, op)(x, *(ids,) if op == "logprobs" else (), **kw, backend="triton")
    built = []
    real = SpecForm.spec
    monkeypatch.setattr(SpecForm, "spec", lambda self, values: built.append(values) or real(self, values))
    got = [getattr(sampling, op)(x, *(ids,) if op == "logprobs" else (), **kw, backend="triton") for op, kw in calls]
    assert built == [], "a repeated request built its SamplingSpec"
    for (op, kw), result in zip(calls, got):
        spec = SamplingSpec.from_request(op, x, **kw)
        if op == "sample":
            assert torch.equal(result, torch_sampler.sample(spec, x))
        elif op == "probs":
            _close(result, reference_probs(x, spec))
        else:
            _close(result, torch.log_softmax(x.double() / kw["temperature"], -1).gather(-1, ids))


@pytest.mark.parametrize("backend", [None, TRITON_ON_CPU])
def test_a_seen_form_keeps_no_call_tensor_alive(gen, backend):
    """A request's memoised runner holds its form, not the tensors of the call that made it."""
    x = torch.randn(2, 200, generator=gen)
    t = torch.rand(2, generator=gen) + 0.5
    seeds = torch.randint(0, 2**62, (2,), generator=gen)
    refs = [weakref.ref(t), weakref.ref(seeds)]
    sampling.sample(x, temperature=t, top_k=5, seed=seeds, backend=backend)
    del t, seeds
    gc.collect()
    assert [r() for r in refs] == [None, None]
