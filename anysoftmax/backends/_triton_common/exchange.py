"""An all-gather of int32 words through the mailbox of `anysoftmax.distributed.mailbox`, inside
one kernel: the sharded sampler's exchange of its scan workspaces (the row states and candidates
every rank's select reads), without a collective's host cost.

Word i of rank r sits at `slot_base + r * n_words + i` of every mailbox, as `epoch << 32 | bits`:
one aligned 8-byte store, so a reader sees the old word or the whole new one, and a program's
block is one contiguous run of stores into each peer (rank-interleaved slots would spread them
over world times the bytes: a quarter of each 32-byte sector used at 4 ranks). A program first
writes all its blocks into every peer's mailbox, then waits for the peers' words of the same
blocks: a program waits only on the same program of the other ranks, and the grid never exceeds
what a GPU holds at once, so every program it waits on runs. A wait that outlasts `spin_limit`
reads of a block gives up and stamps `status[0]` with the call's epoch (the caller runs the
exchange again for a while, then raises: a peer is not in this call), so the kernel never
hangs. It also zeroes `status[1]`, the word the same call's select sets when a row needs the
whole row: the caller reads both words at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .interpreter import interpreting
from .launcher import Binding, bind_kernel, per_stream

LOW32 = tl.constexpr(0xFFFFFFFF)
BLOCK = 1024  # words a program moves per step (8 KB of mailbox words per peer)
SPIN_LIMIT = 1 << 21  # block reads before a wait gives up: seconds on a GPU
POINTERS = ("src_ptr", "out_ptr", "words_ptr", "peers_ptr", "status_ptr")


# The epoch and the mailbox half change every call: never specialised on.
@triton.jit(do_not_specialize=["epoch", "slot_base"])
def exchange_kernel(src_ptr, out_ptr, words_ptr, peers_ptr, status_ptr, n_words, rank, world, spin_limit, epoch,
                    slot_base, BLOCK: tl.constexpr, W_POW2: tl.constexpr):
    """out[r, i] = rank r's src[i] for every rank r of the group (module docstring)."""
    ranks = tl.arange(0, W_POW2)
    others = (ranks < world) & (ranks != rank)
    peers = tl.load(peers_ptr + ranks, mask=others, other=0).to(tl.pointer_type(tl.int64))
    tag = tl.cast(epoch, tl.int64) << 32
    first, step = tl.program_id(0) * BLOCK, tl.num_programs(0) * BLOCK
    if tl.program_id(0) == 0:
        tl.store(status_ptr + 1, 0)
    for start in tl.range(first, n_words, step):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < n_words
        bits = tl.load(src_ptr + offs, mask=inside, other=0)
        tl.store(out_ptr + rank * n_words + offs, bits, mask=inside)
        slots = slot_base + rank * n_words + offs[None, :]
        tl.store(peers[:, None] + slots, tag | (bits.to(tl.int64) & LOW32)[None, :],
                 mask=others[:, None] & inside[None, :])
    for start in tl.range(first, n_words, step):
        offs = start + tl.arange(0, BLOCK)
        wanted = others[:, None] & (offs < n_words)[None, :]
        mine = words_ptr + slot_base + ranks[:, None] * n_words + offs[None, :]
        w = tl.load(mine, mask=wanted, other=0, volatile=True)
        spins = 0
        while (tl.sum(tl.where(wanted & ((w >> 32) != epoch), 1, 0)) > 0) & (spins < spin_limit):
            w = tl.load(mine, mask=wanted, other=0, volatile=True)
            spins += 1
        if spins >= spin_limit:
            tl.atomic_xchg(status_ptr, tl.cast(epoch, tl.int64), sem="relaxed")
        tl.store(out_ptr + ranks[:, None] * n_words + offs[None, :], (w & LOW32).to(tl.int32), mask=wanted)


def exchange_launcher(n_words: int, rank: int, world: int, words: torch.Tensor, peers: torch.Tensor,
                      spin_limit: int | None = None):
    """`f(src, status, epoch, slot_base) -> out`: every rank's `src` (int32 [n_words]) as out
    [world, n_words] in rank order (one buffer per stream, rewritten by the next call), through
    the mailbox `words` (this rank's, int64, holding at least 2 halves of n_words * world) and
    `peers` (every rank's `words` address, int64 [world]); `status` (int64 [2]): [0] gets the
    epoch of a call whose wait gave up, [1] is zeroed. `spin_limit`: `SPIN_LIMIT` unless given."""
    device = words.device
    blocks = -(-max(n_words, 1) // BLOCK)
    if device.type == "cuda" and not interpreting():
        # One program per multiprocessor at most: all of them are resident at once (module docstring).
        grid = min(blocks, torch.cuda.get_device_properties(device).multi_processor_count)
        meta = dict(BLOCK=BLOCK, W_POW2=triton.next_power_of_2(world), num_warps=4)
    else:
        grid, meta = min(blocks, 4), dict(BLOCK=BLOCK, W_POW2=triton.next_power_of_2(world))
    ints = dict(n_words=n_words, rank=rank, world=world, spin_limit=SPIN_LIMIT if spin_limit is None else spin_limit,
                epoch=1, slot_base=0)
    launch = bind_kernel(Binding(exchange_kernel, grid, POINTERS, lambda a: a, ints, (meta,), (), (),
                                 ("epoch", "slot_base")), device=device)

    # (kept per stream: a call's select reads `out` before the next call's exchange writes it)
    outs = per_stream(lambda device: torch.empty((world, n_words), dtype=torch.int32, device=device))

    def run(src: torch.Tensor, status: torch.Tensor, epoch: int, slot_base: int) -> torch.Tensor:
        out = outs(device)
        launch((src, out, words, peers, status), per_call=(epoch, slot_base))
        return out

    return run
