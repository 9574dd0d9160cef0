"""Comparison of a backend's output with the float64 reference, under the spec's tolerance."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import reference
from .spec import SoftmaxSpec


@dataclass(frozen=True)
class Comparison:
    """Outcome of one check: `ok`, the largest error seen and, when not ok, why."""

    ok: bool
    max_abs_err: float
    max_rel_err: float  # max |out - expected| / (atol + rtol * |expected|): <= 1 passes
    detail: str = ""


def check_form(out: torch.Tensor, shape: tuple, dtype: torch.dtype, what: str = "") -> Comparison | None:
    """The verdict when `out` has the wrong shape or dtype (a failure) or is empty (a pass);
    None when its values still need checking. `what` prefixes the message ("gradient ")."""
    if tuple(out.shape) != tuple(shape):
        return Comparison(False, float("inf"), float("inf"), f"{what}shape {tuple(out.shape)} != {tuple(shape)}")
    if out.dtype != dtype:
        return Comparison(False, float("inf"), float("inf"), f"{what}dtype {out.dtype} != {dtype}")
    if out.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    return None


def compare(out: torch.Tensor, x: torch.Tensor, spec: SoftmaxSpec, device: str | torch.device = "cpu") -> Comparison:
    """Check `out` (a backend's result for input `x`) against the float64 reference.

    `expected` is the reference rounded once to the output dtype, so overflow to +-inf in a
    narrow dtype (log_softmax of large fp16 inputs) is expected exactly as torch produces it.
    NaN must match NaN, infinities must match exactly, finite values within the tolerance.
    Shape and dtype are checked first. `device` is where the float64 reference is evaluated.
    """
    early = check_form(out, spec.shape, spec.out_dtype)
    if early is not None:
        return early
    tol = spec.tolerance
    expected = reference(x, spec, device).to(spec.out_dtype).to(torch.float64)
    got = out.detach().to(device).to(torch.float64)
    nan_e, nan_g = torch.isnan(expected), torch.isnan(got)
    if not torch.equal(nan_e, nan_g):
        where = tuple((nan_e != nan_g).nonzero()[0].tolist())
        return Comparison(False, float("nan"), float("inf"),
                          f"NaN mismatch at {list(where)}: got {got[where].item()}, expected {expected[where].item()}")
    inf_e = torch.isinf(expected)
    if not torch.equal(got[inf_e], expected[inf_e]) or torch.isinf(got[~inf_e]).any():
        return Comparison(False, float("inf"), float("inf"), "infinities differ from the reference")
    finite = ~(nan_e | inf_e)
    diff = (got - expected).abs()[finite]
    if diff.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    bound = tol.atol + tol.rtol * expected.abs()[finite]
    ratio = diff / bound
    max_abs, max_rel = diff.max().item(), ratio.max().item()
    if max_rel <= 1.0:
        return Comparison(True, max_abs, max_rel)
    worst = ratio.argmax()
    return Comparison(False, max_abs, max_rel,
                      f"max |err| {max_abs:.3g} exceeds atol {tol.atol:g} + rtol {tol.rtol:g}*|ref| "
                      f"(worst: got {got[finite][worst].item():.8g}, expected {expected[finite][worst].item():.8g})")
