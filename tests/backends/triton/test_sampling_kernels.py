"""The Triton sampler (`_triton_common/sampling.py`, `sampling_kernels.py`) through
`anysoftmax.sampling(..., backend="triton")`: the kit's sampler section through the interpreter
(its heavy statistical checks on a GPU), every keyword as a number and as a per-row tensor,
greedy rows, ties at the k-th value, -inf logits, float32/bfloat16/float16, logprobs with
top_n, the same seeded draws as the `torch` sampler, and each path of the select (the chunks'
race, the candidates, the general path over the whole row) forced on small vocabularies by
small plans."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

import anysoftmax.sampling as sampling
from anysoftmax.core.errors import UnsupportedRequestError
from anysoftmax.backends._triton_common import launcher
from anysoftmax.backends._triton_common import sampling as triton_sampling
from anysoftmax.backends._triton_common import sampling_kernels
from anysoftmax.sampling import rng
from anysoftmax.sampling.reference import reference_distribution, reference_logprobs
from anysoftmax.sampling.spec import SamplingSpec
from anysoftmax.testing.kit import run_checks
from anysoftmax.testing.sampling import PROB_ATOL, PROB_RTOL
from helpers import runnable_backends
from helpers.sampler_kit import interpreter_checks
from helpers.shards import sharded_sample

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

triton_sample = functools.partial(sampling.sample, backend="triton")
triton_probs = functools.partial(sampling.probs, backend="triton")
triton_logprobs = functools.partial(sampling.logprobs, backend="triton")

# A plan that cuts rows of a few hundred tokens into several chunks with few candidate slots
# (k_cap = 16), so the interpreter runs the multi-chunk merge and each path of the select.
SMALL = triton_sampling.SamplingPlan(chunk=128, slots=32, grid=4, num_warps=4, tile=64)


def _logits(gen, rows, vocab, dtype=torch.float32, scale=3.0):
    return (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)


def _assert_probs(got, logits, spec):
    ref = reference_distribution(logits, spec).probs.reshape(logits.shape)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan), "NaN rows differ"
    assert torch.equal(got[~nan] > 0, ref[~nan] > 0), "kept sets differ"
    err = (got.double() - ref).abs()[~nan]
    assert bool((err <= PROB_ATOL + PROB_RTOL * ref[~nan]).all()), f"max error {float(err.max()):.3g}"


def test_the_kit_sampler_section_through_the_interpreter(seed):
    """Every kit check but those drawing thousands of rows (the whole section runs on a GPU: test_sampling_kit_gpu.py)."""
    checks = interpreter_checks(triton_sample, triton_probs, triton_logprobs)
    report = run_checks(checks, "triton", "cpu", seed)
    assert not report.failed and not report.skipped, report.text()
    assert len(report.passed) == len(checks) > 40


KEYWORDS = {"temperature": (0.7, lambda g, n: torch.rand(n, generator=g) + 0.3),
            "top_k": (7, lambda g, n: torch.randint(0, 24, (n,), generator=g)),
            "top_p": (0.8, lambda g, n: torch.rand(n, generator=g) * 0.9 + 0.1),
            "min_p": (0.05, lambda g, n: torch.rand(n, generator=g) * 0.2)}


@pytest.mark.parametrize("form", ["number", "per-row"])
@pytest.mark.parametrize("name", list(KEYWORDS))
def test_each_keyword_as_a_number_and_per_row(name, form, gen):
    rows, vocab = 4, 300
    x = _logits(gen, rows, vocab)
    number, per_row = KEYWORDS[name]
    kw = {name: number if form == "number" else per_row(gen, rows)}
    for plan in (None, SMALL):
        spec = SamplingSpec.from_request("probs", x, **kw)
        _assert_probs(triton_sampling.probs(spec, x, plan=plan), x, spec)
        seeded = SamplingSpec.from_request("sample", x, **kw, seed=11, offset=3)
        ids, lp = triton_sampling.sample(seeded, x, True, plan=plan)
        want, want_lp = sampling.sample(x, **kw, seed=11, offset=3, return_logprobs=True, backend="torch")
        assert torch.equal(ids, want)
        assert torch.allclose(lp, want_lp, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_and_batch_dims(dtype, gen):
    x = _logits(gen, 6, 300, dtype).reshape(2, 3, 300)
    kw = dict(temperature=torch.rand(2, 3, generator=gen) + 0.5, top_k=20, top_p=0.9, min_p=0.01)
    _assert_probs(triton_probs(x, **kw), x, SamplingSpec.from_request("probs", x, **kw))
    ids = triton_sample(x, **kw, seed=5)
    assert ids.shape == (2, 3) and torch.equal(ids, sampling.sample(x, **kw, seed=5, backend="torch"))


def test_greedy_rows_ties_at_the_kth_value_and_minus_inf():
    """Greedy rows (the lowest index among tied maxima), top-k ties at the k-th value across
    chunks (all kept), -inf logits never kept, and rows that are invalid (NaN, +inf, all -inf)."""
    vocab = 400
    x = torch.full((6, vocab), -5.0)
    x[0, [10, 150, 390]] = 2.0  # greedy: three tied maxima in three chunks -> 10
    x[1, [3, 200, 333, 399]] = 1.0  # top_k=2: the 2nd value ties four ways across chunks -> all four
    x[1, 50] = 4.0
    x[2, ::3] = -math.inf  # -inf logits
    x[2, 7] = 3.0
    x[3, 17] = math.nan
    x[4, 9] = math.inf
    x[5] = -math.inf
    t = torch.tensor([0.0, 1.0, 0.8, 1.0, 1.0, 1.0])
    k = torch.tensor([0, 2, 0, 0, 0, 0])
    for plan in (None, SMALL):
        spec = SamplingSpec.from_request("probs", x, temperature=t, top_k=k)
        got = triton_sampling.probs(spec, x, plan=plan)
        _assert_probs(got, x, spec)
        assert got[0, 10] == 1 and int((got[1] > 0).sum()) == 5 and bool((got[2, ::3] == 0).all())
        ids = triton_sampling.sample(SamplingSpec.from_request("sample", x, temperature=t, top_k=k, seed=1), x,
                                     plan=plan)
        assert ids[0] == 10 and ids[3:].tolist() == [-1, -1, -1] and int(ids[2]) % 3 != 0


def test_each_path_of_the_select(gen):
    """The small plan sends rows to each path (the tests read which one ran) and every path
    agrees with the reference and draws the torch sampler's ids."""
    x = _logits(gen, 6, 500)
    # (row 5: a flat distribution, whose top-p cut lies far below the candidates the chunks keep)
    kw = dict(temperature=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.9, 30.0]), top_k=torch.tensor([0, 0, 5, 60, 0, 0]),
              top_p=torch.tensor([1.0, 1.0, 1.0, 1.0, 0.5, 0.9]))
    spec = SamplingSpec.from_request("probs", x, **kw)
    assert triton_sampling.row_paths(spec, x, plan=SMALL) == ["race", "none", "candidates", "general", "candidates",
                                                              "general"]
    want = sampling.sample(x, **kw, seed=3, offset=9, backend="torch")
    _assert_probs(triton_sampling.probs(spec, x, plan=SMALL), x, spec)
    seeded = SamplingSpec.from_request("sample", x, **kw, seed=3, offset=9)
    assert torch.equal(triton_sampling.sample(seeded, x, plan=SMALL), want)


