"""The single reference every backend is checked against (docs/semantics.md): torch in float64, on the CPU. Its
fused formulas also serve the `torch` backend and the default backward, in the accumulation dtype: one formula,
so the reference and the fallback cannot drift apart."""

from __future__ import annotations

import math

import torch

from .spec import SoftmaxSpec
from .variant import MASK_ADDITIVE, Variant, keep_mask, row_shape


def reference(x: torch.Tensor, spec: SoftmaxSpec, device: str | torch.device = "cpu", mask: torch.Tensor | None = None,
              sinks: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Exact-as-possible result of `spec` on `x`, as a float64 tensor on `device`. The input is
    first converted to the output dtype (torch's `dtype=`: this rounds when it narrows). A fused
    spec needs its operands: `mask` and `sinks` as given to the call, and a row scale's `scale`."""
    x64 = x.detach().to(device).to(spec.out_dtype).to(torch.float64)
    if spec.is_plain:
        op = torch.log_softmax if spec.log else torch.softmax
        return op(x64, spec.dim if x64.dim() else 0)
    mask = None if mask is None else mask.detach().to(device)
    sinks = None if sinks is None else sinks.detach().to(device)
    return fused_forward(x64, with_row_scale(spec.variant, scale), spec.dim, spec.log, mask, sinks, torch.float64)[0]


def with_row_scale(variant: Variant, scale: torch.Tensor | None) -> Variant:
    """`variant` carrying a row scale's values (`scale`, detached) for the formulas (refused without
    them: the formulas would silently skip the scale); the variant itself without a row scale."""
    if variant.row_scale is None or isinstance(variant.scale, torch.Tensor):
        return variant
    if not isinstance(scale, torch.Tensor):
        raise ValueError("reference: a request with a row scale needs its `scale` tensor")
    return variant.with_values(scale.detach(), variant.softcap)


def prologue(x: torch.Tensor, variant: Variant, mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Steps 1-3a of the family in `dtype`: z = scale*x, softcap, plus a floating mask."""
    if variant.row_scale is not None and not isinstance(variant.scale, torch.Tensor):
        raise ValueError("a row-scale variant without its values: see `with_row_scale`")
    z = scaled_and_capped(x.to(dtype), variant.scale, variant.softcap)
    return z + mask.to(dtype) if variant.mask_kind == MASK_ADDITIVE else z


def scaled_and_capped(z: torch.Tensor, scale, softcap) -> torch.Tensor:
    """Steps 1-2 of the family: softcap * tanh(scale * z / softcap), a step skipped where None."""
    if scale is not None:
        z = z * as_factor(scale, z)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return z


def as_factor(scale, like: torch.Tensor):
    """`scale` ready to multiply `like`: a number as it is, a row scale in `like`'s dtype and device."""
    return scale.to(like.device, like.dtype) if isinstance(scale, torch.Tensor) else scale


def kept_values(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """`x` with 0 where `keep` (None: everywhere kept) excludes a position: a derivative read there
    would multiply its 0 by the prologue's factor at that value (0 * (1 - tanh(NaN)^2) is NaN)."""
    return x if keep is None else x.masked_fill(~keep, 0)


def prologue_chain(dz: torch.Tensor, x: torch.Tensor, scale: float | None, softcap: float | None,
                   keep: torch.Tensor | None) -> torch.Tensor:
    """The gradient (or tangent) of x from that of the logits after softcap, `dz`: times softcap's
    1 - tanh(scale * x / softcap)^2, recomputed from kept values of x only (`kept_values`), and scale."""
    du = capped_chain(dz, x, scale, softcap, keep)
    return du if scale is None else du * as_factor(scale, du)


def capped_chain(dz: torch.Tensor, x: torch.Tensor, scale, softcap: float | None,
                 keep: torch.Tensor | None) -> torch.Tensor:
    """The gradient of u = scale * x from `dz`: times softcap's 1 - tanh(u / softcap)^2 (from kept x)."""
    if softcap is None:
        return dz
    t = torch.tanh(kept_values(x, keep).to(dz.dtype) * (1.0 if scale is None else as_factor(scale, dz)) / softcap)
    return dz * (1 - t * t)


def row_scale_gradient(dz: torch.Tensor, x: torch.Tensor, variant: Variant, dim: int,
                       keep: torch.Tensor | None) -> torch.Tensor:
    """A row scale's gradient per row: sum_j x_j du_j, du the gradient of u = scale * x
    (`capped_chain` of `dz`). Only kept positions enter (`dz` is 0 elsewhere, x read there as 0)."""
    du = capped_chain(dz, x, variant.scale, variant.softcap, keep)
    return (kept_values(x, keep).to(du.dtype) * du).sum(dim, keepdim=True)


def empty_row_value(policy: str, n: int, log: bool) -> float:
    """What an empty row's elements are under `policy` (core.variant: zero / nan / uniform)."""
    if policy == "nan":
        return math.nan
    if policy == "uniform":
        return -math.log(n) if log else 1.0 / n
    return -math.inf if log else 0.0


def fused_forward(x: torch.Tensor, variant: Variant, dim: int, log: bool, mask: torch.Tensor | None,
                  sinks: torch.Tensor | None, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, each row's sink share or None) of the fused family in `dtype`; differentiable in x, sinks, mask."""
    keep = keep_mask(tuple(x.shape), variant, mask, x.device)
    z = prologue(kept_values(x, keep), variant, mask, dtype)
    empty = None
    if keep is not None:
        z = z.masked_fill(~keep, -math.inf)
        empty = ~keep.any(dim, keepdim=True)
        # Empty rows get their policy's constant below; a finite z keeps their (unused) gradient finite.
        z = z.masked_fill(empty, 0.0)
    m = z.detach().amax(dim, keepdim=True)
    s = None
    if sinks is not None:
        s = sinks.to(dtype).expand(row_shape(tuple(z.shape), dim))
        m = torch.maximum(m, s.detach())
    # A row max of -inf (nothing but -inf) is replaced by 0 when subtracted: exp(-inf - 0) = 0,
    # so an all -inf row ends as 0/0 = NaN, as torch gives it (the kernels do the same).
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    e = torch.exp(z - m)
    total = e.sum(dim, keepdim=True)
    p_sink = None
    if s is not None:
        es = torch.exp(s - m)
        total = total + es
        p_sink = es / total
    y = (z - m) - torch.log(total) if log else e / total
    if empty is not None and bool(empty.any()):
        # A 0-dim input is one row of one element.
        value = empty_row_value(variant.empty_rows, z.shape[dim] if z.dim() else 1, log)
        y = torch.where(empty, torch.full((), value, dtype=y.dtype, device=y.device), y)
        if p_sink is not None:
            p_sink = torch.where(empty, torch.zeros_like(p_sink), p_sink)
    return y, p_sink


def fused_backward(grad: torch.Tensor, y: torch.Tensor, x: torch.Tensor | None, variant: Variant, dim: int,
                   log: bool, mask: torch.Tensor | None, p_sink: torch.Tensor | None, dtype: torch.dtype,
                   want_dz: bool = False):
    """Gradients of the fused family from its output `y`, evaluated in `dtype`: (dx, ds, dz), ds the
    per-row sink gradient -p_sink * sum(y * grad) (log: -p_sink * sum(grad)) or None without
    `p_sink`, dz (the logits' gradient after softcap: a floating mask's) when `want_dz`. `x` is read
    with softcap only. Excluded positions and empty rows get 0, whatever x holds there."""
    g = grad.to(dtype)
    yy = y.to(dtype)
    keep = keep_mask(tuple(y.shape), variant, mask, g.device)
    empty = None
    if keep is not None:
        g = g.masked_fill(~keep, 0.0)  # excluded outputs are constants: their gradient goes nowhere
        empty = ~keep.any(dim, keepdim=True)
    total = (g if log else yy * g).sum(dim, keepdim=True)
    dz = g - yy.exp() * total if log else yy * (g - total)
    ds = None if p_sink is None else -p_sink.to(dtype) * total
    if keep is not None:
        dz = dz.masked_fill(~keep | empty, 0.0)
        if ds is not None:
            ds = ds.masked_fill(empty, 0.0)
    return prologue_chain(dz, x, variant.scale, variant.softcap, keep), ds, dz if want_dz else None


def backward_from_output(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool = False,
                         dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The input gradient of softmax (log_softmax with `log`) from its output `y` and the output
    gradient `dy`, evaluated in `dtype`: y * (dy - sum(y * dy)), or dy - exp(y) * sum(dy)."""
    y, dy = y.to(dtype), dy.to(dtype)
    if log:
        return dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    return y * (dy - (y * dy).sum(dim, keepdim=True))
