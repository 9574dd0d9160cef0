"""Comparison of a backend's output with the float64 reference, under the spec's tolerance."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import backward_from_output, reference
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


def compare_backward(dx: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, spec: SoftmaxSpec,
                     device: str | torch.device = "cpu") -> Comparison:
    """Check an input gradient `dx` of softmax (log_softmax with `spec.log`) against the float64
    gradient from the forward output `y` it was computed from and the output gradient `dy`.

    `expected` = y * (dy - sum(y * dy)) (log: dy - exp(y) * sum(dy)) in float64 from the given
    `y`. The bound is not relative to |dx|: dx is a difference of products that cancels where
    dy_i ~ sum(y * dy), so a correct kernel's error there is far above rtol * |dx_i|. It is the
    spec's (atol, rtol) applied to each element's sensitivity to a perturbation of the output
    itself, |δy_j| <= rtol * y_j (the forward's allowed error, y rounded to its dtype, or a
    backend that recomputes y in another precision):
        softmax:      |err_i| <= atol + rtol * y_i * (|dy_i| + 2 * sum_j y_j |dy_j|)
        log_softmax:  |err_i| <= atol + rtol * (|dy_i| + p_i * |sum_j dy_j| * (1 + |y_i|)),  p = exp(y)
    (a perturbation rtol * y_j moves sum(y * dy) by rtol * sum |y_j dy_j|, and dx_i by that
    times y_i plus rtol * y_i * |dy_i|; for log_softmax, y = log p carries rtol * |y|, so
    exp(y) carries rtol * |y| relative). Both scales bound |dx_i| itself, so the rounding of
    dx to its dtype and a float32 row sum are covered too. Row sums of |y * dy| rather than a
    row-wide bound keep it strict: the error allowed at an element is proportional to y_i, so a
    gradient a few roundings off at a large output still fails. `device` is where the float64
    reference is evaluated. `max_rel_err` is the worst error over its bound (<= 1 passes).
    """
    early = check_form(dx, spec.shape, spec.in_dtype, "gradient ")
    if early is not None:
        return early
    dim = spec.dim if len(spec.shape) else 0
    y64 = y.detach().to(device).to(torch.float64)
    g = dy.detach().to(device).to(torch.float64)
    got = dx.detach().to(device).to(torch.float64)
    if not torch.isfinite(got).all():
        return Comparison(False, float("inf"), float("inf"), "non-finite values in the gradient")
    expected = backward_from_output(y64, g, dim, spec.log)
    if spec.log:
        p = y64.exp()
        scale = g.abs() + p * g.sum(dim, keepdim=True).abs() * (1 + y64.abs())
    else:
        scale = y64.abs() * (g.abs() + 2 * (y64.abs() * g.abs()).sum(dim, keepdim=True))
    tol = spec.tolerance
    diff = (got - expected).abs()
    ratio = diff / (tol.atol + tol.rtol * scale)
    max_abs, max_rel = diff.max().item(), ratio.max().item()
    if max_rel <= 1.0:
        return Comparison(True, max_abs, max_rel)
    worst = ratio.argmax()
    got_w, exp_w = got.flatten()[worst].item(), expected.flatten()[worst].item()
    return Comparison(False, max_abs, max_rel, f"gradient error {max_abs:.3g} exceeds the tolerance by "
                                               f"{max_rel:.3g}x (worst: got {got_w:.8g}, expected {exp_w:.8g})")
