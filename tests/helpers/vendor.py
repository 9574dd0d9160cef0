"""The vendors' documented softmax semantics restated in plain torch (float64), for the compat
tests (apex/Megatron-LM, torch_npu), and the closeness check those tests share."""

from __future__ import annotations

import torch

from anysoftmax.core.spec import TOLERANCES

FILL = -10000.0  # apex's and torch_npu's value for masked positions


def fill_softmax(x: torch.Tensor, mask: torch.Tensor | None, scale: float, apex_zero_rows: bool) -> torch.Tensor:
    """softmax(scale * x with masked positions set to -10000) over the last dim, in float64.
    `apex_zero_rows`: apex's kernel then writes 0 on rows whose max is exactly -10000 (its
    test for "fully masked"); torch_npu does not (such a row is uniform)."""
    z = x.to(torch.float64) * scale
    if mask is not None:
        z = z.masked_fill(mask, FILL)
    y = z.softmax(-1)
    if apex_zero_rows:
        y = y.masked_fill(z.amax(-1, keepdim=True) == FILL, 0.0)
    return y


def causal_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax over keys j <= i of scale * x (exact zeros above the diagonal), in float64."""
    sq, sk = x.shape[-2:]
    above = torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(1)
    return (x.to(torch.float64) * scale).masked_fill(above, float("-inf")).softmax(-1)


def assert_close_to(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, z: torch.Tensor, what: str) -> None:
    """|out - expected| <= atol + rtol |expected| (the project's tolerance for `dtype`) plus the
    rounding of z = scale * x in the float32 accumulation: relative 8 eps (|z_j| + max_row |z|)
    (a logit of -2e4 carries ~1e-3 of absolute rounding into exp)."""
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {dtype}"
    assert out.shape == expected.shape, f"{what}: shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    tol = TOLERANCES[dtype]
    acc_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    absz = z.to(torch.float64).abs()
    absz = torch.where(torch.isfinite(absz), absz, torch.zeros_like(absz))
    allowance = 8 * acc_eps * (absz + absz.amax(-1, keepdim=True))
    bound = tol.atol + (tol.rtol + allowance) * expected.abs()
    err = (out.to(torch.float64) - expected).abs()
    bad = ~(err <= bound)  # NaN (a poisoned, unwritten output) fails too
    assert not bad.any(), (f"{what}: {int(bad.sum())} elements off, e.g. at {bad.nonzero()[0].tolist()}: "
                           f"{out[tuple(bad.nonzero()[0])].item()} vs {expected[tuple(bad.nonzero()[0])].item()}")
