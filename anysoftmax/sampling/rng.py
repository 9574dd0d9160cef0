"""The randomness of a draw, defined once: every backend, sharded or not, draws these numbers
(docs/sampling.md, "Seeds, offsets and the randomness", states the definition and its reasons).
Token ``i`` of a row (its index in the whole vocabulary) gets ``r_i``, word ``i & 3`` of
Philox4x32-10 keyed by the row's seed, counter ``(i >> 2, stream, offset low, offset high)``
(``stream``: the row's flat index for a batch-wide seed, 0 for a per-row seed); in Triton
``tl.philox(seed, i >> 2, stream, off_lo, off_hi)[i & 3]``.
"""

from __future__ import annotations

import threading

import torch

from .spec import SamplingSpec

MASK32 = 0xFFFFFFFF
# Philox4x32's round multipliers and Weyl key increments (Triton's `philox_impl`).
PHILOX_ROUND_A, PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
PHILOX_KEY_A, PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10
# Elements of [rows, V] whose bits are made at once: bounds the int64 temporaries (~10 of them).
RACE_CHUNK = 1 << 22


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` for a uint32 constant and uint32 values held in
    int64: b is split into 16-bit halves so that no partial product leaves int64."""
    p_lo = a * (b & 0xFFFF)  # < 2**48
    p_hi = a * (b >> 16)  # < 2**48
    s = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2**49
    return (p_hi >> 16) + (s >> 32), s & MASK32


def philox4x32(c0, c1, c2, c3, k0, k1) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 on uint32 words held in int64 tensors (broadcast together):
    the four output words, each in [0, 2**32). Integer ops only, so any device computes the same bits."""
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + PHILOX_KEY_A) & MASK32, (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


def _row_columns(seed: torch.Tensor, stream: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Philox's counter words 1..3 and key words of each row, as [rows, 1] uint32 in int64."""
    seed, stream, offset = (t.reshape(-1, 1) for t in (seed, stream, offset))
    return (stream & MASK32, offset & MASK32, (offset >> 32) & MASK32, seed & MASK32, (seed >> 32) & MASK32)


def random_bits(seed: torch.Tensor, stream: torch.Tensor, offset: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``r`` of the definition: int64 in [0, 2**32), shape ``[rows, len(tokens)]``, for int64
    ``seed``, ``stream``, ``offset`` of shape [rows] and global token indices ``tokens`` [V]
    in any order (one Philox per token, its word ``i & 3``; `range_bits` serves a run of
    consecutive ids with one per four)."""
    c1, c2, c3, k0, k1 = _row_columns(seed, stream, offset)
    tokens = tokens.reshape(1, -1)
    words = philox4x32((tokens >> 2) & MASK32, c1, c2, c3, k0, k1)
    word = tokens & 3
    bits = words[3]
    for w in (2, 1, 0):
        bits = torch.where(word == w, words[w], bits)
    return bits


def range_bits(seed: torch.Tensor, stream: torch.Tensor, offset: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """`random_bits` of the consecutive global ids ``start .. start + count - 1``: one Philox
    per block of four ids (the blocks the run touches), its words laid out in id order."""
    c1, c2, c3, k0, k1 = _row_columns(seed, stream, offset)
    first, end = start >> 2, (start + count + 3) >> 2
    blocks = torch.arange(first, max(first, end), dtype=torch.int64, device=c1.device).reshape(1, -1)
    words = torch.stack(philox4x32(blocks & MASK32, c1, c2, c3, k0, k1), -1)  # [rows, blocks, 4]
    skip = start - 4 * first
    return words.reshape(words.shape[0], -1)[:, skip:skip + count]


def exponential(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``E = -log1p(-u)``, ``u = (r + 1/2) / 2**32``, in `dtype`: exact u in float64; float32
    clamps u to 1 - 2**-24 (E stays finite), and log1p keeps the winner's tiny E from rounding to 0."""
    if dtype == torch.float64:
        u = (bits.to(torch.float64) + 0.5) * 2.0**-32
    else:
        u = ((bits.to(torch.float32) + 0.5) * 2.0**-32).clamp_max(1.0 - 2.0**-24).to(dtype)
    return -torch.log1p(-u)


_generator_lock = threading.Lock()
# splitmix64's increment and multipliers: the seed a generator's (seed, offset) pair stands for.
SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
MASK64 = (1 << 64) - 1


def generator_seed(device: torch.device) -> int | None:
    """A seed from torch's default generator of CUDA `device`, read and advanced on the host (as
    a Philox op advances it: 4 counter steps; no launch): splitmix64 of its seed and offset, so
    `torch.manual_seed` replays the draws. None where the seed must come from a device draw
    instead: another device type (the CPU generator keeps no offset), or a CUDA graph being
    captured (a host number would be frozen into the graph; a device draw advances per replay)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return None
    gen = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    with _generator_lock:  # (two threads reading one offset would draw alike)
        offset = gen.get_offset()
        gen.set_offset(offset + 4)
    z = (gen.initial_seed() + (offset + 1) * SPLITMIX_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * SPLITMIX_M1) & MASK64
    z = ((z ^ (z >> 27)) * SPLITMIX_M2) & MASK64
    return (z ^ (z >> 31)) >> 1  # (a non-negative int64, as torch.randint's seeds)


def row_words(spec: SamplingSpec, device: torch.device | None = None) -> tuple[torch.Tensor, ...]:
    """(seed, stream, offset) of every row as int64 ``[rows]`` tensors. Without a seed, one is
    drawn from torch's default generator for the device (on the device: no host sync), which
    advances it as `torch.multinomial` would; the draw then proceeds as with an int seed."""
    device = spec.device if device is None else device
    rows = spec.rows
    if spec.seed is None:
        seed = torch.randint(0, 2**63 - 1, (), dtype=torch.int64, device=device).expand(rows)
    elif isinstance(spec.seed, torch.Tensor):
        seed = spec.seed.to(device).expand(rows)
    else:
        seed = torch.full((rows,), spec.seed, dtype=torch.int64, device=device)
    if spec.per_row_seed:
        stream = torch.zeros(rows, dtype=torch.int64, device=device)
    else:
        stream = torch.arange(rows, dtype=torch.int64, device=device)
    offset = spec.column("offset", device).reshape(rows)
    return seed, stream, offset


def exponential_race(z: torch.Tensor, kept: torch.Tensor, words: tuple[torch.Tensor, ...],
                     vocab_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The draw of each row of ``z`` [rows, V] (in its dtype) over its `kept` tokens, the
    tokens numbered from `vocab_start` (a shard of the vocabulary): (ids, keys), the argmax of
    ``z - log(E)`` (lowest index among ties) as a global token id and its key, both [rows].
    The keys are elementwise, so the draw of a sharded row is the shard winner of largest key
    (lowest id among equal keys). A row with nothing kept gets id `vocab_start` and key -inf
    (callers mark such rows invalid). Row chunks bound the memory."""
    rows, vocab = z.shape
    step = max(1, RACE_CHUNK // max(vocab, 1))
    ids, best = [], []
    for start in range(0, rows, step):
        part = slice(start, start + step)
        e = exponential(range_bits(*(w[part] for w in words), vocab_start, vocab), z.dtype)
        keys = torch.where(kept[part], z[part] - torch.log(e), -torch.inf)
        at = keys.argmax(-1)  # (argmax documents the first maximum)
        ids.append(at + vocab_start)
        best.append(keys.gather(-1, at[:, None])[:, 0])
    if not ids:
        return torch.zeros(0, dtype=torch.int64, device=z.device), z.new_zeros(0)
    return torch.cat(ids), torch.cat(best)
