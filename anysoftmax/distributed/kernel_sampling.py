"""`anysoftmax.distributed.sample(..., backend="triton")`: the Triton sampler's scan on each
rank's shard, one exchange of the workspaces' prefix (on NVIDIA GPUs one kernel writing into the
peers' mailboxes, `mailbox.py`; else an all-gather), the same select on every rank
(docs/sampling.md, "A sharded vocabulary"). The torch-ops path (`sampling.py`) serves unequal
shard sizes, requests the Triton sampler refuses, and rows the candidates cannot decide (id -2).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, NamedTuple

import torch

from ..core import registry
from ..core.backend import as_backend
from ..sampling.spec import SamplingSpec, form_of
from . import one_read
from .collective import gather_states
from .mailbox import Mailbox, symmetric, symmetric_memory_missing

KERNEL_BACKEND = "triton"
UNDECIDED = -2  # (select_shards: a row whose candidates cannot decide it needs the whole row)
# How long a rank waits again for a peer after an exchange's wait gave up (a peer still
# compiling its first call's kernels can be seconds behind) before the call raises.
LATE_SECONDS = 120.0


class KernelDraw(NamedTuple):
    """The kernels' draw: ids and log-probabilities [rows] (and `spec`, the request with the seed
    every rank used, where `draw` made it); `status` (int64 [2]): [0] == `epoch` when the mailbox
    exchange gave up waiting for a peer, [1] == 1 when the select left a row undecided; `again`
    runs the call's exchange (same epoch) and select once more."""

    spec: SamplingSpec
    ids: torch.Tensor
    logprobs: torch.Tensor
    status: torch.Tensor
    epoch: int = 0
    again: Callable[[], "KernelDraw"] | None = None


def refusal(spec: SamplingSpec, sizes: tuple[int, ...]) -> str | None:
    """Why the shard kernels cannot take `spec` over shards of `sizes` (None when they can)."""
    if len(set(sizes)) > 1:
        return f"the shard kernels need equal shard sizes, got {list(sizes)}"
    return registry.unavailable_reason(KERNEL_BACKEND) or \
        as_backend(registry.get_backend(KERNEL_BACKEND)).supports_sampling(spec)


def agreed_seed(spec: SamplingSpec, world: int, group) -> SamplingSpec:
    """`spec` with its seed fixed before the scan (the scan's race keys need it): without one,
    each rank draws from its default generator (advancing it, as `sampling.sample` does) and
    every rank takes rank 0's, one small all-gather; a 0-dim seed keeps the batch's stream per row."""
    if spec.seed is not None:
        return spec
    mine = torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device=spec.device)
    return dataclasses.replace(spec, seed=gather_states(mine, world, group)[0, 0])


_symmetric_memory_missing = functools.cache(symmetric_memory_missing)


def status_words(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """New status words (`KernelDraw.status`, zeroed) and a view of the undecided word."""
    words = torch.zeros(2, dtype=torch.int64, device=device)
    return words, words[1:]


def mailbox_refusal(device: torch.device, world: int) -> str | None:
    """Why the workspaces cross by an all-gather instead of the mailbox kernel, or None."""
    if not one_read.ENABLED:
        return f"{one_read.ENV}=0"
    if world < 2:
        return "one rank: nothing to exchange"
    if device.type != "cuda" or torch.version.hip is not None:
        return "the mailbox needs NVIDIA GPUs (torch's symmetric memory over NVLink)"
    if torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured: the call's epoch is a launch argument"
    return _symmetric_memory_missing()


def exchange(prefix: torch.Tensor, rank: int, world: int, box: Mailbox, status: torch.Tensor, at=None):
    """Every rank's `prefix` (int32 [W], the same W everywhere) as [world, W] in rank order,
    through `box`: (gathered, at), `at` the call's (epoch, mailbox half): the next call's unless
    given (a wait repeated: publishing the same words again is harmless); `status[0]` gets the
    epoch where a peer never wrote, and `status[1]` is zeroed."""
    from ..backends._triton_common.exchange import exchange_launcher

    n_words = prefix.numel()
    key = ("exchange", n_words, rank)
    run = box.launchers.get(key)
    if run is None:
        run = exchange_launcher(n_words, rank, world, box.words, box.peers)
        box.launchers.put(key, run)
    at = at or box.next_call()
    return run(prefix, status, *at), at


def runner(spec: SamplingSpec, vocab_start: int, vocab_total: int, rank: int, world: int, group,
           box: Mailbox | None = None):
    """`run(logits_shard, values) -> KernelDraw`: for every request of `spec`'s form (the shard's,
    its seed given), scan this rank's shard, exchange the workspaces' shared prefix (`box`,
    default the group's mailbox where `mailbox_refusal` says None, else an all-gather), select
    over every shard: ids (-1: an invalid row, `UNDECIDED`: a row needing the whole row) and
    their log-probabilities, the same on every rank. `values`: a call's checked keyword values
    (`SamplingSpec.KEYWORDS` order). Made on the same call on every rank (the mailbox's
    collective). `refusal` must have said None."""
    from ..backends._triton_common.launcher import per_stream
    from ..backends._triton_common.sampling import shard_runner

    spec = form_of(spec)  # (the form alone: no call's tensors kept alive)
    scan, select, words = shard_runner(spec, vocab_start, vocab_total, world)
    # (a runner's own per stream: calls of other runners or streams never touch its words
    # between its kernels and its read)
    statuses = per_stream(status_words)
    if box is None and mailbox_refusal(spec.device, world) is None:
        box = symmetric(group, spec.device, words, world)

    def exchanged(prefix, call, at=None) -> KernelDraw:
        status, undecided = statuses(spec.device)
        if box is None:
            gathered, epoch = gather_states(prefix, world, group), 0
            undecided.zero_()
        else:
            if at is not None:
                status.zero_()
            gathered, at = exchange(prefix, rank, world, box, status, at)
            epoch = at[0]
        ids, lp = select(gathered, call, undecided)
        return KernelDraw(None, ids, lp, status, epoch, None if box is None else lambda: exchanged(prefix, call, at))

    def run(logits_shard, values) -> KernelDraw:
        return exchanged(*scan(logits_shard, values))

    return run


def draw(spec: SamplingSpec, logits_shard: torch.Tensor, vocab_start: int, vocab_total: int, rank: int,
         world: int, group, box: Mailbox | None = None) -> KernelDraw:
    """`runner`'s draw of one request, its seed agreed first where it has none (every rank then
    draws with rank 0's)."""
    from ..backends._triton_common.sampling import keyword_values

    spec = agreed_seed(spec, world, group)
    run = runner(spec, vocab_start, vocab_total, rank, world, group, box)
    return run(logits_shard, keyword_values(spec))._replace(spec=spec)


def undecided_rows(done: KernelDraw) -> tuple[KernelDraw, torch.Tensor | None]:
    """(`done`, the rows of it the torch-ops path must draw or None), read on the host: one read
    of the status words. Where the exchange gave up waiting for a peer, the call's exchange and
    select run again (`done.again`) for up to `LATE_SECONDS`, then it raises."""
    late, some = done.status.tolist()
    start = time.monotonic()
    while done.epoch and late == done.epoch and done.again is not None \
            and time.monotonic() - start < LATE_SECONDS:
        done = done.again()
        late, some = done.status.tolist()
    if done.epoch and late == done.epoch:
        raise RuntimeError("anysoftmax.distributed.sample: a peer rank wrote nothing into this rank's mailbox "
                           "for seconds: every rank of the group must call sample together, in the same order")
    return done, (done.ids == UNDECIDED if some else None)
