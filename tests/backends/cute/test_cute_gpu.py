"""Conformance of the `cute` backend on an sm_90+ NVIDIA GPU: the shared cases (anysoftmax/testing/cases.py)
through the public API (a case the backend refuses must raise UnsupportedRequestError naming it),
long rows on every kernel path (one CTA, clusters of 2-16, two passes), special values across
CTA boundaries, unaligned and strided rows, the backward kernels, and the fused prologue
(scale, softcap) forward and backward. Every result is checked
with `anysoftmax.testing.compare` / `compare_backward` against the float64 reference, on fresh random
data (the session's `gen`) into outputs poisoned with NaN.

Skips with the backend's own reason where it is unavailable (no GPU, no sm_90, no DSL).
"""

from __future__ import annotations

import pytest
import torch
from anysoftmax.testing.cases import (CASES, LONG_ROW_CASES, VARIANT_CASES, offset_with_dead_head, randn,
                                      with_specials)
from helpers import check, check_variant, params

import anysoftmax
from anysoftmax.backends.cute import plan as cute_plan
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare, compare_backward

pytestmark = pytest.mark.gpu

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LOGS = pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])


@pytest.fixture(autouse=True)
def _needs_cute():
    reason = anysoftmax.core.registry.unavailable_reason("cute")
    if reason is not None:
        pytest.skip(f"cute backend unavailable: {reason}")


def _check_rows(x: torch.Tensor, log: bool, dim: int = -1) -> None:
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    out = fn(x, dim, backend="cute")
    result = compare(out, x, SoftmaxSpec.from_tensor(x, dim, log=log), device="cuda")
    assert result.ok, f"cute {list(x.shape)} {x.dtype} log={log}: {result.detail}"


def _check_backward(x: torch.Tensor, log: bool, gen: torch.Generator, dim: int = -1) -> None:
    """dx from y = softmax(x) (computed by torch, exact enough) and a random dy."""
    y = (torch.log_softmax if log else torch.softmax)(x.double(), dim).to(x.dtype)
    dy = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device, x.dtype)
    dx = anysoftmax.softmax_backward(y, dy, dim, log=log, backend="cute")
    result = compare_backward(dx, y, dy, SoftmaxSpec.from_tensor(y, dim, log=log), device="cuda")
    assert result.ok, f"cute backward {list(x.shape)} dim {dim} {x.dtype} log={log}: {result.detail}"


@LOGS
@pytest.mark.parametrize("case,dtype", params(CASES + LONG_ROW_CASES))
def test_shared_cases(case, dtype, log, gen):
    check(case.make(gen, dtype).cuda(), case.dim, backend="cute", log=log, dtype=case.out_dtype)


# Row lengths that land on each kernel kind with the default table (fp32 / bf16 forward):
# one CTA, clusters of 2, 4, 8 and 16, and two passes; odd lengths take narrower vectors.
LONG_SHAPES = [(7, 8192), (5, 24576), (4, 65536), (3, 131072), (2, 262144), (2, 1048576), (16, 131072),
               (3, 100000), (2, 65538), (2, 65537), (1, 3 * 262144 + 8)]


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", LONG_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_long_rows(shape, dtype, log, gen):
    _check_rows((torch.randn(shape, generator=gen) * 3).to(dtype).cuda(), log)


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 65536), (2, 1048576), (3, 100000)], ids=lambda s: "x".join(map(str, s)))
def test_long_rows_backward(shape, dtype, log, gen):
    _check_backward((torch.randn(shape, generator=gen) * 3).to(dtype).cuda(), log, gen)


