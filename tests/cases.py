"""Conformance cases as data: every backend's tests consume these (one place, one generator).

A case makes a fresh random input (never zeros) from a torch.Generator, plus the dim and the
`dtype=` keyword. Special-value cases plant NaN / inf / -inf rows into random data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[torch.Generator, torch.dtype], torch.Tensor]  # a CPU tensor; moved by the test
    dim: int
    out_dtype: torch.dtype | None = None  # the `dtype=` keyword
    dtypes: tuple = DTYPES
    tags: frozenset = field(default_factory=frozenset)


def randn(shape, scale=3.0):
    """Random normal data of `shape` times `scale`, in the requested dtype."""
    def make(gen, dtype):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
    return make


def uniform(shape, bound):
    """Uniform data in [-bound, bound]: large magnitudes without overflowing the dtype."""
    def make(gen, dtype):
        return ((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound).to(dtype)
    return make


def transposed(shape, d0, d1):
    def make(gen, dtype):
        return randn(shape)(gen, dtype).transpose(d0, d1)
    return make


def step_sliced(shape):
    def make(gen, dtype):
        return randn(shape)(gen, dtype)[::2, 1::3]
    return make


def expanded(shape, expand_to):
    def make(gen, dtype):
        return randn(shape)(gen, dtype).expand(*expand_to)
    return make


def permuted(shape, perm):
    def make(gen, dtype):
        return randn(shape)(gen, dtype).permute(*perm)
    return make


def with_specials(shape, scale=3.0):
    """Rows: one with a NaN, one with +inf, one all -inf, one half -inf, the rest random."""
    def make(gen, dtype):
        x = randn(shape, scale)(gen, dtype)
        x[0, shape[1] // 2] = float("nan")
        x[1, 0] = float("inf")
        x[2, :] = float("-inf")
        x[3, : shape[1] // 2] = float("-inf")
        x[4, -1] = float("-inf")
        return x
    return make


def with_special_columns(shape, scale=3.0):
    """`with_specials` along dim 0 of a contiguous (shape[0], shape[1]) tensor: the special
    values sit in columns, as a reduction over dim 0 sees them."""
    def make(gen, dtype):
        return with_specials((shape[1], shape[0]), scale)(gen, dtype).t().contiguous()
    return make


def _rank_dim_cases():
    shapes = {1: (37,), 2: (13, 29), 3: (5, 6, 7), 4: (3, 4, 5, 6)}
    for rank, shape in shapes.items():
        for dim in range(-rank, rank):
            yield Case(f"rank{rank}-dim{dim}", randn(shape), dim)


CASES: list[Case] = [
    Case("seed-1823x781", randn((1823, 781)), 1),
    Case("seed-1823x781-dim0", randn((1823, 781)), 0, dtypes=(torch.float32,)),
    *_rank_dim_cases(),
    Case("transposed-2d", transposed((40, 70), 0, 1), 1),
    Case("transposed-2d-dim0", transposed((40, 70), 0, 1), 0),
    Case("transposed-3d", transposed((6, 7, 30), 0, 2), 1),
    Case("step-sliced", step_sliced((30, 90)), 1),
    Case("step-sliced-dim0", step_sliced((30, 90)), 0),
    Case("expanded-rows", expanded((1, 50), (9, 50)), 1),
    Case("expanded-cols", expanded((9, 1), (9, 50)), 1),
    Case("permuted-4d", permuted((3, 4, 5, 6), (2, 0, 3, 1)), 2),
    # Reductions across contiguous rows (inner dim >= 16): the transposed-tile column kernels.
    Case("cols-3d", randn((4, 50, 40)), 1),
    Case("cols-dim0-odd", randn((33, 70)), 0),
    Case("cols-specials", with_special_columns((100, 20)), 0),
    Case("specials", with_specials((8, 100)), 1),
    Case("large-magnitude-fp32", uniform((16, 300), 1e4), 1, dtypes=(torch.float32, torch.float64)),
    Case("large-magnitude-fp16", uniform((16, 300), 6e4), 1, dtypes=(torch.float16,)),
    Case("n1", randn((17, 1)), 1),
    Case("n1-rank1", randn((1,)), 0),
    Case("zero-dim", randn(()), 0),
    Case("zero-dim-neg", randn(()), -1),
    Case("empty-rows", randn((0, 33)), 1),
    Case("empty-cols", randn((5, 0)), 1),
    Case("empty-rows-dim0", randn((0, 33)), 0),
    Case("dtype-fp16-to-fp32", randn((20, 130)), 1, out_dtype=torch.float32, dtypes=(torch.float16,)),
    Case("dtype-bf16-to-fp32", randn((20, 130)), 1, out_dtype=torch.float32, dtypes=(torch.bfloat16,)),
    Case("dtype-fp32-to-fp64", randn((20, 130)), 1, out_dtype=torch.float64, dtypes=(torch.float32,)),
    Case("dtype-fp32-to-fp16", randn((20, 130)), 1, out_dtype=torch.float16, dtypes=(torch.float32,)),
    Case("dtype-fp64-to-bf16", randn((20, 130)), 0, out_dtype=torch.bfloat16, dtypes=(torch.float64,)),
]

def offset_with_dead_head(shape, offset=-1e4, dead=100):
    """Rows far from zero whose first `dead` entries are -inf: a split row whose first chunk
    holds only -inf must neither poison the row nor lose it to underflow."""
    def make(gen, dtype):
        x = (torch.randn(shape, generator=gen, dtype=torch.float64) + offset).to(dtype)
        x[:, :dead] = float("-inf")
        return x
    return make


# Rows longer than the (lowered) tile limit: they take the sub-block / online path.
LONG_ROW_CASES: list[Case] = [
    Case("long-2d", randn((5, 300)), 1),
    Case("long-dim0", randn((300, 3)), 0),
    Case("long-specials", with_specials((6, 200)), 1),
    Case("long-transposed", transposed((200, 4), 0, 1), 1),
    Case("long-fp16-magnitude", uniform((3, 300), 6e4), 1, dtypes=(torch.float16,)),
    Case("long-dead-head", offset_with_dead_head((4, 300)), 1),
    Case("long-cols", randn((2, 300, 40)), 1),
    Case("long-cols-specials", with_special_columns((200, 24)), 0),
    Case("long-cols-dead-head", lambda gen, dtype: offset_with_dead_head((20, 300))(gen, dtype).t().contiguous(), 0),
]


def params(cases):
    """(case, dtype) pairs as pytest params with readable ids."""
    import pytest

    return [pytest.param(c, d, id=f"{c.name}-{str(d).removeprefix('torch.')}") for c in cases for d in c.dtypes]
