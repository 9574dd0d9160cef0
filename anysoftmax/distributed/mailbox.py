"""The mailbox of the one-read sharded softmax (`one_read.py`): per rank an int64 buffer
[2, capacity, world] every rank can write over NVLink (torch's symmetric memory), into which a
kernel writes each row's state tagged with the call's epoch (docs/kernels.md). Made per (group,
device) by a collective, grown when a call has more rows, never freed while the process lives: a
peer's kernel still in flight may write into an old one.
"""

from __future__ import annotations

import threading
import weakref

import torch

from ..core.cache import BoundedDict
from .collective import group_object

# A word holds the epoch in its upper 32 bits, below the sign bit.
MAX_EPOCH = 2**31 - 1


class Mailbox:
    """This rank's mailbox `words`, `peers` (every rank's `words` address in this process), the
    epoch of the last call, `keep` (what keeps the mapping alive) and the `launchers` bound to it."""

    __slots__ = ("words", "peers", "capacity", "world", "epoch", "keep", "launchers")

    def __init__(self, words: torch.Tensor, peers: torch.Tensor, capacity: int, world: int, keep=None):
        if words.dtype != torch.int64 or words.numel() < 2 * capacity * world:
            raise ValueError(f"Mailbox: words must be int64 with at least 2 * capacity * world = "
                             f"{2 * capacity * world} elements, got {words.dtype} with {words.numel()}")
        if peers.dtype != torch.int64 or peers.numel() != world:
            raise ValueError(f"Mailbox: peers must be int64 with world = {world} elements, got {peers.dtype} "
                             f"with {peers.numel()}")
        self.words, self.peers, self.capacity, self.world, self.keep = words, peers, capacity, world, keep
        self.epoch = 0
        self.launchers = BoundedDict(maxsize=256)

    def next_call(self) -> tuple[int, int]:
        """(epoch, offset of the mailbox half) of the next call (a rank is never more than one ahead)."""
        if self.epoch >= MAX_EPOCH:
            raise RuntimeError(f"anysoftmax.distributed: this mailbox has served {MAX_EPOCH} calls, the most "
                               f"its 32-bit epochs tell apart; set ANYSOFTMAX_SHARDED_ONE_READ=0 to go on with "
                               f"the two-pass exchange")
        self.epoch += 1
        return self.epoch, (self.epoch & 1) * self.capacity * self.world


def symmetric_memory_missing() -> str | None:
    """Why torch's symmetric memory cannot back a mailbox here, or None."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as exc:
        return f"torch.distributed._symmetric_memory is not importable ({exc})"
    return None


# group -> {device: Mailbox}; retired mailboxes stay referenced (module docstring).
_boxes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_retired: list = []
_lock = threading.Lock()


def _rendezvous(group, device: torch.device, capacity: int, world: int) -> Mailbox:
    import torch.distributed._symmetric_memory as symm_mem

    n = 2 * capacity * world
    words = symm_mem.empty(n, dtype=torch.int64, device=device)
    # Zeroed before the rendezvous: no peer writes into it before every rank has joined.
    words.zero_()
    torch.cuda.synchronize(device)
    handle = symm_mem.rendezvous(words, group)
    peers = torch.tensor([handle.get_buffer(r, (n,), torch.int64).data_ptr() for r in range(world)],
                         dtype=torch.int64, device=device)
    return Mailbox(words, peers, capacity, world, keep=handle)


def symmetric(group, device: torch.device, rows: int, world: int) -> Mailbox:
    """The mailbox of `group` on `device` holding at least `rows` rows (a collective the first
    time, and when a call has more rows than the mailbox: every rank calls it on the same call)."""
    group = group_object(group)
    with _lock:
        per_device = _boxes.setdefault(group, {})
        box = per_device.get(device)
        if box is not None and box.capacity >= rows:
            return box
        capacity = max(rows, 1024, 2 * box.capacity if box is not None else 0)
        if box is not None:
            _retired.append(box)
        box = per_device[device] = _rendezvous(group, device, capacity, world)
        return box