@LOGS
@pytest.mark.parametrize("n", [131072, 1048576])
def test_special_values_across_ctas(n, log, gen):
    """NaN / +inf / all -inf rows, and -inf prefixes longer than a CTA's share (threads and
    whole CTAs holding only -inf) next to finite values far from zero."""
    x = with_specials((8, n))(gen, torch.float32)
    x[5, : n // 2 + 3] = float("-inf")  # more than half the cluster sees only -inf
    x[6] = offset_with_dead_head((1, n), dead=n - 5)(gen, torch.float32)[0]
    x[7, :] = float("-inf")
    x[7, n - 1] = -1e30
    _check_rows(x.cuda(), log)


@LOGS
def test_strided_and_expanded_rows(log, gen):
    wide = randn((6, 70000))(gen, torch.float32).cuda()
    _check_rows(wide[:, 1000:66536], log)  # row stride 70000, pointer offset 4000 bytes
    _check_rows(wide[:, 3:65539], log)  # an unaligned start: narrower vectors
    _check_rows(randn((1, 65536))(gen, torch.bfloat16).cuda().expand(5, 65536), log)  # row stride 0


@LOGS
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_widening_dtype(dtype, log, gen):
    x = randn((3, 131072))(gen, dtype).cuda()
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    out = fn(x, -1, dtype=torch.float32, backend="cute")
    result = compare(out, x, SoftmaxSpec.from_tensor(x, -1, torch.float32, log=log), device="cuda")
    assert result.ok, result.detail


# Tables that send moderate rows down the other paths: two passes over small clusters and
# clusters of every size with few vectors a thread.
PATH_TABLES = {
    "two-pass-c2": dict(clusters=[1, 2], elems_scale=0.125),
    "two-pass-c1": dict(clusters=[1], elems_scale=0.25),
    "cluster16-thin": dict(clusters=[16], elems_scale=0.0625, threads=128),
    # Tiles held in shared memory between the passes: some (the rest re-read), and all of them
    # in CTAs of 512 threads.
    "staged-some": dict(clusters=[1, 2], elems_scale=0.125, long_row_threads=256, stage_bytes=16384),
    "staged-512": dict(clusters=[1, 2], elems_scale=0.125, long_row_threads=512),
}


@LOGS
@pytest.mark.parametrize("table", list(PATH_TABLES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_paths_by_table(table, dtype, log, gen):
    x = with_specials((6, 20000))(gen, torch.float32).to(dtype).cuda()
    with cute_plan.overrides(**PATH_TABLES[table]):
        _check_rows(x, log)
        _check_backward(randn((5, 20000))(gen, dtype).cuda(), log, gen)


def test_one_kernel_per_shape_class(gen):
    """Row counts and lengths are run-time arguments: rows of 65536 and 60000 share a plan
    (cluster 4, 15-16 vectors a thread) only if the vectors agree; row counts never add one."""
    from anysoftmax.backends.cute import compiler

    before = compiler.compiled_count()
    for rows in (3, 17, 1000):
        _check_rows(randn((rows, 65536))(gen, torch.float32).cuda(), False)
    assert compiler.compiled_count() - before <= 1


# ---------------------------------------------------------------- the column kernels (strided dims)

# (shape, dim): the benchmark's dim-0 shapes, every strip width (128/64/32 bytes; forward and
# backward must both fit: 16384 rows need 32-byte strips for the fp32 backward), one CTA and a
# cluster of 2, an odd inner count (vectors of one), a strip wider than the columns there are,
# a reduced dim between others.
COLUMN_CASES = [((8192, 8192), 0), ((16384, 1024), 0), ((16384, 64), 0), ((300, 96), 0), ((1000, 33), 0),
                ((3000, 20), 0), ((4, 300, 96), 1), ((2, 2000, 3, 40), 1)]


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,dim", COLUMN_CASES, ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else f"dim{c}")
def test_columns(shape, dim, dtype, log, gen):
    _check_rows((torch.randn(shape, generator=gen) * 3).to(dtype).cuda(), log, dim)


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,dim", [((8192, 1024), 0), ((4, 300, 96), 1), ((1000, 33), 0)],
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else f"dim{c}")
def test_columns_backward(shape, dim, dtype, log, gen):
    _check_backward((torch.randn(shape, generator=gen) * 3).to(dtype).cuda(), log, gen, dim)


@LOGS
def test_columns_special_values_and_strides(log, gen):
    """Special values in columns split over a cluster (NaN, +inf, a column of -inf, a -inf head
    longer than a CTA's share), and inputs whose columns are strided views of a wider tensor."""
    n = 8192
    x = with_specials((16, n))(gen, torch.float32)
    x[5, : n // 2 + 3] = float("-inf")
    x[7, :] = float("-inf")
    x[7, n - 1] = -1e30
    _check_rows(x.t().contiguous().cuda(), log, 0)
    wide = randn((5000, 300))(gen, torch.float32).cuda()
    _check_rows(wide[:, 8:264], log, 0)  # reduced stride 300, pointer 32 bytes in
    _check_rows(wide[:, 3:261], log, 0)  # 12 bytes in: vectors of one
    _check_rows(wide[::2, :256], log, 0)  # reduced stride 600


# ---------------------------------------------------------------- the fused prologue (scale, softcap)

@LOGS
@pytest.mark.parametrize("case,dtype", params(VARIANT_CASES))
def test_variant_cases(case, dtype, log, gen):
    """The shared fused-family cases: those with only scale and softcap over the last dim run
    (forward and gradients); the rest must be refused with the reason, through the API."""
    x = case.make(gen, dtype).cuda()
    kwargs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.kwargs(gen, x).items()}
    refusal = check_variant(x, case.dim, kwargs, backend="cute", log=log)
    prologue_only = set(kwargs) <= {"scale", "softcap"} and case.dim in (-1, x.dim() - 1) \
        and not isinstance(kwargs.get("scale"), torch.Tensor)  # (a tensor scale: refused, no `row_scale`)
    if dtype == torch.float64:
        assert refusal is not None
    elif prologue_only:
        assert refusal is None, refusal
    else:
        assert refusal is not None and ("fuses scale and softcap only" in refusal or "row kernels only" in refusal
                                        or "row_scale = True" in refusal)


# (rows, n) on each kernel kind of the fused plans: one CTA, clusters, two passes, odd lengths.
FUSED_SHAPES = [(9, 781), (4, 65536), (3, 131072), (2, 262144), (2, 1048576), (3, 100000)]
FUSED_KWARGS = [dict(scale=0.125), dict(softcap=30.0), dict(scale=-0.7, softcap=15.0)]


@LOGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", FUSED_KWARGS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_long_rows(shape, fused, dtype, log, gen):
    """Forward and gradients (x, through autograd) of the fused prologue on long rows, logits
    spread over the softcap's non-linear range."""
    x = (torch.randn(shape, generator=gen) * 20).to(dtype).cuda()
    assert check_variant(x, -1, fused, backend="cute", log=log) is None


@LOGS
@pytest.mark.parametrize("n", [781, 131072, 1048576])
def test_fused_special_values(n, log, gen):
    """NaN, +-inf and all -inf rows through scale < 0 and softcap: the -inf padding of a
    thread's last vectors must stay outside the row after the prologue (scale < 0 would turn it
    into +inf, softcap into -cap)."""
    x = with_specials((6, n))(gen, torch.float32)
    x[5, : n // 2 + 3] = float("-inf")
    for fused in (dict(scale=-2.0), dict(softcap=5.0), dict(scale=0.5, softcap=5.0)):
        assert check_variant(x.cuda(), -1, fused, backend="cute", log=log, backward=False) is None