def test_candidates_overflowing_a_chunk_take_the_whole_row():
    """More tied values than a chunk's candidate slots: the select must still find the exact
    kept set (top-p over a flat row of ties keeps every tie)."""
    x = torch.zeros(2, 300)
    x[1, 5] = 1.0
    for kw in (dict(top_p=0.3), dict(top_k=3), dict(min_p=0.5)):
        spec = SamplingSpec.from_request("probs", x, **kw)
        _assert_probs(triton_sampling.probs(spec, x, plan=SMALL), x, spec)


@pytest.mark.parametrize("mode", ["int-seed", "per-row-seeds"])
def test_the_same_seeded_draws_as_the_torch_sampler(mode, gen):
    rows, vocab = 8, 1000
    x = _logits(gen, rows, vocab, scale=1.0)
    kw = dict(temperature=torch.rand(rows, generator=gen) + 0.5, top_k=torch.tensor([0, 50] * 4),
              top_p=torch.tensor([1.0, 0.9, 0.95, 1.0] * 2), min_p=torch.tensor([0.0] * 4 + [0.05] * 4))
    if mode == "int-seed":
        kw.update(seed=2**63 + 12345, offset=2**40 + 1)
    else:
        kw.update(seed=torch.randint(-2**63, 2**63 - 1, (rows,), generator=gen),
                  offset=torch.randint(0, 2**62, (rows,), generator=gen))
    for step in range(2):
        kw["offset"] = kw["offset"] + step
        ids, lp = triton_sample(x, **kw, return_logprobs=True)
        want, want_lp = sampling.sample(x, **kw, return_logprobs=True, backend="torch")
        assert torch.equal(ids, want), (ids, want)
        assert torch.allclose(lp, want_lp, atol=2e-5, rtol=1e-5)


