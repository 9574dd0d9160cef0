"""The sharded softmax in one read of the shard (docs/semantics.md, "A dim sharded across ranks"). `refusal`
depends only on what every rank shares, so the ranks of a group take the same path."""

from __future__ import annotations

import functools
import math
import os

import torch

from ..core.registry import ENV_BACKEND
from ..core.request import SHARDED, request_key
from ..dispatch import FusedArgs
from .mailbox import Mailbox, symmetric, symmetric_memory_missing
from .states import RowStates

ENV = "ANYSOFTMAX_SHARDED_ONE_READ"
ENABLED = os.environ.get(ENV, "1") != "0"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Calls served here (the benchmark reads which path a call took).
stats = {"calls": 0}


def _is_nvidia(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.version.hip is None


def refusal(x: torch.Tensor, mask, c) -> str | None:
    """Why a call takes the two-pass exchange instead, or None (module docstring)."""
    if not ENABLED:
        return f"{ENV}=0"
    if c.world < 2:
        return "one rank: nothing to exchange"
    if not _is_nvidia(x):
        return "the mailbox needs NVIDIA GPUs (torch's symmetric memory, system-scope atomics over NVLink)"
    if x.dtype not in DTYPES:
        return f"{x.dtype}: the mailbox carries float32 states (float64 keeps the two-pass exchange)"
    if mask is not None and mask.dtype == torch.bool:
        return "a bool mask: its empty rows need every rank's kept count"
    if c.backend is not None:
        if c.backend != "triton":
            return f"backend={c.backend!r}: the one-read kernel is the triton backend's"
    else:
        # (read per call, as `registry.select` reads it per new request: a few hundred ns)
        env = os.environ.get(ENV_BACKEND, "").strip()
        if env and env != "triton":
            return f"${ENV_BACKEND}={env!r}: the one-read kernel is the triton backend's"
    if not c.eager:
        return "torch.compile, torch.func or a tensor subclass: traced through the two-pass exchange"
    if torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured: the call's epoch is a launch argument"
    return _symmetric_memory_missing()


_symmetric_memory_missing = functools.cache(symmetric_memory_missing)


def sharded_softmax(x: torch.Tensor, mask, sinks, c, box: Mailbox) -> tuple[torch.Tensor, RowStates]:
    """(this rank's shard of the global softmax / log_softmax, its row states: the global lse with
    sinks) through the mailbox `box`: one launch of the triton backend's sharded kernel."""
    fused = FusedArgs(c.scale, mask, False, c.softcap, sinks)
    key = request_key(SHARDED, x, c.dim, None, c.backend, c.log, None, fused)
    launch = box.launchers.get(key) if key is not None else None
    if launch is None:
        from ..core.registry import get_backend

        launch = get_backend("triton").sharded_softmax_launcher(
            x, c.dim, log=c.log, has_scale=c.scale is not None, has_cap=c.softcap is not None, mask=mask,
            has_sink=sinks is not None, want_lse=sinks is not None, rank=c.rank, world=c.world, words=box.words,
            peers=box.peers)
        if key is not None:
            box.launchers.put(key, launch)
    epoch, slot_base = box.next_call()
    stats["calls"] += 1
    y, lse = launch(x, mask, sinks, c.scale, c.softcap, epoch, slot_base)
    return y, RowStates(lse, None, None, None)


def forward(x: torch.Tensor, mask, sinks, c) -> tuple[torch.Tensor, RowStates] | None:
    """`sharded_softmax` through the group's symmetric mailbox, or None where `refusal` says no."""
    if refusal(x, mask, c) is not None:
        return None
    rows = math.prod(s for d, s in enumerate(x.shape) if d != c.dim)
    return sharded_softmax(x, mask, sinks, c, symmetric(c.group, x.device, rows, c.world))
