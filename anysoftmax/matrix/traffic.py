"""Bytes a fused softmax kernel must move, per variant and direction: the numerator of every
GB/s of a fused cell, and what its same-bytes copy (`peer:copy`) moves.

    forward:  read x (causal: only the kept prefix of each row) + the mask as stored
              (a broadcast mask is read once, never expanded); write y (all of it)
    backward: read y and dy (causal: kept prefix) + a bool mask as stored + x (softcap only:
              1 - tanh^2 is recomputed from it; kept prefix); write dx (all of it)

Not counted: the sinks, the per-row sink shares and the sinks' gradient (one value per row or
per head: under 1/N of the traffic). An additive mask is not read by the backward (its
gradient formula does not involve it). Under causal a mask that spans both the query and the
key dim is read only where the rows are kept; a mask broadcast over queries is read whole.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..core.variant import BOTTOM_RIGHT, CAUSAL_NONE
from .variants import VariantSpec


class Traffic(NamedTuple):
    read: int
    write: int

    @property
    def total(self) -> int:
        return self.read + self.write


def kept_in_plane(sq: int, sk: int, causal: str) -> int:
    """Positions a causal mask keeps in one (queries, keys) plane: row i keeps the prefix
    j <= i (top_left) or j <= i + sk - sq (bottom_right), clipped to [0, sk]."""
    if causal == CAUSAL_NONE:
        return sq * sk
    shift = sk - sq if causal == BOTTOM_RIGHT else 0
    return sum(min(sk, max(0, i + 1 + shift)) for i in range(sq))


def _kept(shape: tuple[int, ...], causal: str) -> int:
    numel = math.prod(shape)
    if causal == CAUSAL_NONE or numel == 0:
        return numel
    sq, sk = shape[-2], shape[-1]
    return numel // (sq * sk) * kept_in_plane(sq, sk, causal)


def _mask_bytes(shape: tuple[int, ...], mask_shape: tuple[int, ...], itemsize: int, causal: str) -> int:
    numel = math.prod(mask_shape)
    if causal != CAUSAL_NONE and len(mask_shape) >= 2 and tuple(mask_shape[-2:]) == tuple(shape[-2:]):
        return _kept(mask_shape, causal) * itemsize
    return numel * itemsize


def fused_bytes(spec: VariantSpec, shape: tuple[int, ...], itemsize: int, direction: str,
                mask_shape: tuple[int, ...] | None = None, mask_itemsize: int = 1) -> Traffic:
    """(bytes read, bytes written) of a fused kernel for `spec` on an input of `shape` with
    elements of `itemsize` bytes (input and output alike), `direction` forward or backward;
    `mask_shape` the mask operand's own shape (None: no mask)."""
    numel = math.prod(shape)
    kept = _kept(shape, spec.causal)
    has_mask = mask_shape is not None and spec.mask is not None
    mask = _mask_bytes(shape, mask_shape, mask_itemsize, spec.causal) if has_mask else 0
    if direction == "forward":
        return Traffic(kept * itemsize + mask, numel * itemsize)
    read = 2 * kept * itemsize  # y, dy
    if has_mask and spec.mask.kind == "bool":
        read += mask
    if spec.softcap is not None:
        read += kept * itemsize  # x
    return Traffic(read, numel * itemsize)
