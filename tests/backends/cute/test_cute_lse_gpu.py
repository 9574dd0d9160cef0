"""logsumexp on the `cute` backend (the forward kernels' states form, `kernels.states_entry`) on
an sm_90+ NVIDIA GPU: rows of 4K to 1M elements on every plan kind (one CTA, clusters of 2-16,
tiles streamed), float32 / bfloat16 / float16, plain and with scale, softcap and sinks; special
values across CTAs; strided, unaligned, expanded and transposed inputs (dim not last); the
refused requests (masks, causal, a strided reduced dim) raising with their reason; the kit's
logsumexp cases. Every result goes through the kit's `check_logsumexp`: fresh random data (the
session's `gen`), allocations poisoned with NaN, keepdim and flat results, the input unchanged,
and the float64 reference (`core.lse_merge`) within `testing.compare`'s tolerances.

Skips with the backend's own reason where it is unavailable (no GPU, no sm_90, no DSL).
"""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax
from anysoftmax.backends.cute import plan as cute_plan
from anysoftmax.testing.cases import offset_with_dead_head, randn, with_specials
from anysoftmax.testing.checks import check_logsumexp

pytestmark = pytest.mark.gpu

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def _needs_cute():
    reason = anysoftmax.core.registry.unavailable_reason("cute")
    if reason is not None:
        pytest.skip(f"cute backend unavailable: {reason}")


def _lse(x: torch.Tensor, dim: int = -1, **fused) -> torch.Tensor:
    """cute's logsumexp of `x`, checked by the kit (it must be served), keepdim."""
    refusal = check_logsumexp(x, dim, backend="cute", fused=fused)
    assert refusal is None, refusal
    return anysoftmax.logsumexp(x, dim, keepdim=True, backend="cute", **fused)


def _ids(value) -> str:
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)


# Rows that land on each plan kind with the default table: one CTA, clusters of 2, 4, 8, 16,
# streamed tiles (1M and 786440; fp32 in 512-thread CTAs), odd lengths (narrower vectors), many rows.
# float16 takes bfloat16's plans: a few of them (each dtype is a compile).
LONG_SHAPES = [(7, 4096), (5, 24576), (4, 65536), (3, 131072), (2, 262144), (2, 1048576), (3, 100000),
               (2, 65538), (2, 65537), (1, 3 * 262144 + 8), (300, 8192)]
LONG = [(s, d) for s in LONG_SHAPES for d in DTYPES[:2]] + \
    [(s, torch.float16) for s in ((7, 4096), (3, 131072), (2, 1048576), (2, 65538))]


@pytest.mark.parametrize("shape,dtype", LONG, ids=[f"{_ids(s)}-{d}" for s, d in LONG])
def test_long_rows(shape, dtype, gen):
    _lse((torch.randn(shape, generator=gen) * 3).to(dtype).cuda())


FUSED_SHAPES = [(9, 781), (3, 131072), (2, 1048576)]
FUSED = [dict(scale=0.125), dict(softcap=30.0), dict(scale=-0.7, softcap=15.0), dict(scale=0.5, sinks=True)]
FUSED_CASES = [(s, f, d) for s in FUSED_SHAPES for f in FUSED for d in DTYPES[:2]] + \
    [((3, 131072), f, torch.float16) for f in FUSED]


@pytest.mark.parametrize("shape,fused,dtype", FUSED_CASES, ids=[f"{_ids(s)}-{_ids(f)}-{d}" for s, f, d in FUSED_CASES])
def test_fused_rows(shape, fused, dtype, gen):
    """Logits over the softcap's non-linear range; sinks one a row, near the rows' lse."""
    x = (torch.randn(shape, generator=gen) * 20).to(dtype).cuda()
    if fused.get("sinks"):
        fused = dict(fused, sinks=(torch.randn(shape[0], 1, generator=gen) * 4 + math.log(shape[1])).cuda())
    _lse(x, **fused)


