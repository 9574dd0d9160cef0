"""`anysoftmax.sampling.rng` is Triton's Philox bit for bit: the torch integer emulation against
`tl.randint4x` and `tl.philox` run by Triton itself (the interpreter on the CPU, compiled on a
GPU) and against Philox4x32-10 written out on Python integers; token i's bits are word i mod 4 of
the block i div 4; and the exponentials built from them."""

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
def _randint4x_kernel(seed, counters_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    counter = tl.load(counters_ptr + i, mask=i < n, other=0)  # int64: c0 = low word, c1 = high word
    r0, r1, r2, r3 = tl.randint4x(seed, counter)
    tl.store(out_ptr + 4 * i, r0.to(tl.int32, bitcast=True), mask=i < n)
    tl.store(out_ptr + 4 * i + 1, r1.to(tl.int32, bitcast=True), mask=i < n)
    tl.store(out_ptr + 4 * i + 2, r2.to(tl.int32, bitcast=True), mask=i < n)
    tl.store(out_ptr + 4 * i + 3, r3.to(tl.int32, bitcast=True), mask=i < n)


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


def _philox_on_ints(counter: list[int], key: list[int]) -> list[int]:
    """Philox4x32-10 (Salmon et al., SC'11) on Python integers, written out from the paper: an
    oracle sharing no code with `rng.philox4x32`."""
    c, k = list(counter), list(key)
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k[1], p0 & 0xFFFFFFFF]
        k = [(k[0] + 0x9E3779B9) & 0xFFFFFFFF, (k[1] + 0xBB67AE85) & 0xFFFFFFFF]
    return c


def _bits_on_ints(seed: int, stream: int, offset: int, token: int) -> int:
    """The definition's r of one token, one Philox call per token: word token % 4 of the block
    token // 4."""
    u32 = 0xFFFFFFFF
    words = _philox_on_ints([token // 4, stream & u32, offset & u32, (offset >> 32) & u32],
                            [seed & u32, (seed >> 32) & u32])
    return words[token % 4]


def _uint32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64) & rng.MASK32


def _words(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.tensor(seed, dtype=torch.int64)
    return s & rng.MASK32, (s >> 32) & rng.MASK32


@pytest.mark.parametrize("seed", SEEDS)
def test_random_bits_are_tl_randint4x(seed):
    """The definition's bits (token i, stream, offset 0) are word i % 4 of
    `tl.randint4x(seed, i // 4 + (stream << 32))`."""
    tokens = torch.tensor([0, 1, 2, 3, 4, 7, 100, 131071, 262143, 2**31 - 2, 2**31 - 1])
    streams = torch.tensor([0, 1, 7, 2**31 + 5, 2**32 - 1])
    counters = ((tokens[None, :] >> 2) + (streams[:, None] << 32)).reshape(-1)  # int64 (wraps as uint64 would)
    out = torch.empty(counters.numel() * 4, dtype=torch.int32, device=DEVICE)
    _randint4x_kernel[(1,)](seed, counters.to(DEVICE), out, counters.numel(), BLOCK=64)
    words = _uint32(out.cpu()).reshape(len(streams), len(tokens), 4)
    ours = rng.random_bits(torch.full((len(streams),), seed), streams, torch.zeros(len(streams), dtype=torch.int64),
                           tokens)
    assert torch.equal(words.gather(-1, (tokens & 3).expand(len(streams), -1)[..., None])[..., 0], ours)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_token_i_gets_word_i_mod_4_of_block_i_div_4(seed):
    """rng.random_bits against Philox on Python integers, token by token: the four tokens of a
    block, block edges, ids near 2**31, any order (scattered ids), streams and 64-bit offsets."""
    tokens = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 1001, 1000, 999, 128255, 2**31 - 5, 2**31 - 1])
    streams = torch.tensor([0, 5, 2**32 - 1])
    offsets = torch.tensor([0, 2**33 + 3, -7])
    ours = rng.random_bits(torch.full((3,), seed), streams, offsets, tokens)
    want = [[_bits_on_ints(seed, int(s), int(o), int(t)) for t in tokens] for s, o in zip(streams, offsets)]
    assert ours.tolist() == want


def test_python_philox_oracle_meets_the_known_answer():
    """The oracle itself: the Random123 known-answer vector (counter and key all 0xffffffff)."""
    assert _philox_on_ints([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]


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
        c = torch.tensor([[int(t) // 4, 3, offset & rng.MASK32, (offset >> 32) & rng.MASK32] for t in tokens])
        direct = torch.stack(rng.philox4x32(c[:, 0], c[:, 1], c[:, 2], c[:, 3], *_words(seed)), -1)
        assert torch.equal(ours, direct.gather(-1, (tokens & 3)[:, None])[:, 0])
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


@pytest.mark.parametrize("start", [0, 1, 2, 3, 4097])
def test_bits_of_a_run_of_tokens_are_the_tokens_bits(start):
    """`range_bits` (one Philox per four tokens, for a contiguous run as a shard's race uses)
    equals `random_bits` of the same ids, whatever the run's start and length modulo 4."""
    seed, stream, offset = torch.tensor([5, -3]), torch.tensor([0, 9]), torch.tensor([2**35 + 1, 0])
    for count in (0, 1, 3, 4, 5, 22):
        want = rng.random_bits(seed, stream, offset, torch.arange(start, start + count))
        assert torch.equal(rng.range_bits(seed, stream, offset, start, count), want), (start, count)
