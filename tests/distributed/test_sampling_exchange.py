"""The sharded sampler's mailbox exchange (`backends/_triton_common/exchange.py`,
`anysoftmax.distributed.kernel_sampling.exchange`) without GPUs.

* The protocol, run: 2 and 3 processes, each a "rank" running the kernel through the Triton
  interpreter, their mailboxes one shared-memory tensor every process maps (the role NVLink and
  symmetric memory play on GPUs); several calls in a row (the epochs move on, the halves
  alternate), fresh words each time, the full int32 range, a partial last block.
* A peer that never writes: the wait gives up, the call's epoch is stamped and the sampler
  raises instead of hanging; a peer that comes seconds late: the call waits again and draws.
* The kernel compiles for sm_90 with the protocol's memory operations; the refusals.
The whole sharded sampler through the mailbox: tests/distributed/test_distributed_sampling.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the exchange kernel is a Triton kernel (the test extra installs triton)")

CALLS, CAP = 3, 4096


def _words(rank: int, call: int, n_words: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * call + rank)
    return torch.randint(-2**31, 2**31, (n_words,), generator=g, dtype=torch.int64).to(torch.int32)


def _rank(rank: int, world: int, words_all, n_words: int, out: str) -> None:
    from anysoftmax.distributed.kernel_sampling import exchange
    from anysoftmax.distributed.mailbox import Mailbox

    peers = torch.tensor([words_all[r].data_ptr() for r in range(world)], dtype=torch.int64)
    box = Mailbox(words_all[rank], peers, CAP, world)
    got = []
    status = torch.tensor([0, 1], dtype=torch.int64)
    for call in range(CALLS):
        gathered, epoch = exchange(_words(rank, call, n_words), rank, world, box, status)
        got.append((gathered.clone(), int(status[0]) == epoch, int(status[1])))
        status[1] = 1  # (each call's exchange zeroes the select's undecided word)
    torch.save(got, f"{out}.{rank}")


@pytest.mark.parametrize("world,n_words", [(2, 2500), (3, 1024), (2, 1)])
def test_every_rank_gets_every_rank_words(world, n_words, tmp_path):
    from anysoftmax.testing.distributed import run_ranks

    words_all = torch.zeros(world, 2 * CAP * world, dtype=torch.int64).share_memory_()
    out = str(tmp_path / "ranks")
    run_ranks(_rank, world, (world, words_all, n_words, out), 240)
    for r in range(world):
        for call, (gathered, late, undecided) in enumerate(torch.load(f"{out}.{r}")):
            assert undecided == 0, f"rank {r} call {call}: the exchange left the undecided word set"
            want = torch.stack([_words(q, call, n_words) for q in range(world)])
            assert gathered.dtype == torch.int32 and gathered.shape == (world, n_words)
            assert torch.equal(gathered, want), f"rank {r} call {call}: not every rank's words in rank order"
            assert not late, f"rank {r} call {call}: the wait gave up though every peer wrote"


def test_a_silent_peer_stamps_the_epoch_and_the_sampler_raises():
    from anysoftmax.backends._triton_common.exchange import exchange_launcher
    from anysoftmax.distributed.kernel_sampling import KernelDraw, undecided_rows

    n_words = 40
    words = torch.zeros(2 * n_words * 2, dtype=torch.int64)
    silent = torch.zeros_like(words)  # (rank 1's mailbox: rank 0 writes into it; rank 1 never writes)
    peers = torch.tensor([words.data_ptr(), silent.data_ptr()], dtype=torch.int64)
    run = exchange_launcher(n_words, 0, 2, words, peers, spin_limit=3)
    status = torch.zeros(2, dtype=torch.int64)
    src = _words(0, 0, n_words)
    gathered = run(src, status, 7, 0)
    assert int(status[0]) == 7, "the wait did not give up on a peer that never wrote"
    assert torch.equal(gathered[0], src)
    assert int(((silent >> 32) == 7).sum()) == n_words, "rank 0 did not publish every word to its peer"
    done = KernelDraw(None, torch.zeros(3, dtype=torch.int64), torch.zeros(3), status, 7)
    with pytest.raises(RuntimeError, match="every rank of the group must call sample together"):
        undecided_rows(done)
    assert undecided_rows(done._replace(epoch=8))[1] is None, "a stamp of an earlier call must not raise"


def _late_rank(rank: int, world: int, words_all, logits, out: str) -> None:
    import time

    from anysoftmax.backends._triton_common import exchange as exchange_module
    from anysoftmax.distributed import kernel_sampling
    from anysoftmax.distributed.mailbox import Mailbox
    from anysoftmax.sampling.spec import SamplingSpec

    exchange_module.SPIN_LIMIT = 3  # (each wait gives up almost at once: rank 1 comes seconds late)
    peers = torch.tensor([words_all[r].data_ptr() for r in range(world)], dtype=torch.int64)
    box = Mailbox(words_all[rank], peers, CAP, world)
    width = logits.shape[-1] // world
    shard = logits[:, rank * width:(rank + 1) * width]
    spec = SamplingSpec.from_request("test", shard, temperature=0.7, top_k=5, top_p=0.9, seed=3, offset=1)
    if rank == 1:
        time.sleep(3.0)
    done = kernel_sampling.draw(spec, shard, rank * width, logits.shape[-1], rank, world, None, box)
    late_first = int(done.status[0]) == done.epoch
    done, undecided = kernel_sampling.undecided_rows(done)
    # Another request's runner has status words of its own: its kernels never write this call's.
    other = SamplingSpec.from_request("test", shard[:2], top_k=3, seed=4)
    again = kernel_sampling.draw(other, shard[:2], rank * width, logits.shape[-1], rank, world, None, box)
    kernel_sampling.undecided_rows(again)
    separate = again.status.data_ptr() != done.status.data_ptr()
    torch.save((done.ids, late_first, undecided, separate), f"{out}.{rank}")


def test_a_rank_whose_wait_gave_up_waits_again_for_a_late_peer(tmp_path):
    """Rank 1 reaches the exchange seconds after rank 0 (a first call compiling its kernels):
    rank 0's wait gives up, the call runs its exchange and select again with the same epoch, and
    both ranks draw the ids of the unsharded sampler."""
    import anysoftmax.sampling as sampling
    from anysoftmax.testing.distributed import run_ranks

    world, g = 2, torch.Generator().manual_seed(5)
    logits = torch.randn(3, 2 * 160, generator=g) * 3
    words_all = torch.zeros(world, 2 * CAP * world, dtype=torch.int64).share_memory_()
    out = str(tmp_path / "late")
    run_ranks(_late_rank, world, (world, words_all, logits, out), 240)
    want = sampling.sample(logits, temperature=0.7, top_k=5, top_p=0.9, seed=3, offset=1)
    (ids0, late0, undecided0, separate), (ids1, _, _, _) = (torch.load(f"{out}.{r}") for r in range(world))
    assert late0, "rank 0's first wait did not give up: the test did not make rank 1 late"
    assert undecided0 is None
    assert separate, "two requests' runners share their status words"
    assert torch.equal(ids0, want) and torch.equal(ids1, want), (ids0, ids1, want)


def test_refusals_name_their_reason(monkeypatch):
    from anysoftmax.distributed import kernel_sampling, one_read

    cpu = torch.device("cpu")
    assert "one rank" in kernel_sampling.mailbox_refusal(torch.device("cuda", 0), 1)
    assert "NVIDIA" in kernel_sampling.mailbox_refusal(cpu, 2)
    monkeypatch.setattr(one_read, "ENABLED", False)
    assert one_read.ENV in kernel_sampling.mailbox_refusal(cpu, 2)


COMPILE = r'''
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from anysoftmax.backends._triton_common.exchange import exchange_kernel as k

types = dict(src_ptr="*i32", out_ptr="*i32", words_ptr="*i64", peers_ptr="*i64", status_ptr="*i64")
c = dict(BLOCK=1024, W_POW2=4)
sig = {n: "constexpr" if n in c else types.get(n, "i32") for n in k.arg_names}
ptx = triton.compile(ASTSource(k, sig, c), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
print(json.dumps(dict(wait=ptx.count("ld.volatile.global"), spills="st.local" in ptx)))
'''


def test_exchange_kernel_compiles_for_sm90_with_volatile_waits():
    from helpers.sm90 import compile_script_json

    got = compile_script_json(COMPILE)
    assert got["wait"] >= 1 and not got["spills"], got