def _specials(n: int, gen, dtype) -> torch.Tensor:
    """`with_specials` rows (NaN; +inf; all -inf; half -inf) and: a -inf head over more than
    half the cluster, far-from-zero values after a dead head, +inf with a NaN, +inf among
    -inf, one finite value among -inf, rows of 1e30 (no overflow of the sum)."""
    x = with_specials((11, n))(gen, torch.float32)
    x[5, : n // 2 + 3] = -math.inf
    x[6] = offset_with_dead_head((1, n), dead=n - 5)(gen, torch.float32)[0]
    x[7, 1], x[7, n - 2] = math.inf, math.nan
    x[8, :] = -math.inf
    x[8, n // 3] = math.inf
    x[9, :] = -math.inf
    x[9, n - 1] = -1e30
    x[10, :] = 1e30
    return x.to(dtype).cuda()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [4096, 131072, 1048576])
def test_special_values(n, dtype, gen):
    lse = _lse(_specials(n, gen, dtype))[:, 0].cpu()
    assert torch.isnan(lse[[0, 7]]).all() and torch.isposinf(lse[[1, 8]]).all() and torch.isneginf(lse[2])
    assert torch.isfinite(lse[[3, 4, 5, 6, 9, 10]]).all()


@pytest.mark.parametrize("fused", [dict(scale=-2.0), dict(softcap=5.0), dict(scale=0.5, softcap=5.0),
                                   dict(sinks=True)], ids=_ids)
@pytest.mark.parametrize("n", [4096, 1048576])
def test_fused_special_values(n, fused, gen):
    """Specials through the prologue (scale < 0 turns -inf into +inf, softcap maps +-inf to
    +-cap) and sinks (a row with nothing kept is its sink; NaN stays NaN)."""
    x = _specials(n, gen, torch.float32)
    if fused.get("sinks"):
        fused = dict(sinks=torch.randn(11, 1, generator=gen).cuda())
    lse = _lse(x, **fused)[:, 0]
    if "sinks" in fused:
        assert torch.equal(lse[2], fused["sinks"][2, 0]) and torch.isnan(lse[0])


def test_layouts(gen):
    """Rows as the kernels read them in place: strided, unaligned (narrower vectors), expanded
    (row stride 0), the reduced dim contiguous but not last (transposed), a 1-D input, and a
    4-D input with sinks broadcast over batch and queries."""
    wide = randn((6, 70000))(gen, torch.float32).cuda()
    _lse(wide[:, 1000:66536])  # row stride 70000, pointer 4000 bytes in
    _lse(wide[:, 3:65539])  # 12 bytes in: vectors of one
    _lse(randn((1, 65536))(gen, torch.bfloat16).cuda().expand(5, 65536))
    _lse(randn((6, 65536))(gen, torch.float16).cuda().t(), 0)  # dim 0, contiguous
    _lse(randn((2, 3, 8192))(gen, torch.bfloat16).cuda().permute(0, 2, 1), 1)  # dim 1 contiguous, rows 8192 apart
    _lse(randn((131072,))(gen, torch.float32).cuda(), 0)
    x = randn((2, 3, 5, 8192))(gen, torch.bfloat16).cuda()
    _lse(x, -1, scale=0.3, sinks=torch.randn(3, 1, 1, generator=gen).cuda())


@pytest.mark.parametrize("request_,match", [
    (lambda x: dict(mask=torch.zeros(x.shape, dtype=torch.bool, device=x.device)), "takes scale, softcap and sinks"),
    (lambda x: dict(causal=True), "takes scale, softcap and sinks"),
    (lambda x: dict(dim=0), r"reduced dim 0 .* is strided"),
], ids=["mask", "causal", "dim0-strided"])
def test_refusals(request_, match, gen):
    """What cute does not serve raises UnsupportedRequestError naming it (the kit checks the
    raise), with the declared reason."""
    x = randn((64, 4096))(gen, torch.float32).cuda()
    fused = request_(x)
    dim = fused.pop("dim", -1)
    refusal = check_logsumexp(x, dim, backend="cute", fused=fused)
    assert refusal is not None and __import__("re").search(match, refusal), refusal


# Tables that send moderate rows down the other plans: streamed tiles over small clusters,
# clusters of 16 with few vectors a thread.
PATH_TABLES = {
    "streamed-c2": dict(clusters=[1, 2], elems_scale=0.125),
    "streamed-c1": dict(clusters=[1], elems_scale=0.25),
    "cluster16-thin": dict(clusters=[16], elems_scale=0.0625, threads=128),
}


@pytest.mark.parametrize("table", list(PATH_TABLES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_paths_by_table(table, dtype, gen):
    x = _specials(20000, gen, dtype)
    with cute_plan.overrides(**PATH_TABLES[table]):
        _lse(x)
        _lse(x, softcap=4.0)


def test_one_kernel_per_shape_class(gen):
    """Row counts are run-time arguments: they never add a compiled kernel."""
    from anysoftmax.backends.cute import compiler

    before = compiler.compiled_count()
    for rows in (3, 17, 200):
        _lse(randn((rows, 65536))(gen, torch.float32).cuda())
    assert compiler.compiled_count() - before <= 1


def test_kit_logsumexp_cases(seed):
    """The conformance kit's logsumexp cases (`anysoftmax.testing.kit`) on cute: served ones
    against the reference, the rest raising their declared reason."""
    from anysoftmax.testing.kit import conformance_checks, run_checks

    checks = [c for c in conformance_checks("cute", device="cuda") if c.kind == "logsumexp"]
    report = run_checks(checks, "cute", "cuda", seed)
    assert report.ok and report.computed, report.text()
