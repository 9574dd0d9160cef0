"""Float64 checks of large inputs, chunk by chunk: rows are independent, so an input too large
for one float64 comparison (attention scores [8, 16, 4096, 4096] are 2^31 elements: 17 GB per
float64 tensor, a comparison holds several) is compared in chunks of whole rows, every row
still checked. A chunk takes one index of the leading dims it cuts; dims that must stay whole
(the reduced dim, causal's (queries, keys), dims a sink is shared over) are never cut.
"""

from __future__ import annotations

import itertools
import math

import torch

from ..testing.compare import Comparison

CHECK_ELEMS = 1 << 26  # elements per float64 comparison; larger inputs are compared in chunks of rows


def _cut_dims(shape: tuple[int, ...], dim: int, whole: set[int]) -> list[int]:
    ndim = len(shape)
    keep = set(whole) | {dim % max(ndim, 1)}
    numel, cut = math.prod(shape), []
    for i in range(ndim):
        if numel <= CHECK_ELEMS:
            break
        if i not in keep and shape[i] > 1:
            cut.append(i)
            numel //= shape[i]
    return cut


def chunk_elems(shape: tuple[int, ...], dim: int, whole: set[int] = frozenset()) -> int:
    """Elements of one chunk (the whole input when it is not cut)."""
    return math.prod(shape) // math.prod(shape[i] for i in _cut_dims(shape, dim, whole))


def row_chunks(shape: tuple[int, ...], dim: int, whole: set[int] = frozenset()) -> list[tuple]:
    """Index tuples (of slices) cutting an input of `shape` into chunks of whole rows of at most
    CHECK_ELEMS elements where the layout allows, never cutting `dim` or the dims in `whole`."""
    cut = _cut_dims(shape, dim, whole)
    out = []
    for idx in itertools.product(*(range(shape[i]) for i in cut)):
        at = dict(zip(cut, idx))
        out.append(tuple(slice(at[i], at[i] + 1) if i in at else slice(None) for i in range(len(shape))))
    return out


def take(t: torch.Tensor | None, index: tuple, ndim: int) -> torch.Tensor | None:
    """`t` (broadcasting against an input of `ndim` dims) cut as the input is cut by `index`:
    dims where `t` has size 1 (or none) are left whole."""
    if t is None:
        return None
    off = ndim - t.dim()
    return t[tuple(index[off + j] if t.shape[j] != 1 else slice(None) for j in range(t.dim()))]


def worst(results: list[Comparison]) -> Comparison:
    """One verdict of the chunks' comparisons: the first failure (naming its chunk), else the
    largest errors."""
    n = len(results)
    for k, c in enumerate(results):
        if not c.ok:
            return Comparison(False, c.max_abs_err, c.max_rel_err, (f"chunk {k + 1} of {n}: " if n > 1 else "") + c.detail)
    return Comparison(True, max((c.max_abs_err for c in results), default=0.0),
                      max((c.max_rel_err for c in results), default=0.0))