def test_logprobs_with_top_n(gen):
    x = _logits(gen, 4, 600)
    x[1, [7, 70, 300]] = 20.0  # exact ties in the top-n: the lower id first
    t = torch.tensor([1.0, 1.0, 0.0, 0.6])
    ids = torch.randint(0, 600, (4, 3), generator=gen)
    ref = reference_logprobs(x, SamplingSpec.from_request("logprobs", x, temperature=t))
    for plan in (None, SMALL):
        spec = SamplingSpec.from_request("logprobs", x, temperature=t)
        picked, values, top_ids = triton_sampling.logprobs(spec, x, ids, 12, plan=plan)
        assert torch.allclose(picked.double(), ref.gather(-1, ids), atol=2e-5, rtol=1e-5, equal_nan=True)
        want_v, want_i = sampling.logprobs(x, ids, temperature=t, top_n=12, backend="torch")[1:]
        assert torch.equal(top_ids, want_i)
        assert torch.allclose(values, want_v, atol=2e-5, rtol=1e-5)
    assert top_ids[1, :3].tolist() == [7, 70, 300]


def test_refusals_name_the_reason():
    with pytest.raises(UnsupportedRequestError, match="float64"):
        triton_probs(torch.randn(2, 50, dtype=torch.float64))
    with pytest.raises(UnsupportedRequestError, match="top_n"):
        triton_logprobs(torch.randn(2, 300), torch.zeros(2, 1, dtype=torch.int64), top_n=200)


def test_out_of_range_per_row_values_give_invalid_rows():
    """On an accelerator the host never reads per-row values, so the kernels check them: a row
    with an out-of-range value is invalid (NaN probabilities, id -1), the others unchanged.
    (On the CPU the API rejects them first: the request is built past that check here.)"""
    x = torch.randn(3, 200)
    ok = SamplingSpec.from_request("sample", x, seed=4)
    for name, bad in (("top_p", torch.tensor([0.5, 1.5, 0.9])), ("temperature", torch.tensor([1.0, -1.0, 0.5])),
                      ("min_p", torch.tensor([0.0, 2.0, 0.1])), ("top_k", torch.tensor([3, -2, 0]))):
        spec = dataclasses.replace(ok, **{name: bad})
        ids = triton_sampling.sample(spec, x)
        assert ids[1] == -1 and bool((ids[[0, 2]] >= 0).all()), (name, ids)
        y = triton_sampling.probs(dataclasses.replace(spec, op="probs", seed=None), x)
        assert bool(torch.isnan(y[1]).all()) and not bool(torch.isnan(y[[0, 2]]).any()), name


def test_a_vocabulary_in_equal_shards_draws_the_same_token(gen):
    """`scan_shard` on each half of the vocabulary, the workspaces' shared prefixes stacked in
    rank order, then `select_shards`: the unsharded draw (the keys are per global token); a row
    whose top-k exceeds the candidates gets id -2 (it needs the whole row)."""
    x = _logits(gen, 5, 600)
    kw = dict(temperature=torch.tensor([1.0, 0.7, 0.0, 1.2, 1.0]), top_k=torch.tensor([0, 10, 0, 5, 40]),
              top_p=torch.tensor([1.0, 0.9, 1.0, 0.8, 1.0]), seed=7, offset=2)
    want = sampling.sample(x, **kw, backend="torch")
    ids = sharded_sample(x, kw, SMALL)
    assert ids[:4].tolist() == want[:4].tolist() and ids[4] == -2


