"""Whether a cell's tensors fit its device, decided before anything is allocated.

A `[100000, 100000, 100000]` cell would otherwise die inside the allocator (or, on the CPU, in
the kernel's out-of-memory killer); refusing it up front names the bytes it needs and the bytes
the device has. The estimate is the cell's peak: its input drawn in float32 then cast, the
output, the float64 reference and its comparison buffers (on the reference device), the
backward's extra tensors, and the benchmark's rotated input sets.
"""

from __future__ import annotations

import math
import os

import torch

from .. import perf
from ..core.spec import parse_dtype
from .cells import Cell
from .conformance import reference_device

# Live float64 tensors while a cell is compared: the reference input, the reference output,
# the upcast result and the difference (forward); the backward adds the upstream gradient,
# the reference gradient and the tolerance scale.
_F64_FORWARD, _F64_BACKWARD = 4, 7


def bytes_needed(cell: Cell, device: str) -> dict[str, int]:
    """Peak bytes of `cell` per device it touches: {device: bytes} (the reference device too)."""
    numel = math.prod(cell.shape)
    item = parse_dtype(cell.dtype).itemsize
    backward = cell.direction == "backward"
    # x drawn in float32 (4 bytes) then cast; y; backward adds dy and dx.
    own = numel * (4 + (4 if backward else 2) * item)
    if cell.benchmark:
        per_set = numel * item * (3 if backward else 1)
        own += per_set * perf.rotation_count(per_set)
    ref = numel * 8 * (_F64_BACKWARD if backward else _F64_FORWARD)
    ref_dev = reference_device(device)
    need = {device: own}
    need[ref_dev] = need.get(ref_dev, 0) + ref
    return need


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes(device: str) -> int | None:
    """Free bytes on `device` now (None when the device cannot say)."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return _host_available()
    module = getattr(torch, kind, None)
    mem_get_info = getattr(module, "mem_get_info", None)
    if mem_get_info is None:
        return None
    try:
        return int(mem_get_info(int(index) if index else None)[0])
    except Exception:  # a device that cannot report: no check rather than a wrong refusal
        return None


def refusal(cell: Cell, device: str) -> str | None:
    """Why `cell` cannot fit on `device` (and its reference device), or None when it fits."""
    for dev, need in bytes_needed(cell, device).items():
        have = available_bytes(dev)
        if have is not None and need > have:
            return (f"the cell's tensors need {need:,} bytes ({need / 2**30:.1f} GiB) on {dev}, "
                    f"which has {have:,} bytes ({have / 2**30:.1f} GiB) free: refused before running")
    return None
