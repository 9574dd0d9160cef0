"""Comparison of a backend's output with the float64 reference, under the spec's tolerance."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.lse_merge import logsumexp_formula, merge_formula, row_shape
from ..core.reference import (as_factor, backward_from_output, fused_backward, fused_forward, kept_values, prologue, reference,
                        row_scale_gradient)
from ..core.spec import TOLERANCES, SoftmaxSpec
from ..core.variant import keep_mask

# Roundings the fused prologue may add per unit of |z| (scale * x, the softcap's tanh, an added
# mask): a few roundings of the accumulation dtype each, with a 2x margin.
PROLOGUE_ROUNDINGS = 8


def _eps(spec: SoftmaxSpec) -> float:
    return torch.finfo(spec.acc_dtype).eps / 2  # unit roundoff of the accumulation dtype


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


def _verdict(diff: torch.Tensor, ratio: torch.Tensor, got: torch.Tensor, expected: torch.Tensor, what: str,
             bound: str = "") -> Comparison:
    """The outcome of errors `diff` with `ratio` = diff / bound (<= 1 passes), naming the worst
    element (and the bound, when `bound` words it)."""
    max_abs, max_rel = diff.max().item(), ratio.max().item()
    if max_rel <= 1.0:
        return Comparison(True, max_abs, max_rel)
    worst = ratio.argmax()
    excess = f"{what}max |err| {max_abs:.3g} exceeds {bound}" if bound else \
        f"{what} error {max_abs:.3g} exceeds the tolerance by {max_rel:.3g}x"
    return Comparison(False, max_abs, max_rel, f"{excess} (worst: got {got.flatten()[worst].item():.8g}, "
                                               f"expected {expected.flatten()[worst].item():.8g})")


def _within(got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> Comparison:
    """float64 `got` against `expected` under `bound`: NaN exactly where expected is NaN, equal
    values (infinities included) exact, the rest within the bound (a NaN bound is no bound)."""
    nan_e = torch.isnan(expected)
    if not torch.equal(torch.isnan(got), nan_e):
        return Comparison(False, float("inf"), float("inf"), f"NaN {what} values differ from the reference's")
    diff = (got - expected).abs().masked_fill(nan_e | (got == expected), 0.0)
    return _verdict(diff, diff / bound.nan_to_num(nan=float("inf")), got, expected, what)


def _prologue_allowance(x: torch.Tensor, spec: SoftmaxSpec, mask, sinks, device) -> tuple:
    """(per-element relative allowance, per-row absolute-in-z allowance) that a fused prologue
    adds: z = scale*x (softcap, + mask) is computed in the accumulation dtype, so each z_j
    carries ~|z_j| * eps of rounding that exp() turns into a relative error of the output,
    and the row's normaliser carries the p-weighted mean of those. Scale amplifies the input's
    magnitude (a temperature of 1e3 makes |z| large while z - max stays small): a fixed rtol
    cannot cover that, a bound proportional to |z| does."""
    x64 = x.detach().to(device).to(spec.out_dtype).to(torch.float64)
    z = prologue(x64, spec.variant, None if mask is None else mask.detach().to(device), torch.float64)
    keep = keep_mask(tuple(z.shape), spec.variant, None if mask is None else mask.detach().to(device), z.device)
    absz = z.abs()
    absz = torch.where(torch.isfinite(absz), absz, torch.zeros_like(absz))
    if keep is not None:
        absz = absz.masked_fill(~keep, 0.0)
    p, _ = fused_forward(x64, spec.variant, spec.dim, False, None if mask is None else mask.detach().to(device),
                         None if sinks is None else sinks.detach().to(device), torch.float64)
    p = torch.nan_to_num(p, nan=0.0)
    row = (p * absz).sum(spec.dim, keepdim=True)
    k = PROLOGUE_ROUNDINGS * _eps(spec)
    return k * absz, k * row


def compare(out: torch.Tensor, x: torch.Tensor, spec: SoftmaxSpec, device: str | torch.device = "cpu",
            mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> Comparison:
    """Check `out` (a backend's result for input `x`) against the float64 reference.

    `expected` is the reference rounded once to the output dtype, so overflow to +-inf in a
    narrow dtype (log_softmax of large fp16 inputs) is expected exactly as torch produces it.
    NaN must match NaN, infinities must match exactly, finite values within the tolerance.
    Shape and dtype are checked first. `device` is where the float64 reference is evaluated.
    A fused spec (`spec.variant`) takes its operands `mask` and `sinks`, and its bound grows
    with |z| (`_prologue_allowance`).
    """
    early = check_form(out, spec.shape, spec.out_dtype)
    if early is not None:
        return early
    expected = reference(x, spec, device, mask, sinks).to(spec.out_dtype).to(torch.float64)
    extra = None
    if not spec.is_plain:
        per_elem, per_row = _prologue_allowance(x, spec, mask, sinks, device)
        amp = (per_elem + per_row).expand(expected.shape)
        extra = amp if spec.log else amp * expected.abs()
    return compare_values(out, expected, expected.abs(), spec.tolerance, extra=extra, scale_name="|ref|")


def _sensitivity(y: torch.Tensor, g: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """Each input gradient element's sensitivity to the forward output's allowed error (float64
    y and output gradient g; `compare_backward` gives the bound): softmax |y| (|g| + 2 sum |y g|),
    log_softmax |g| + p |sum g| (1 + |y|), p = exp(y) (an output of -inf weighs 0)."""
    if log:
        return g.abs() + y.exp() * g.sum(dim, keepdim=True).abs() * (1 + y.nan_to_num(neginf=0.0).abs())
    ay = y.abs()
    return ay * (g.abs() + 2 * (ay * g.abs()).sum(dim, keepdim=True))


def _gradient_rounding(spec: SoftmaxSpec, expected: torch.Tensor) -> torch.Tensor | float:
    """The rounding of a gradient to the input's dtype when `dtype=` widened the output: the
    output's tolerance does not cover a gradient stored narrower than the output."""
    if spec.in_dtype == spec.out_dtype or not spec.in_dtype.is_floating_point:
        return 0.0
    return torch.finfo(spec.in_dtype).eps * expected.abs().nan_to_num(0.0, 0.0, 0.0)


def compare_backward(dx: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, spec: SoftmaxSpec,
                     device: str | torch.device = "cpu") -> Comparison:
    """Check an input gradient `dx` of softmax (log_softmax with `spec.log`) against the float64
    gradient y * (dy - sum(y * dy)) (log: dy - exp(y) * sum(dy)) from the forward output `y` it
    was computed from and the output gradient `dy`, evaluated on `device`. The bound is each
    element's sensitivity to the forward's own allowed error (derived in docs/semantics.md):
        softmax:      |err_i| <= atol + rtol * y_i * (|dy_i| + 2 * sum_j y_j |dy_j|)
        log_softmax:  |err_i| <= atol + rtol * (|dy_i| + p_i * |sum_j dy_j| * (1 + |y_i|)),  p = exp(y)
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
    tol = spec.tolerance
    diff = (got - expected).abs()
    bound = tol.atol + tol.rtol * _sensitivity(y64, g, dim, spec.log) + _gradient_rounding(spec, expected)
    return _verdict(diff, diff / bound, got, expected, "gradient")


def compare_fused_backward(dx: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, x: torch.Tensor, spec: SoftmaxSpec,
                           mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                           dsinks: torch.Tensor | None = None, device: str | torch.device = "cpu",
                           dscale: torch.Tensor | None = None) -> Comparison:
    """`compare_backward` for a fused spec: `dx` (and `dsinks` when the call has sinks, `dscale`
    when it has a row scale: `spec.variant` then holds its values, `core.reference.with_row_scale`) against
    `core.reference.fused_backward` in float64 from the forward output `y` the backend gave,
    the sink shares of the float64 reference and the output gradient `dy`.

    Bound per element: the plain backward's sensitivity to the output's own rounding, times the
    chain factor |scale * (1 - tanh^2)| the gradient is multiplied by, plus the rounding of
    that factor itself (1 - t^2 computed from t loses ~eps absolutely, and t carries the
    rounding of its argument scale*x/softcap). dsinks: per row rtol * p_sink * sum |y dy|
    (twice, for the sum and the share), summed over the rows sharing a sink. dscale: per row
    sum_j |x_j| times dx's bound without the scale factor, summed over the rows sharing a value."""
    early = check_form(dx, spec.shape, spec.in_dtype, "gradient ")
    if early is not None:
        return early
    dim = spec.dim
    dev = lambda t: None if t is None else t.detach().to(device)  # noqa: E731
    y64, g, got = dev(y).to(torch.float64), dev(dy).to(torch.float64), dev(dx).to(torch.float64)
    x64 = dev(x).to(spec.out_dtype).to(torch.float64)
    m, s = dev(mask), dev(sinks)
    _, p_sink = fused_forward(x64, spec.variant, dim, spec.log, m, s, torch.float64)
    expected, ds_rows, dlogits = fused_backward(g, y64, x64, spec.variant, dim, spec.log, m, p_sink, torch.float64,
                                                want_dz=dscale is not None)
    # Rows whose output is NaN (a NaN or +inf input) have NaN gradients: they must match.
    nan_e = torch.isnan(expected)
    if not torch.equal(torch.isnan(got), nan_e) or torch.isinf(got).any():
        return Comparison(False, float("inf"), float("inf"), "non-finite gradient values differ from the reference's")
    got, expected = got.masked_fill(nan_e, 0.0), expected.masked_fill(nan_e, 0.0)
    keep = keep_mask(tuple(y64.shape), spec.variant, m, y64.device)
    gk = g if keep is None else g.masked_fill(~keep, 0.0)
    yk = torch.nan_to_num(y64, nan=0.0, neginf=0.0 if not spec.log else -torch.inf)
    sens = _sensitivity(yk, gk, dim, spec.log)
    v = spec.variant
    scale = 1.0 if v.scale is None else abs(as_factor(v.scale, sens))  # (a row scale: per row)
    factor = torch.ones_like(sens) * scale
    eps = _eps(spec)
    tol = spec.tolerance
    extra = torch.zeros_like(sens)
    if v.softcap is not None:
        arg = kept_values(x64, keep) * (1.0 if v.scale is None else as_factor(v.scale, x64)) / v.softcap
        t = torch.tanh(arg)
        factor = factor * (1 - t * t)
        dz = expected.abs() / torch.clamp(factor, min=torch.finfo(torch.float64).tiny)
        extra = PROLOGUE_ROUNDINGS * eps * dz.clamp(max=1e300) * scale * (1 + arg.abs())
    diff = (got - expected).abs()
    atol = tol.atol * (scale.clamp(min=1.0) if isinstance(scale, torch.Tensor) else max(1.0, scale))
    bound = atol + tol.rtol * sens * factor + extra + _gradient_rounding(spec, expected)
    results = [_verdict(diff, diff / bound, got, expected, "gradient")]
    if s is not None and dsinks is not None:
        exp_ds = ds_rows.sum_to_size(s.shape)
        rows_bound = tol.atol + 2 * tol.rtol * p_sink * (yk * gk).abs().sum(dim, keepdim=True) if not spec.log else \
            tol.atol + 2 * tol.rtol * p_sink * gk.abs().sum(dim, keepdim=True)
        # (+ the rounding of the result to the sinks' own dtype, which a gradient takes)
        results.append(check_form(dsinks, tuple(s.shape), dsinks.dtype, "dsinks ") or _within(
            dsinks.detach().to(device).to(torch.float64), exp_ds,
            rows_bound.sum_to_size(s.shape) + torch.finfo(dsinks.dtype).eps * exp_ds.abs(), "dsinks"))
    if dscale is not None:
        results.append(_compare_row_scale_gradient(dscale, dlogits, x64, keep, bound / scale.clamp(
            min=torch.finfo(torch.float64).tiny) if isinstance(scale, torch.Tensor) else bound, spec, device))
    failed = next((r for r in results if not r.ok), None)
    return failed or Comparison(True, results[0].max_abs_err, max(r.max_rel_err for r in results))


def _compare_row_scale_gradient(dscale: torch.Tensor, dz: torch.Tensor, x64: torch.Tensor, keep, du_bound,
                                spec: SoftmaxSpec, device) -> Comparison:
    # dscale = sum_j x_j du_j per row (`row_scale_gradient`), summed to the scale's shape; its
    # bound: sum_j |x_j| times du's (dx's bound without the scale factor), plus the rounding
    # to the scale's own dtype, which its gradient takes.
    v = spec.variant
    shape = tuple(v.row_scale.shape)
    early = check_form(dscale, shape, dscale.dtype, "dscale ")
    if early is not None:
        return early
    expected = row_scale_gradient(dz, x64, v, spec.dim, keep).sum_to_size(shape)
    xa = kept_values(x64, keep).abs().nan_to_num(0.0, 0.0, 0.0)
    bound = (xa * du_bound).sum(spec.dim, keepdim=True).sum_to_size(shape) + torch.finfo(dscale.dtype).eps * expected.abs()
    return _within(dscale.detach().to(device).to(torch.float64), expected, bound, "dscale")


def compare_mask_gradient(dmask: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, x: torch.Tensor,
                          spec: SoftmaxSpec, mask: torch.Tensor, sinks: torch.Tensor | None = None,
                          device: str | torch.device = "cpu") -> Comparison:
    """Check the gradient a floating (additive) `mask` received: the gradient of the logits
    (`core.reference.fused_backward`'s dz) in float64 from the output `y` the backend gave,
    summed over the mask's broadcast dims. Bound: the plain backward's sensitivity (as in
    `compare_backward`) summed the same way, plus the rounding of the result to the mask's
    own dtype (subnormals included), which a gradient takes."""
    early = check_form(dmask, tuple(mask.shape), mask.dtype, "mask gradient ")
    if early is not None:
        return early
    dim, log = spec.dim, spec.log
    dev = lambda t: None if t is None else t.detach().to(device)  # noqa: E731
    y64, g = dev(y).to(torch.float64), dev(dy).to(torch.float64)
    x64 = dev(x).to(spec.out_dtype).to(torch.float64)
    m, s = dev(mask), dev(sinks)
    _, p = fused_forward(x64, spec.variant, dim, log, m, s, torch.float64)
    _, _, dz = fused_backward(g, y64, x64, spec.variant, dim, log, m, p, torch.float64, want_dz=True)
    want = dz.sum_to_size(tuple(mask.shape))
    scale = _sensitivity(y64 if log else y64.nan_to_num(), g, dim, log)
    tol = spec.tolerance
    fi = torch.finfo(mask.dtype)
    bound = (tol.atol + tol.rtol * scale).sum_to_size(tuple(mask.shape)) + fi.eps * want.abs() + fi.tiny * fi.eps
    return _within(dev(dmask).to(torch.float64), want, bound, "mask gradient")


# ---- the pieces ops (core.lse_merge) -------------------------------------------------------------

def compare_values(got: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor, tol, what: str = "",
                   extra: torch.Tensor | None = None, scale_name: str = "scale") -> Comparison:
    """`got` against the float64 `expected` (already rounded to got's dtype or not): NaN must
    match NaN and infinities exactly; finite values within tol.atol + tol.rtol * `scale`
    (`scale` >= |expected|: the magnitude the result's roundings are relative to), plus `extra`
    when given (an absolute allowance of expected's shape)."""
    early = check_form(got, tuple(expected.shape), got.dtype, what)
    if early is not None:
        return early
    g = got.detach().to(expected.device).to(torch.float64)
    e = expected.to(torch.float64)
    nan_e, nan_g = torch.isnan(e), torch.isnan(g)
    if not torch.equal(nan_e, nan_g):
        where = tuple((nan_e != nan_g).nonzero()[0].tolist())
        return Comparison(False, float("nan"), float("inf"),
                          f"{what}NaN mismatch at {list(where)}: got {g[where].item()}, expected {e[where].item()}")
    inf_e = torch.isinf(e)
    if not torch.equal(g[inf_e], e[inf_e]) or torch.isinf(g[~inf_e]).any():
        return Comparison(False, float("inf"), float("inf"), f"{what}infinities differ from the reference")
    finite = ~(nan_e | inf_e)
    diff = (g - e).abs()[finite]
    if diff.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    bound = tol.atol + tol.rtol * scale.to(torch.float64).expand(e.shape)[finite]
    if extra is not None:
        bound = bound + extra[finite]
    return _verdict(diff, diff / bound, g[finite], e[finite], what, f"atol {tol.atol:g} + rtol {tol.rtol:g}*{scale_name}")


def compare_logsumexp(lse: torch.Tensor, x: torch.Tensor, spec: SoftmaxSpec, mask=None, sinks=None,
                      device: str | torch.device = "cpu") -> Comparison:
    """A logsumexp result (keepdim shape, accumulation dtype) against the float64 reference.
    Bound: the accumulation dtype's (atol, rtol) relative to |lse| plus the row's largest |z|
    (lse = m + log(sum exp(z - m)): each z carries ~|z| eps of rounding from the prologue and
    the subtraction)."""

    expected = reference_logsumexp(x, spec, mask, sinks, device)
    if lse.dtype != spec.acc_dtype:
        return Comparison(False, float("inf"), float("inf"), f"dtype {lse.dtype} != {spec.acc_dtype}")
    x64 = x.detach().to(device).to(torch.float64)
    z = prologue(x64, spec.variant, None if mask is None else mask.detach().to(device), torch.float64)
    if z.dim() == 0:
        zmax = z.abs().reshape(())
    else:
        za = torch.where(torch.isfinite(z), z.abs(), torch.zeros_like(z))
        zmax = za.amax(spec.dim, keepdim=True) if za.shape[spec.dim] else torch.zeros(row_shape(tuple(z.shape), spec.dim), dtype=torch.float64)
    if sinks is not None and z.dim():
        s = sinks.detach().to(device).to(torch.float64).expand(row_shape(tuple(z.shape), spec.dim)).abs()
        zmax = torch.maximum(zmax, torch.where(torch.isfinite(s), s, torch.zeros_like(s)))
    tol = TOLERANCES[spec.acc_dtype]
    k = PROLOGUE_ROUNDINGS if not spec.is_plain else 4
    scale = expected.abs().nan_to_num(0.0, 0.0, 0.0) + k * zmax
    return compare_values(lse, expected, scale, tol)


def compare_merge(out: torch.Tensor, lse: torch.Tensor, outputs, lses, device: str | torch.device = "cpu",
                  expected: tuple | None = None, roundings: int = 2) -> Comparison:
    """merge_states' (out, lse) against the float64 merge of the same partials (or `expected`,
    float64 (out, lse): e.g. the unsplit row's softmax and logsumexp). out's bound is relative to
    sum_i p_i |out_i| (cancellation between partials) times `roundings` (the partials' own
    rounding and the merged result's); lse's to |lse| plus the largest |lse_i|."""

    ref_out, ref_lse = reference_merge(outputs, lses, device) if expected is None else expected
    o64 = [t.detach().to(device).to(torch.float64) for t in outputs]
    L = torch.stack([t.detach().to(device).to(torch.float64) for t in lses])
    live = torch.where(torch.isfinite(ref_lse), ref_lse, torch.zeros_like(ref_lse))
    p = torch.exp(L - live).nan_to_num(0.0, 0.0, 0.0)
    mag = sum(p[i].unsqueeze(-1) * o.abs().nan_to_num(0.0, 0.0, 0.0) for i, o in enumerate(o64))
    tol = TOLERANCES[out.dtype]
    c = compare_values(out, ref_out.to(out.dtype) if expected is None else ref_out,
                       roundings * (mag + ref_out.abs().nan_to_num(0.0, 0.0, 0.0)), tol, "out: ")
    if not c.ok:
        return c
    Lf = torch.where(torch.isfinite(L), L.abs(), torch.zeros_like(L)).amax(0) if L.numel() else ref_lse.abs()
    return compare_values(lse, ref_lse, ref_lse.abs().nan_to_num(0.0, 0.0, 0.0) + 4 * Lf,
                          TOLERANCES[lse.dtype], "lse: ")


def reference_logsumexp(x: torch.Tensor, spec: SoftmaxSpec, mask=None, sinks=None,
                        device: str | torch.device = "cpu") -> torch.Tensor:
    """The float64 logsumexp of `spec` on `x` (keepdim), evaluated on `device`."""
    x64 = x.detach().to(device).to(torch.float64)
    mask = None if mask is None else mask.detach().to(device)
    sinks = None if sinks is None else sinks.detach().to(device)
    return logsumexp_formula(x64, spec.variant, spec.dim, mask, sinks, torch.float64)


def reference_merge(outputs, lses, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 (out, lse) of merge_states, evaluated on `device`."""
    o64 = [t.detach().to(device).to(torch.float64) for t in outputs]
    l64 = [t.detach().to(device).to(torch.float64) for t in lses]
    return merge_formula(o64, l64, torch.float64, torch.float64, torch.float64)