@pytest.mark.parametrize("plan", [SMALL, dataclasses.replace(SMALL, tile=16)], ids=["one-tile", "four-tiles"])
@pytest.mark.parametrize("vocab_start", [0, 1, 2, 3])
def test_each_chunks_race_is_the_definitions_at_any_shard_start(vocab_start, plan, gen):
    """The plain race's winner of every chunk (its state's id and key) on a shard whose tokens
    are numbered from `vocab_start`: the torch race (`rng.exponential_race`) over the same
    global ids. One Philox serves four global ids, so a start that is not a multiple of 4 moves
    the chunk's tiles against its tokens (chunks of one race tile, and of four). Rows with one
    finite token per chunk, at the chunk's first four and last four places, make each key a
    check of that token's bits; the last row races over every token."""
    rows, vocab = 9, 300  # chunks of 128, 128 and 44 tokens
    x = torch.full((rows, vocab), float("-inf"))
    chunks = plan.chunks(vocab)
    for c in range(chunks):
        lo, hi = c * plan.chunk, min(vocab, (c + 1) * plan.chunk)
        for r, place in enumerate((0, 1, 2, 3, -4, -3, -2, -1)):
            x[r, (lo if place >= 0 else hi) + place] = float(torch.randn((), generator=gen))
    x[-1] = _logits(gen, 1, vocab)[0]
    spec = SamplingSpec.from_request("sample", x, seed=torch.randint(-2**63, 2**63 - 1, (rows,), generator=gen),
                                     offset=torch.randint(0, 2**40, (rows,), generator=gen))
    ws, _, _ = triton_sampling.scan_shard(spec, x, vocab_start, vocab_start + vocab, plan=plan)
    states = ws[:rows * chunks * triton_sampling.STATE_WORDS].view(rows, chunks, triton_sampling.STATE_WORDS)
    keys = states[..., sampling_kernels.F_BEST.value].view(torch.float32)
    ids = states[..., sampling_kernels.I_BEST_ID.value].long()
    words = rng.row_words(spec)
    for c in range(chunks):
        lo, hi = c * plan.chunk, min(vocab, (c + 1) * plan.chunk)
        z = x[:, lo:hi]
        want_ids, want_keys = rng.exponential_race(z, z > float("-inf"), words, vocab_start + lo)
        assert torch.equal(ids[:, c], want_ids), (c, ids[:, c], want_ids)
        assert torch.allclose(keys[:, c], want_keys, rtol=1e-5, atol=1e-5), (c, keys[:, c], want_keys)


def test_shards_not_starting_at_multiples_of_4_draw_the_unsharded_tokens(gen):
    """Four shards of 75 tokens (starts 0, 75, 150, 225: every remainder modulo 4), plain draws
    through `scan_shard` and `select_shards`: the `torch` sampler's ids on the whole row."""
    rows, shard, world = 6, 75, 4
    x = _logits(gen, rows, shard * world, scale=1.0)
    kw = dict(temperature=torch.rand(rows, generator=gen) + 0.5, seed=2**40 + 3, offset=5)
    want = sampling.sample(x, **kw, backend="torch")
    parts = []
    for rank in range(world):
        part = x[:, rank * shard:(rank + 1) * shard].contiguous()
        ws, space, _ = triton_sampling.scan_shard(SamplingSpec.from_request("sample", part, **kw), part,
                                                  rank * shard, shard * world, plan=SMALL)
        parts.append(ws[:space.shard_words])
    spec = SamplingSpec.from_request("sample", x[:, :shard], **kw)
    assert torch.equal(triton_sampling.select_shards(spec, torch.stack(parts), world, shard * world, SMALL), want)


@pytest.mark.parametrize("op", ["sample", "probs", "logprobs"])
def test_a_fused_plan_computes_what_two_launches_do(op, gen):
    """The scan and the select in one launch (`scan_select_kernel`: the program storing a row's
    last chunk selects it) give what the two launches give, call after call, and leave the
    stream's row counters (its per-row arrival counts) at zero for the next launch."""
    fused = dataclasses.replace(SMALL, fused=True)
    rows, vocab = 5, 700
    x = (torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16)
    keywords = dict(temperature=torch.rand(rows, generator=gen) + 0.5, top_k=torch.tensor([0, 5, 40, 0, 3]),
                    top_p=torch.tensor([0.9, 1.0, 0.8, 0.5, 1.0]), min_p=0.02)
    if op == "sample":
        keywords.update(seed=torch.arange(rows) * 11 + 3, offset=7)
    if op == "logprobs":
        keywords = dict(temperature=keywords["temperature"])
    spec = SamplingSpec.from_request(op, x, **keywords)
    ids = torch.randint(0, vocab, (rows, 3), generator=gen)
    values = triton_sampling.keyword_values(spec)

    def runner(plan):  # (one runner: its launches reuse one arrival-count buffer call after call)
        if op == "logprobs":
            run = triton_sampling.runner(op, spec, 6, ids.shape[-1], plan=plan)
            return lambda x: run(x, values, ids)
        run = triton_sampling.runner(op, spec, plan=plan)
        return (lambda x: run(x, values, True)) if op == "sample" else (lambda x: (run(x, values),))

    two, one = runner(SMALL), runner(fused)
    for scale in (3.0, 1.0, 5.0):  # (other logits each call: the same request, new data)
        x = (torch.randn(rows, vocab, generator=gen) * scale).to(torch.bfloat16)
        want = two(x)
        for g, w in zip(one(x), want):
            assert torch.equal(g, w)
    assert all(not c.any() for c in launcher._counters.values())  # (the stream's row counters, shared)
    if op == "probs":
        _assert_probs(want[0], x, spec)


