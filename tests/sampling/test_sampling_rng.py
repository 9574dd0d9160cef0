"""`anysoftmax.sampling.rng` is Triton's Philox bit for bit: the torch integer emulation against
`tl.randint` and `tl.philox` run by Triton itself (the interpreter on the CPU, compiled on a GPU),
and the exponentials built from it."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.sampling import rng

triton = pytest.importorskip("triton", reason="needs the triton package")
tl = pytest.importorskip("triton.language")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Seeds across the 64-bit range: small, negative (high bit set), above 2**32, the extremes.
SEEDS = (0, 1, 12345, -1, -(2**63), 2**63 - 1, 0xFEDC_BA98_7654_3210 - 2**64, 2**40 + 7)


@triton.jit
def _randint_kernel(seed, counters_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    counter = tl.load(counters_ptr + i, mask=i < n, other=0)  # int64: c0 = low word, c1 = high word
    tl.store(out_ptr + i, tl.randint(seed, counter).to(tl.int32, bitcast=True), mask=i < n)


@triton.jit
def _philox_kernel(seed, words_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    c0 = tl.load(words_ptr + 4 * i, mask=m, other=0)
    c1 = tl.load(words_ptr + 4 * i + 1, mask=m, other=0)
    c2 = tl.load(words_ptr + 4 * i + 2, mask=m, other=0)
    c3 = tl.load(words_ptr + 4 * i + 3, mask=m, other=0)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
    tl.store(out_ptr + 4 * i, r0.to(tl.int32, bitcast=True), mask=m)
    tl.store(out_ptr + 4 * i + 1, r1.to(tl.int32, bitcast=True), mask=m)
    tl.store(out_ptr + 4 * i + 2, r2.to(tl.int32, bitcast=True), mask=m)
    tl.store(out_ptr + 4 * i + 3, r3.to(tl.int32, bitcast=True), mask=m)


def _uint32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64) & rng.MASK32


def _words(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.tensor(seed, dtype=torch.int64)
    return s & rng.MASK32, (s >> 32) & rng.MASK32


@pytest.mark.parametrize("seed", SEEDS)
def test_random_bits_are_tl_randint(seed):
    """The definition's bits (token i, stream, offset 0) are `tl.randint(seed, i + (stream << 32))`."""
    tokens = torch.tensor([0, 1, 2, 3, 100, 131071, 262143, 2**31 - 1, 2**31, 2**32 - 1])
    streams = torch.tensor([0, 1, 7, 2**31 + 5, 2**32 - 1])
    counters = (tokens[None, :] + (streams[:, None] << 32)).reshape(-1)  # int64 (wraps as uint64 would)
    out = torch.empty(counters.numel(), dtype=torch.int32, device=DEVICE)
    _randint_kernel[(1,)](seed, counters.to(DEVICE), out, counters.numel(), BLOCK=64)
    ours = rng.random_bits(torch.full((len(streams),), seed), streams, torch.zeros(len(streams), dtype=torch.int64),
                           tokens)
    assert torch.equal(_uint32(out.cpu()).reshape(ours.shape), ours)


@pytest.mark.parametrize("seed", SEEDS[:5])
def test_all_four_words_are_tl_philox(seed):
    """Every output word of the emulated Philox4x32-10, on random 128-bit counters."""
    g = torch.Generator().manual_seed(seed & 0xFFFF)
    words = torch.randint(-2**31, 2**31, (37, 4), generator=g, dtype=torch.int64).to(torch.int32)
    words[0] = torch.tensor([-1, -1, -1, -1], dtype=torch.int32)  # all ones
    words[1] = 0
    out = torch.empty(37 * 4, dtype=torch.int32, device=DEVICE)
    _philox_kernel[(1,)](seed, words.reshape(-1).to(DEVICE), out, 37, BLOCK=64)
    c = _uint32(words)
    ours = torch.stack(rng.philox4x32(c[:, 0], c[:, 1], c[:, 2], c[:, 3], *_words(seed)), -1)
    assert torch.equal(_uint32(out.cpu()).reshape(37, 4), ours)


def test_offset_fills_the_high_counter_words():
    """offset's low and high words are counter words 2 and 3 (a 64-bit offset, negative ones too)."""
    seed, tokens = 99, torch.arange(5)
    for offset in (1, 2**32, 2**32 + 3, -1, 2**62 + 11):
        off = torch.tensor([offset])
        ours = rng.random_bits(torch.tensor([seed]), torch.tensor([3]), off, tokens)[0]
        c = torch.tensor([[int(t), 3, offset & rng.MASK32, (offset >> 32) & rng.MASK32] for t in tokens])
        direct = rng.philox4x32(c[:, 0], c[:, 1], c[:, 2], c[:, 3], *_words(seed))[0]
        assert torch.equal(ours, direct)
    zero = rng.random_bits(torch.tensor([seed]), torch.tensor([3]), torch.tensor([0]), tokens)
    one = rng.random_bits(torch.tensor([seed]), torch.tensor([3]), torch.tensor([1]), tokens)
    assert not torch.equal(zero, one)


def test_known_answer_vector():
    """Philox4x32-10 of the Random123 known-answer test (counter and key all 0xffffffff)."""
    ones = torch.tensor(rng.MASK32)
    out = rng.philox4x32(ones, ones, ones, ones, ones, ones)
    assert [int(w) for w in out] == [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]


def test_exponentials_are_finite_positive_and_exact_at_the_ends():
    bits = torch.tensor([0, 1, 2**24, 2**31, 2**32 - 129, 2**32 - 128, 2**32 - 1], dtype=torch.int64)
    for dtype in (torch.float32, torch.float64):
        e = rng.exponential(bits, dtype)
        assert e.dtype == dtype and bool(torch.isfinite(e).all()) and bool((e > 0).all()), (dtype, e)
        assert bool((e[1:] >= e[:-1]).all()), "E grows with r"
    # near u = 0, E = u to full precision (log1p): the race's winners live there
    e64 = rng.exponential(bits[:2], torch.float64)
    assert torch.allclose(e64, torch.tensor([0.5, 1.5], dtype=torch.float64) * 2.0**-32, rtol=1e-9, atol=0)
    e32 = rng.exponential(bits[:2], torch.float32)
    assert torch.allclose(e32.double(), e64, rtol=1e-6, atol=0)


def test_exponentials_are_exp1_distributed():
    """Mean 1 and P(E > 1) = 1/e over a million tokens of one seed."""
    bits = rng.random_bits(torch.tensor([7]), torch.tensor([0]), torch.tensor([0]), torch.arange(1 << 20))
    e = rng.exponential(bits, torch.float64)
    n = e.numel()
    assert abs(float(e.mean()) - 1) < 5 / n**0.5
    frac = float((e > 1).double().mean())
    assert abs(frac - 1 / 2.718281828459045) < 5 * (0.25 / n) ** 0.5
