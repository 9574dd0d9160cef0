"""Whether a cell's tensors fit its device, decided before anything is allocated.

A `[100000, 100000, 100000]` cell would otherwise die inside the allocator (or, on the CPU, in
the kernel's out-of-memory killer); refusing it up front names the bytes it needs and the bytes
the device has. The estimate is the cell's peak: its input drawn in float32 then cast, the
output, the float64 reference and its comparison buffers (on the reference device), the
backward's extra tensors, and the benchmark's rotated input sets. The float64 check of a large
input runs in chunks of rows (`matrix.chunks`). A fused cell (a variant) adds its operands and
autograd's saved tensors.
"""

from __future__ import annotations

import math
import os

import torch

from .. import perf
from ..core.spec import parse_dtype
from .cells import Cell
from .conformance import reference_device
from .chunks import chunk_elems
from .fused_cells import rotated_sets, whole_dims
from .variants import resolve

# Live float64 tensors while a cell is compared: the reference input, the reference output,
# the upcast result and the difference (forward); the backward adds the upstream gradient,
# the reference gradient and the tolerance scale.
_F64_FORWARD, _F64_BACKWARD = 4, 7
# The fused comparison holds more: z, the kept mask, |z|, the probabilities, the allowance,
# and for the backward the sink shares, the sensitivity and the chain factor.
_F64_FUSED_FORWARD, _F64_FUSED_BACKWARD = 9, 14


def _temporaries(cell: Cell, item: int, backward: bool) -> int:
    """Bytes per element of the intermediates a fused provider holds at its peak besides x, y,
    dy and dx: the torch composition (peer:torch) steps through whole tensors, in float32 when
    it has arithmetic on a 16-bit input (`matrix.composition`); its backward keeps what
    autograd saved (tanh's output, a float32 softmax output) and two gradients in flight.
    anysoftmax and torch.compile hold about one tensor."""
    v = cell.variant
    if cell.backend != "peer:torch":
        return 4 if backward else 0
    arithmetic = v.scale is not None or v.softcap is not None or (v.mask is not None and v.mask.kind == "additive")
    if not arithmetic:
        return item * (2 if backward else 1)
    return max(item, 4) * (3 if backward else 2)


def _need(device: str, check: int, bench: int, ref: int) -> dict[str, int]:
    # The conformance check (its tensors, and the float64 reference when it runs on the same
    # device) is over before the benchmark allocates its input sets: the peak is the larger.
    ref_dev = reference_device(device)
    need = {device: check}
    need[ref_dev] = need.get(ref_dev, 0) + ref
    need[device] = max(need[device], bench)
    return need


def _fused_bytes_needed(cell: Cell, device: str) -> dict[str, int]:
    numel = math.prod(cell.shape)
    item = parse_dtype(cell.dtype).itemsize
    backward = cell.direction == "backward"
    r = resolve(cell.variant, tuple(cell.shape), cell.dim)
    operands = (math.prod(r.mask_shape) * item if r.mask_shape else 0) + (
        math.prod(r.sinks_shape) * item if r.sinks_shape else 0)
    # x and y, (backward) dy and dx, and the larger of the float32 draw of x and the provider's
    # intermediates (with what autograd saved).
    steps = max(4, _temporaries(cell, item, backward))
    check = numel * (2 * item + (2 * item if backward else 0) + steps) + operands
    bench = 0
    if cell.benchmark:
        per_set = numel * item * (3 if backward else 1) + operands
        bench = per_set * rotated_sets(per_set) + numel * (item + steps)
    chunk = chunk_elems(tuple(cell.shape), cell.dim, whole_dims(tuple(cell.shape), cell.variant, r))
    return _need(device, check, bench, chunk * 8 * (_F64_FUSED_BACKWARD if backward else _F64_FUSED_FORWARD))


def bytes_needed(cell: Cell, device: str) -> dict[str, int]:
    """Peak bytes of `cell` per device it touches: {device: bytes} (the reference device too)."""
    if not cell.variant.is_plain:
        return _fused_bytes_needed(cell, device)
    numel = math.prod(cell.shape)
    item = parse_dtype(cell.dtype).itemsize
    backward = cell.direction == "backward"
    # x drawn in float32 (4 bytes) then cast; y; backward adds dy and dx.
    check = numel * (4 + (4 if backward else 2) * item)
    bench = 0
    if cell.benchmark:
        per_set = numel * item * (3 if backward else 1)
        bench = per_set * perf.rotation_count(per_set) + numel * item  # the sets and one output
    ref = chunk_elems(tuple(cell.shape), cell.dim) * 8 * (_F64_BACKWARD if backward else _F64_FORWARD)
    return _need(device, check, bench, ref)


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