def test_the_default_plan_fuses_only_a_few_rows():
    """Up to FUSED_MAX_ROWS rows a call is one launch; more rows keep the select's own launch
    (its grid of one program a row) or take the runs pre-pass."""
    cpu = torch.device("cpu")
    few, many = triton_sampling.FUSED_MAX_ROWS, triton_sampling.FUSED_MAX_ROWS + 1
    assert triton_sampling.plan_for(1, 128256, cpu).fused and triton_sampling.plan_for(few, 128256, cpu).fused
    assert not triton_sampling.plan_for(many, 128256, cpu).fused
    assert not triton_sampling.plan_for(64, 128256, cpu).fused and triton_sampling.plan_for(64, 128256, cpu).runs


def test_pdl_is_taken_on_nvidia_sm90_with_compiled_kernels_but_not_by_a_sharded_scan(monkeypatch):
    """`dependent_launch`: an NVIDIA GPU of sm_90 or later, compiled kernels and a Triton with
    the grid-dependency instructions, each needed; `plan_for` then sets `pdl` on every plan but a
    sharded vocabulary's scan, whose launches have the collectives' kernels between them."""
    cuda = torch.device("cuda", 0)
    allowed = triton_sampling.dependent_launch.__wrapped__  # (memoised per device: checked unmemoised)
    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability[0])
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(triton_sampling, "interpreted", lambda kernel: False)
    for capability[0], want in (((9, 0), True), ((10, 0), True), ((8, 9), False), ((8, 0), False)):
        assert allowed(cuda) is want, capability
    capability[0] = (9, 0)
    assert not allowed(torch.device("cpu"))
    with monkeypatch.context() as m:
        m.setattr(torch.version, "hip", "6.4")
        assert not allowed(cuda)
    with monkeypatch.context() as m:
        m.setattr(sampling_kernels, "DEPENDENT_LAUNCH", False)
        assert not allowed(cuda)
    with monkeypatch.context() as m:
        m.setattr(triton_sampling, "interpreted", lambda kernel: True)
        assert not allowed(cuda)
    monkeypatch.setattr(triton_sampling, "dependent_launch", lambda device: device.type == "cuda")
    plan_for = triton_sampling.plan_for.__wrapped__
    for rows in (1, 8, 64, 512):
        for kw in ({}, {"top_n": 20}, {"short_runs": True}, {"wide_k": True}):
            assert plan_for(rows, 128256, cuda, programs=264, **kw).pdl, (rows, kw)
            assert not plan_for(rows, 128256, cuda, programs=264, one_launch=False, **kw).pdl, (rows, kw)


def test_a_plan_with_pdl_is_refused_by_the_interpreter_and_off_where_it_cannot_run(gen):
    """Programmatic dependent launch (`SamplingPlan.pdl`) overlaps CUDA launches: plans for a
    device without it leave it off, and the interpreter refuses a plan with it, naming it, before
    any launch (its kernels would reach the grid-dependency instructions it cannot run)."""
    cpu = torch.device("cpu")
    assert not any(triton_sampling.plan_for(rows, 128256, cpu, **kw).pdl for rows in (1, 8, 64, 512)
                   for kw in ({}, {"top_n": 20}, {"short_runs": True}))
    x = _logits(gen, 3, 300)
    spec = SamplingSpec.from_request("sample", x, top_k=5, seed=1)
    triton_sampling._bound.clear()
    with pytest.raises(ValueError, match="SamplingPlan.pdl"):
        triton_sampling.sample(spec, x, plan=dataclasses.replace(SMALL, pdl=True))
    triton_sampling._bound.clear()
