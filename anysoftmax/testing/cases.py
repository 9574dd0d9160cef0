"""Conformance cases as data: the kit (`anysoftmax.testing.check_backend`), the project's own
tests and every backend's tests consume these (one place, one generator).

A case makes a fresh random input (never zeros) from a torch.Generator, plus the dim and the
`dtype=` keyword. Special-value cases plant NaN / inf / -inf rows into random data. Fused-family
cases (`VariantCase`) also make their masks and sinks from the same generator.
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


def channels_last(shape):
    """A 4-d input in channels_last memory (NHWC strides: dim 1 is the innermost)."""
    def make(gen, dtype):
        return randn(shape)(gen, dtype).contiguous(memory_format=torch.channels_last)
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
    # Sizes and layouts at which a kernel's plan changes, each as small as it can be: a row past
    # 1024, 2048 and 4096 elements (a looped or split tile; 16-bit included), more rows than
    # 4096 (a grid that covers rows in more than one pass), NHWC strides.
    Case("row-4097", randn((1, 4097)), 1),
    Case("rows-4097", randn((4097, 2)), 1),
    Case("channels-last", channels_last((2, 5, 3, 4)), 1),
    Case("channels-last-dim3", channels_last((2, 5, 3, 4)), 3),
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



# ---- the fused family (core.variant) ----------------------------------------------------------

@dataclass(frozen=True)
class VariantCase:
    """A fused-family case: an input (`make`, as `Case`), the softmax dim, and the fused
    keywords made from the same generator (`kwargs(gen, x)`: masks and sinks are fresh random
    tensors too, in the dtypes a model would use)."""

    name: str
    make: Callable[[torch.Generator, torch.dtype], torch.Tensor]
    dim: int
    kwargs: Callable[[torch.Generator, torch.Tensor], dict]
    dtypes: tuple = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    tags: frozenset = field(default_factory=frozenset)


def bool_mask(shape, density=0.3, empty_rows=(), dim=-1):
    """A random bool mask (True = excluded) of `shape`; rows listed in `empty_rows` (index
    tuples of all dims but the last) are excluded entirely."""
    def make(gen):
        m = torch.rand(shape, generator=gen) < density
        for r in empty_rows:
            m[r] = True
        return m
    return make


def additive_mask(shape, dtype=None, blocked=0.2):
    """A floating mask added to the logits: small random values, and a `blocked` fraction at
    finfo.min (HF's convention for excluded positions). `dtype` None: the input's dtype (as
    HF builds it; `_kw` converts)."""
    def make(gen):
        m = torch.randn(shape, generator=gen, dtype=torch.float64)
        m[torch.rand(shape, generator=gen) < blocked] = -torch.inf  # finfo.min of the final dtype
        if dtype is not None:
            m = m.to(dtype)
            m[m == -torch.inf] = torch.finfo(dtype).min
        return m
    return make


def nothing_excluded(shape):
    """A bool mask that excludes nothing (all False): the same result as no mask."""
    def make(gen):
        return torch.zeros(shape, dtype=torch.bool)
    return make


def nan_where_excluded(shape, density=0.3):
    """(make, mask) of a case: random logits, NaN at every fifth position of each row, and a
    bool mask that excludes those (and a random `density` of the rest). An excluded logit is
    never read: the output is as if it were finite, and its gradient is 0."""
    def make(gen, dtype):
        x = randn(shape)(gen, dtype)
        x[..., 1::5] = float("nan")
        return x

    def mask(gen, x):
        # (the generator is a CPU one; the logits may already sit on the device under test)
        return (torch.rand(tuple(x.shape), generator=gen) < density).to(x.device) | torch.isnan(x)
    return make, mask


def sinks(shape, scale=1.5):
    def make(gen):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    return make


def row_scale(shape, transpose: bool = False):
    """One scale per row (1 / temperature, float32, as a server holds it): random values in
    [0.25, 3], one of them negative; `transpose` makes it a non-contiguous view (the first two
    dims swapped back from a transposed tensor)."""
    def make(gen):
        size = (shape[1], shape[0], *shape[2:]) if transpose else shape
        s = torch.rand(size, generator=gen, dtype=torch.float64) * 2.75 + 0.25
        s.view(-1)[0] = -s.view(-1)[0]
        return (s.transpose(0, 1) if transpose else s).to(torch.float32)
    return make


def _kw(x_mask=None, **parts):
    """kwargs(gen, x): constant values as given, callables called with the generator (masks,
    sinks); sinks take the input's dtype unless the case says otherwise. `x_mask(gen, x)`
    makes the mask from the input itself."""
    def make(gen, x):
        out = {} if x_mask is None else {"mask": x_mask(gen, x)}
        for k, v in parts.items():
            v = v(gen) if callable(v) else v
            if k in ("sinks", "mask") and isinstance(v, torch.Tensor) and v.dtype == torch.float64:
                v = v.to(x.dtype if x.dtype.is_floating_point else torch.float32)
            if k == "mask" and isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
                v = v.masked_fill(v == -torch.inf, torch.finfo(v.dtype).min)
            out[k] = v
        return out
    return make


LONG_DTYPES = (torch.bfloat16, torch.float32)  # interpreted long rows are slow: two dtypes suffice here
ATT = (2, 3, 16, 24)  # [B, H, Sq, Sk]: sq < sk (bottom-right differs from top-left)
ATT_SQ_GT_SK = (2, 2, 20, 12)  # sq > sk: bottom-right leaves the first rows empty
NAN_EXCLUDED_INPUT, NAN_EXCLUDED_MASK = nan_where_excluded((2, 2, 6, 20))

VARIANT_CASES: list[VariantCase] = [
    VariantCase("scale", randn(ATT), -1, _kw(scale=0.125)),
    VariantCase("scale-negative-large", randn(ATT, 1.0), -1, _kw(scale=-40.0)),
    VariantCase("softcap", randn(ATT, 20.0), -1, _kw(softcap=30.0)),
    VariantCase("scale-softcap", randn(ATT, 8.0), -1, _kw(scale=0.5, softcap=5.0)),
    VariantCase("bool-mask-broadcast", randn(ATT), -1, _kw(mask=bool_mask((2, 1, 16, 24)))),
    VariantCase("bool-mask-nothing-excluded", randn((2, 2, 4, 24)), -1, _kw(mask=nothing_excluded((2, 1, 4, 24)))),
    VariantCase("bool-mask-full-empty-zero", randn(ATT), -1,
                _kw(mask=bool_mask(ATT, empty_rows=[(0, 1, 3), (1, 2, 0)]))),
    VariantCase("bool-mask-empty-nan", randn(ATT), -1,
                _kw(mask=bool_mask((2, 1, 16, 24), empty_rows=[(1, 0, 5)]), empty_rows="nan")),
    VariantCase("bool-mask-empty-uniform", randn(ATT), -1,
                _kw(mask=bool_mask((16, 24), empty_rows=[(7,)]), empty_rows="uniform", scale=0.3)),
    VariantCase("additive-mask", randn(ATT), -1, _kw(mask=additive_mask((2, 1, 16, 24)))),
    VariantCase("additive-mask-fp16", randn(ATT), -1, _kw(mask=additive_mask((16, 24), torch.float16))),
    VariantCase("causal-top-left", randn(ATT), -1, _kw(causal=True)),
    VariantCase("causal-bottom-right", randn(ATT), -1, _kw(causal="bottom_right")),
    VariantCase("causal-bottom-right-empty-uniform", randn(ATT_SQ_GT_SK), -1,
                _kw(causal="bottom_right", empty_rows="uniform")),
    VariantCase("causal-bottom-right-empty-zero", randn(ATT_SQ_GT_SK), -1, _kw(causal="bottom_right")),
    VariantCase("sinks", randn(ATT), -1, _kw(sinks=sinks((3, 1, 1)))),
    VariantCase("sinks-fp32-with-16bit-input", randn(ATT), -1,
                _kw(sinks=lambda g: sinks((3, 1, 1))(g).float())),
    VariantCase("sinks-masked-rows", randn(ATT), -1,
                _kw(sinks=sinks((3, 1, 1)), mask=bool_mask((2, 1, 16, 24), empty_rows=[(0, 0, 2)]))),
    VariantCase("gemma2", randn(ATT, 4.0), -1,
                _kw(scale=0.25, softcap=50.0, mask=additive_mask((2, 1, 16, 24)))),
    VariantCase("gpt-oss", randn(ATT, 4.0), -1, _kw(scale=0.25, causal=True, sinks=sinks((3, 1, 1)))),
    VariantCase("megatron", randn(ATT, 4.0), -1,
                _kw(scale=0.125, mask=bool_mask((2, 1, 16, 24), empty_rows=[(1, 0, 0)]), empty_rows="zero")),
    VariantCase("everything", randn(ATT_SQ_GT_SK, 4.0), -1,
                _kw(scale=0.7, softcap=6.0, mask=bool_mask((2, 1, 20, 12)), causal="bottom_right",
                    sinks=sinks((2, 1, 1)), empty_rows="uniform")),
    # Layouts: transposed scores, a non-last dim (column kernels), rank 2, one-element rows.
    VariantCase("transposed-input-causal", transposed((2, 3, 24, 16), 2, 3), -1, _kw(causal=True, scale=0.5)),
    VariantCase("dim0-mask-sinks", randn((30, 20)), 0,
                _kw(mask=bool_mask((30, 1)), sinks=sinks((1, 20)), scale=2.0)),
    VariantCase("dim1-additive-softcap", randn((4, 50, 40)), 1, _kw(mask=additive_mask((50, 1)), softcap=3.0)),
    VariantCase("rank2-specials", with_specials((8, 100)), 1, _kw(scale=0.5, mask=bool_mask((8, 100)))),
    VariantCase("n1-sinks", randn((17, 1)), 1, _kw(sinks=sinks((17, 1)))),
    # NaN logits the mask excludes, through softcap's tanh (its derivative must not read them).
    VariantCase("softcap-nan-excluded", NAN_EXCLUDED_INPUT, -1, _kw(NAN_EXCLUDED_MASK, softcap=4.0, scale=0.5)),
    # A fused row past 512 elements (and 1024): a fused kernel's looped tile.
    # A tensor scale, one value per row (per-request temperatures): per row, per head with
    # softcap and a mask, and a non-contiguous one over a non-last dim.
    VariantCase("row-scale", randn(ATT), -1, _kw(scale=row_scale((2, 3, 16, 1)))),
    VariantCase("row-scale-per-head-softcap-mask", randn(ATT, 4.0), -1,
                _kw(scale=row_scale((3, 1, 1)), softcap=5.0, mask=bool_mask((2, 1, 16, 24), empty_rows=[(0, 0, 1)]))),
    VariantCase("row-scale-dim1-strided", randn((4, 50, 40)), 1, _kw(scale=row_scale((4, 1, 40), transpose=True))),
    VariantCase("fused-row-1100", randn((1, 1, 2, 1100)), -1,
                _kw(mask=bool_mask((1, 1, 2, 1100)), sinks=sinks((1, 1, 1)), scale=0.5), dtypes=LONG_DTYPES),
]

# Rows longer than the (lowered) tile limit: the online, split and column-split kernels.
LONG_VARIANT_CASES: list[VariantCase] = [
    VariantCase("long-causal-mask-sinks", randn((1, 2, 12, 200)), -1,
                _kw(causal="bottom_right", mask=bool_mask((1, 1, 12, 200), empty_rows=[(0, 0, 3)]),
                    sinks=sinks((2, 1, 1)), scale=0.4), dtypes=LONG_DTYPES),
    VariantCase("long-softcap-additive", randn((3, 300), 10.0), 1, _kw(softcap=8.0, mask=additive_mask((300,))),
                dtypes=LONG_DTYPES + (torch.float64,)),
    VariantCase("long-uniform", randn((1, 2, 6, 150)), -1,
                _kw(mask=bool_mask((1, 1, 6, 150), empty_rows=[(0, 0, 4)]), empty_rows="uniform"), dtypes=LONG_DTYPES),
    VariantCase("long-nan-causal", randn((1, 1, 20, 130)), -1,
                _kw(causal=True, mask=bool_mask((1, 1, 20, 130), empty_rows=[(0, 0, 9)]), empty_rows="nan"),
                dtypes=LONG_DTYPES),
    VariantCase("long-cols", randn((2, 300, 20)), 1, _kw(mask=bool_mask((300, 20)), sinks=sinks((2, 1, 20)), scale=0.8),
                dtypes=LONG_DTYPES),
]



# ---- softmax in pieces (core.lse_merge): logsumexp, and merge(split(x)) -------------------------

def _no_empty_rows(kwargs):
    """A variant case's keywords for logsumexp (which has no `empty_rows`: empty rows are -inf)."""
    def make(gen, x):
        return {k: v for k, v in kwargs(gen, x).items() if k != "empty_rows"}
    return make


def _lse_variant(c: VariantCase) -> VariantCase:
    return VariantCase(f"lse-{c.name}", c.make, c.dim, _no_empty_rows(c.kwargs), c.dtypes, c.tags)


# logsumexp: plain layouts and special values, then every fused variant.
LOGSUMEXP_CASES: list[VariantCase] = [
    VariantCase("lse-rank3-dim1", randn((5, 6, 7)), 1, _kw()),
    VariantCase("lse-transposed", transposed((40, 70), 0, 1), 1, _kw()),
    VariantCase("lse-step-sliced", step_sliced((30, 90)), 1, _kw()),
    VariantCase("lse-cols", randn((4, 50, 40)), 1, _kw()),
    VariantCase("lse-specials", with_specials((8, 100)), 1, _kw()),
    VariantCase("lse-large-magnitude", uniform((16, 300), 1e4), 1, _kw(), dtypes=(torch.float32, torch.float64)),
    VariantCase("lse-long", randn((3, 700)), 1, _kw(), dtypes=LONG_DTYPES),
    VariantCase("lse-zero-dim", randn(()), 0, _kw()),
    VariantCase("lse-empty-cols", randn((5, 0)), 1, _kw()),
    *[_lse_variant(c) for c in VARIANT_CASES + LONG_VARIANT_CASES],
]


CONTIGUOUS, STRIDED, INTO_OUT = "contiguous", "strided", "into-out"


@dataclass(frozen=True)
class SplitCase:
    """merge(split(x)): rows of `make`'s x cut along the last dim at `bounds(n)` (segment
    b_i..b_i+1, empty ones allowed); each segment's softmax and logsumexp merged must give x's
    softmax and logsumexp (rows with nothing: 0 and -inf).

    `lse_dtype`: the partial lses' dtype (None: float64 for float64 x, else float32).
    `layout`: CONTIGUOUS partials; STRIDED (every partial output and lse a non-contiguous view,
    its last two dims stored transposed as vLLM keeps its lses); INTO_OUT (two partials of a
    [tokens, heads, head_size] x merged by `anysoftmax.compat.vllm.merge_attn_states` into
    `output` and `output_lse`, vLLM's layout)."""

    name: str
    make: Callable[[torch.Generator, torch.dtype], torch.Tensor]
    bounds: Callable[[int], list]
    dtypes: tuple = DTYPES
    tags: frozenset = field(default_factory=frozenset)
    lse_dtype: torch.dtype | None = None
    layout: str = CONTIGUOUS


def even(k):
    return lambda n: [n * i // k for i in range(k + 1)]


def with_masked_segments(shape, scale=3.0):
    """`with_specials` plus a row whose first 40% is -inf (masked segments) and ±inf/NaN rows."""
    def make(gen, dtype):
        x = with_specials(shape, scale)(gen, dtype)
        x[5, : shape[1] * 2 // 5] = float("-inf")
        x[6, 1] = float("-inf")
        x[6, -1] = float("inf")
        return x
    return make


def by_heads(make, heads):
    """`make`'s [rows, n] input as [rows / heads, heads, n] (vLLM's [tokens, heads, head_size])."""
    def made(gen, dtype):
        x = make(gen, dtype)
        return x.reshape(x.shape[0] // heads, heads, x.shape[-1])
    return made


SPLIT_CASES: list[SplitCase] = [
    SplitCase("split-1", randn((6, 48)), even(1)),
    SplitCase("split-2", randn((6, 48)), even(2)),
    SplitCase("split-3-uneven", randn((6, 50)), lambda n: [0, 7, 31, n]),
    SplitCase("split-8", randn((6, 48)), even(8)),
    SplitCase("split-11-many", randn((4, 70)), even(11)),
    SplitCase("split-with-empty-segments", randn((6, 40)), lambda n: [0, 0, 9, 9, 25, n, n]),
    SplitCase("split-one-element-segments", randn((3, 9)), even(9)),
    SplitCase("split-masked-and-specials", with_masked_segments((8, 60)), lambda n: [0, 12, 24, 40, n]),
    SplitCase("split-large-magnitude", uniform((6, 64), 1e4), even(4), dtypes=(torch.float32, torch.float64)),
    SplitCase("split-strided", by_heads(with_masked_segments((8, 40)), 2), lambda n: [0, 13, 13, n], layout=STRIDED),
    SplitCase("split-float64-lses", with_masked_segments((8, 40)), lambda n: [0, 15, 16, n],
              dtypes=(torch.float16, torch.bfloat16, torch.float32), lse_dtype=torch.float64),
    SplitCase("split-into-out", by_heads(with_masked_segments((8, 40)), 2), lambda n: [0, 17, n],
              dtypes=(torch.float16, torch.bfloat16, torch.float32), layout=INTO_OUT),
]
