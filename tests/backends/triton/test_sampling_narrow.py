"""`_narrow`, the threshold search of the sampler's scan and select (`sampling_kernels.py`): on
a block of values, a t with need <= count(>= t) <= CAP, or, where ties at one value forbid
it, that value (count(>= t) > CAP and count(> t) < need) — on random blocks, blocks of few
distinct values and blocks with ties straddling the window, through the interpreter."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from anysoftmax.backends._triton_common import sampling_kernels
from helpers import runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

G, C = 8, 64


@triton.jit
def _narrow_kernel(z_ptr, out_ptr, need, lo, hi, G: tl.constexpr, C: tl.constexpr, CAP: tl.constexpr):
    offs = tl.arange(0, G)[:, None] * C + tl.arange(0, C)[None, :]
    z = tl.load(z_ptr + offs)
    t, n = sampling_kernels._narrow(z, z > float("-inf"), need, lo, hi, CAP)
    tl.store(out_ptr, t)
    tl.store(out_ptr + 1, n.to(tl.float32))


def _narrow(z: torch.Tensor, need: int, cap: int) -> tuple[float, int]:
    fin = z[z > float("-inf")]
    out = torch.full((2,), float("nan"))
    _narrow_kernel[(1,)](z, out, need, float(fin.min()), float(fin.max()), G=G, C=C, CAP=cap)
    return float(out[0]), int(out[1])


def _blocks(gen):
    yield torch.randn(G, C, generator=gen)
    yield torch.randint(0, 6, (G, C), generator=gen).float()  # few distinct values: ties everywhere
    z = torch.randn(G, C, generator=gen)
    z[z < -1.0] = float("-inf")
    yield z
    z = torch.randn(G, C, generator=gen) * 1e-6 + 3.0  # a narrow band: many steps, adjacent floats
    yield z
    z = torch.full((G, C), 1.0)
    z.view(-1)[:5] = 2.0  # 5 above a tie of 507
    yield z


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("need,cap", [(1, 8), (20, 64), (50, 128), (100, 130)])
def test_the_threshold_keeps_between_need_and_cap_or_names_the_tie(seed, need, cap):
    gen = torch.Generator().manual_seed(seed)
    for z in _blocks(gen):
        fin = z[z > float("-inf")]
        need_here = min(need, fin.numel())
        t, n = _narrow(z.contiguous(), need_here, cap)
        assert n == int((fin >= t).sum()), (t, n)
        if int((fin >= float(fin.min())).sum()) <= cap:
            assert t == float(fin.min())
        elif n <= cap:
            assert n >= need_here, (t, n, need_here)
        else:  # ties at t: nothing between need and cap exists
            assert int((fin > t).sum()) < need_here, (t, n)
            assert bool((fin == t).any())
