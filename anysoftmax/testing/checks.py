"""One request, one verdict: call a backend through the public API and compare with the float64
reference (`anysoftmax.testing.compare`).

Each function returns None when the request ran and matched, or the backend's declared refusal
(a string: `supports()`'s reason, or the fused-family gate for a backend without `fused = True`)
after checking that the API turned the refusal into `UnsupportedRequestError` naming the
backend. A mismatch, a crash or a refusal that was not raised is an `AssertionError` (or the
backend's own exception). Every backend call runs under `poisoned_allocations()`, and the input
must come back unmodified.
"""

from __future__ import annotations

import contextlib

import torch

from ..core import registry
from .compare import compare, compare_backward, compare_fused_backward, compare_mask_gradient
from ..core.errors import UnsupportedRequestError
from ..core.spec import TOLERANCES, SoftmaxSpec, Tolerance
from ..core.reference import with_row_scale
from ..core.variant import keep_mask
from .cases import CONTIGUOUS, INTO_OUT, STRIDED
from .poison import poisoned_allocations


def api_function(log: bool):
    import anysoftmax

    return anysoftmax.log_softmax if log else anysoftmax.softmax


FUSED_GATE = ("computes the plain softmax only (it does not declare the fused family, `fused = True`): every "
              "fused-family request is refused")


def declared_refusal(backend: str, x: torch.Tensor, dim: int, dtype=None, log: bool = False,
                     fused: dict | None = None) -> tuple[SoftmaxSpec, str | None]:
    """(the request's spec with its variant, the backend's refusal or None) for a request as the
    backend receives it: validated and converted by the API (`dispatch.prepare`)."""
    from ..dispatch import prepare

    spec, _ = SoftmaxSpec.from_request(x, dim, dtype, log=log, fused=fused or {})
    prepared = prepare(x, dim, dtype, log)[1].with_variant(spec.variant)
    chosen = registry.get_backend(backend)
    if registry.fused_refusal(chosen, prepared) is not None:
        # One reason for the whole family (the registry's message names each variant's steps),
        # and one for every tensor scale.
        return spec, registry.row_scale_refusal(chosen, prepared) if getattr(chosen, "fused", False) else FUSED_GATE
    reason = chosen.supports(prepared)
    if reason is not None and not isinstance(reason, str):
        raise AssertionError(f"{backend}.supports() returned {reason!r}: it must return None or a reason (str)")
    return spec, reason


def _expect_refusal(call, backend: str, reason: str) -> str:
    try:
        call()
    except UnsupportedRequestError as exc:
        if backend not in str(exc):
            raise AssertionError(f"the refusal does not name the backend {backend!r}: {exc}") from None
        return reason
    raise AssertionError(f"{backend} refuses this request ({reason}) but the call returned a result")


@contextlib.contextmanager
def named_failure(spec: SoftmaxSpec, what: str = ""):
    """A backend's exception, re-raised as a failure that names the request (shape, dim,
    dtypes, variant); the original stays chained to it."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"{what}{spec.describe()}: {type(exc).__name__}: {exc}") from exc


def _valued(spec: SoftmaxSpec, fused: dict) -> SoftmaxSpec:
    """`spec` with its row scale's values (the call's `scale` tensor), which the float64
    formulas need; `spec` itself without one."""
    return spec.with_variant(with_row_scale(spec.variant, fused.get("scale")))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (the input must come back unmodified)."""
    return bool((a.eq(b) | (a.isnan() & b.isnan())).all()) if a.dtype.is_floating_point else torch.equal(a, b)


def check_forward(x: torch.Tensor, dim: int, *, backend: str, log: bool = False, dtype=None,
                  fused: dict | None = None) -> str | None:
    """softmax (log_softmax with `log`) of `x` with `backend`, plain or with the fused keywords
    `fused` (scale, mask, causal, softcap, sinks, empty_rows), against the float64 reference."""
    fused = fused or {}
    fn = api_function(log)
    spec, reason = declared_refusal(backend, x, dim, dtype, log, fused)
    if reason is not None:
        return _expect_refusal(lambda: fn(x, dim, dtype=dtype, backend=backend, **fused), backend, reason)
    before = x.clone()
    with poisoned_allocations(), named_failure(spec):
        out = fn(x, dim, dtype=dtype, backend=backend, **fused)
    if not _same(x, before):
        raise AssertionError(f"{backend} modified its input")
    result = compare(out, x, _valued(spec, fused), mask=fused.get("mask"), sinks=fused.get("sinks"))
    assert result.ok, f"{spec.describe()}: {result.detail}"
    return None


def _upstream(y: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return g.to(y.dtype).to(y.device)


def check_backward(x: torch.Tensor, dim: int, *, backend: str, log: bool = False, dtype=None,
                   fused: dict | None = None, seed: int = 7) -> str | None:
    """Gradients through the API (autograd) with `backend`: dx for every call, and for fused
    calls dsinks and a floating mask's gradient too, against the float64 formulas computed from
    the output the backend gave (`compare_backward`, `compare_fused_backward`,
    `compare_mask_gradient`). `seed` makes the upstream gradient. Inputs that cannot carry a
    gradient (integer dtypes, empty tensors) check the forward only."""
    fused = dict(fused or {})
    fn = api_function(log)
    spec, reason = declared_refusal(backend, x, dim, dtype, log, fused)
    if reason is not None:
        return _expect_refusal(lambda: fn(x, dim, dtype=dtype, backend=backend, **fused), backend, reason)
    if not x.dtype.is_floating_point or x.numel() == 0:
        return check_forward(x, dim, backend=backend, log=log, dtype=dtype, fused=fused)
    mask, sinks = fused.get("mask"), fused.get("sinks")
    xg = x.detach().clone().requires_grad_()
    wants = [xg]
    if sinks is not None:
        fused["sinks"] = sinks.detach().clone().requires_grad_()
        wants.append(fused["sinks"])
    additive = mask is not None and mask.dtype.is_floating_point
    mask_at = len(wants)
    if additive:
        fused["mask"] = mask.detach().clone().requires_grad_()
        wants.append(fused["mask"])
    row_scale = spec.variant.row_scale is not None
    if row_scale:
        fused["scale"] = fused["scale"].detach().clone().requires_grad_()
        wants.append(fused["scale"])
    with poisoned_allocations(), named_failure(spec, "backward of "):
        y = fn(xg, dim, dtype=dtype, backend=backend, **fused)
        g = _upstream(y, seed + x.numel())
        grads = torch.autograd.grad(y, wants, g)
    y = y.detach()
    if spec.is_plain:
        result = compare_backward(grads[0], y, g, spec)
        assert result.ok, f"backward of {spec.describe()}: {result.detail}"
        return None
    ds = grads[1] if sinks is not None else None
    result = compare_fused_backward(grads[0], y, g, x, _valued(spec, fused), mask, sinks, ds,
                                    dscale=grads[-1] if row_scale else None)
    assert result.ok, f"backward of {spec.describe()}: {result.detail}"
    excluded_get_zero(grads[0], x, spec, mask, f"backward of {spec.describe()}")
    if additive:
        result = compare_mask_gradient(grads[mask_at], y, g, x, _valued(spec, fused), mask, sinks)
        assert result.ok, f"backward of {spec.describe()}: {result.detail}"
    return None


def excluded_get_zero(dx: torch.Tensor, x: torch.Tensor, spec: SoftmaxSpec, mask, what: str) -> None:
    """Positions a bool mask or causal excludes are never read: their gradient is exactly 0,
    whatever the logit there (a NaN included; the reference's own formula is no help here, as
    it multiplies a zero by the NaN's softcap derivative)."""
    keep = keep_mask(tuple(x.shape), spec.variant, mask, dx.device)
    if keep is None:
        return
    leaked = dx.detach()[~keep]
    bad = leaked != 0  # (NaN != 0)
    if bool(bad.any()):
        at = tuple((~keep & (dx.detach() != 0)).nonzero()[0].tolist())
        raise AssertionError(f"{what}: the gradient at {int(bad.sum())} excluded positions is not 0 (at {list(at)}: "
                             f"{dx[at].item()}, logit {x[at].item()})")


# An error bound's count of float32/float64 roundings of the exponent's terms (as
# `testing.compare.PROLOGUE_ROUNDINGS`: scale, softcap, the subtraction of the lse).
ROUNDINGS = 8


def _bounded(got, expected, bound, what: str) -> None:
    """`got` against the float64 `expected` within the per-element absolute `bound`."""
    from .compare import compare_values

    result = compare_values(got, expected, bound.nan_to_num(nan=float("inf")), Tolerance(0.0, 1.0), what)
    assert result.ok, result.detail


def _finite_abs(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t.abs(), torch.zeros_like(t))


# ---- softmax in pieces (core.lse_merge) ----------------------------------------------------------

def pieces_refusal(backend: str, op: str, spec) -> str | None:
    """The backend's declared refusal of the pieces op `op` for `spec` (no `run_<op>` method,
    or its `supports_<op>`), or None."""
    reason = registry.op_refusal(registry.get_backend(backend), op, spec)
    if reason is not None and not isinstance(reason, str):
        raise AssertionError(f"{backend} answered {reason!r} for {op}: it must be None or a reason (str)")
    return reason


def check_logsumexp(x: torch.Tensor, dim: int, *, backend: str, fused: dict | None = None) -> str | None:
    """anysoftmax.logsumexp of `x` with the fused keywords against the float64 reference
    (keepdim and not; input unmodified; output dtype float32/float64)."""
    import anysoftmax
    from .compare import compare_logsumexp
    from ..core.lse_merge import describe_logsumexp, logsumexp_request

    fused = fused or {}
    spec, _ = logsumexp_request(x, dim, **fused)
    reason = pieces_refusal(backend, "logsumexp", spec)
    if reason is not None:
        return _expect_refusal(lambda: anysoftmax.logsumexp(x, dim, backend=backend, **fused), backend, reason)
    before = x.clone()
    with poisoned_allocations(), named_failure(spec, "logsumexp: "):
        out = anysoftmax.logsumexp(x, dim, keepdim=True, backend=backend, **fused)
        flat = anysoftmax.logsumexp(x, dim, backend=backend, **fused)
    if not _same(x, before):
        raise AssertionError(f"{backend} modified its input")
    result = compare_logsumexp(out, x, _valued(spec, fused), fused.get("mask"), fused.get("sinks"))
    assert result.ok, f"{describe_logsumexp(spec)}: {result.detail}"
    want = tuple(s for d, s in enumerate(spec.shape) if d != spec.dim)
    assert tuple(flat.shape) == want, f"{describe_logsumexp(spec)}: keepdim=False gave {tuple(flat.shape)}, not {want}"
    assert _same(flat.reshape(out.shape), out), f"{describe_logsumexp(spec)}: keepdim=False differs from keepdim=True"
    return None


def _partials(x: torch.Tensor, bounds: list, backend: str, lse_dtype=None) -> tuple[list, list]:
    """merge(split(x))'s partials: each segment's softmax (in float64, rounded to x's dtype) as
    an output over all n columns (the attention value with V = identity; NaN for a segment
    whose logits are all -inf, as a kernel leaves a fully masked one) and its logsumexp in
    `lse_dtype` (None: the backend's, float64 for float64 x, else float32): the backend's when
    it declares logsumexp and gives that dtype, else the float64 one rounded."""
    import anysoftmax

    n = x.shape[-1]
    lse_spec, _ = SoftmaxSpec.from_request(x, x.dim() - 1, fused={})
    lse_dtype = lse_dtype or lse_spec.acc_dtype
    x64 = x.detach().to("cpu", torch.float64)
    eye = torch.eye(n, dtype=torch.float64)
    own_lse = lse_dtype == lse_spec.acc_dtype and pieces_refusal(backend, "logsumexp", lse_spec) is None
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = x64[..., a:b]
        lse = torch.logsumexp(seg, -1)
        if own_lse:
            with poisoned_allocations():
                lse = anysoftmax.logsumexp(x[..., a:b], -1, backend=backend)
        p = torch.softmax(seg, -1) if b > a else seg  # (an empty segment's output: zeros below)
        outs.append((p @ eye[a:b] if b > a else torch.zeros(*x.shape[:-1], n, dtype=torch.float64))
                    .to(x.dtype).to(x.device))
        lses.append(lse.to(lse_dtype).to(x.device))
    return outs, lses


def _strided(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in a non-contiguous view: its last two dims stored transposed (an lse of
    [tokens, heads] as vLLM keeps it, [heads, tokens]; an output's head_size elements apart by
    the heads), or for one dim every other element of a buffer twice as long."""
    if t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    buf = torch.empty(2 * t.numel(), dtype=t.dtype, device=t.device)
    view = buf[1::2]
    view.copy_(t)
    return view


def _merge_call(outs: list, lses: list, backend: str, layout: str):
    """A call of merge_states on the partials in `layout` (`cases.SplitCase`), returning (out,
    lse): `anysoftmax.merge_states`, or vLLM's `merge_attn_states` writing into fresh
    (poisoned) `output` and `output_lse`."""
    import anysoftmax

    if layout == STRIDED:
        outs, lses = [_strided(t) for t in outs], [_strided(t) for t in lses]
        assert not any(t.is_contiguous() for t in (*outs, *lses))
    if layout != INTO_OUT:
        return lambda: anysoftmax.merge_states(outs, lses, backend=backend)
    from ..compat.vllm import merge_attn_states

    (prefix, suffix), (prefix_lse, suffix_lse) = outs, [t.t().contiguous() for t in lses]  # [heads, tokens]

    def call():
        output = torch.empty_like(prefix)
        output_lse = torch.empty_like(prefix_lse, dtype=torch.float32)
        merge_attn_states(output, prefix, prefix_lse, suffix, suffix_lse, output_lse, backend=backend)
        return output, output_lse.t()
    return call


def check_logsumexp_backward(x: torch.Tensor, dim: int, *, backend: str, fused: dict | None = None,
                             seed: int = 7) -> str | None:
    """Gradients of `anysoftmax.logsumexp` (autograd; x's, and the sinks' when given) against
    the float64 formula (`core.lse_merge.logsumexp_backward_formula`) from the lse the backend
    gave; positions the mask or causal excludes get exactly 0."""
    import anysoftmax
    from ..core.lse_merge import describe_logsumexp, logsumexp_backward_formula, logsumexp_request
    from ..core.reference import prologue

    fused = dict(fused or {})
    spec, _ = logsumexp_request(x, dim, **fused)
    reason = pieces_refusal(backend, "logsumexp", spec)
    if reason is not None:
        return _expect_refusal(lambda: anysoftmax.logsumexp(x, dim, backend=backend, **fused), backend, reason)
    if x.numel() == 0:
        return check_logsumexp(x, dim, backend=backend, fused=fused)
    mask, sinks = fused.get("mask"), fused.get("sinks")
    wants = [x.detach().clone().requires_grad_()]
    if sinks is not None:
        fused["sinks"] = sinks.detach().clone().requires_grad_()
        wants.append(fused["sinks"])
    what = f"backward of {describe_logsumexp(spec)}"
    with poisoned_allocations(), named_failure(spec, "backward of logsumexp: "):
        lse = anysoftmax.logsumexp(wants[0], dim, keepdim=True, backend=backend, **fused)
        g = _upstream(lse, seed + x.numel())
        grads = torch.autograd.grad(lse, wants, g)
    excluded_get_zero(grads[0], x, spec, mask, what)
    f64 = lambda t: None if t is None else t.detach().to("cpu", torch.float64)  # noqa: E731
    x64, g64, lse64, s64 = f64(x), f64(g), f64(lse), f64(sinks)
    m = None if mask is None else mask.detach().cpu()
    v = spec.variant
    dx, _, ds_rows = logsumexp_backward_formula(g64, lse64, x64, v, spec.dim, m, s64, torch.float64)
    # Bounds: the gradient's rounding to its dtype, plus float32 (float64) roundings of the
    # exponent z - lse relative to |z| + |lse| (z's own: scale, softcap and their argument).
    eps = torch.finfo(spec.acc_dtype).eps
    live = torch.where(torch.isfinite(lse64), lse64, torch.zeros_like(lse64))
    z = prologue(x64, v, m, torch.float64)
    scale = 1.0 if v.scale is None else abs(v.scale)
    arg = 0.0 if v.softcap is None else _finite_abs(x64 * scale / v.softcap)
    p = torch.exp(z - live).nan_to_num(0.0, 0.0, 0.0)
    drift = ROUNDINGS * eps * (1 + _finite_abs(z) + _finite_abs(lse64) + arg)
    tol = TOLERANCES[x.dtype]
    _bounded(grads[0], dx, tol.atol * max(1.0, scale) + tol.rtol * dx.abs().nan_to_num(0.0)
             + g64.abs() * p * scale * drift, f"{what}: dx ")
    if sinks is not None:
        ds = ds_rows.sum_to_size(tuple(sinks.shape))
        tol = TOLERANCES[sinks.dtype]
        ps = torch.exp(s64.expand(tuple(lse64.shape)) - live).nan_to_num(0.0, 0.0, 0.0)
        mag = (g64.abs() * ps * ROUNDINGS * eps * (1 + _finite_abs(s64) + _finite_abs(lse64))).sum_to_size(
            tuple(sinks.shape))
        _bounded(grads[1], ds, tol.atol + tol.rtol * ds.abs().nan_to_num(0.0) + mag, f"{what}: dsinks ")
    return None


def check_merge_split(x: torch.Tensor, bounds: list, *, backend: str, lse_dtype=None,
                      layout: str = CONTIGUOUS) -> str | None:
    """merge(split(x)) == (softmax(x), logsumexp(x)) along the last dim: the segments'
    partials (`_partials`: lses in `lse_dtype`), laid out as `layout` says (`cases.SplitCase`),
    merged by the backend. Rows with nothing (every logit -inf) must merge to 0 and -inf."""
    from .compare import compare_merge
    from ..core.lse_merge import MergeSpec

    outs, lses = _partials(x, bounds, backend, lse_dtype)
    spec = MergeSpec.from_tensors(outs, lses)
    call = _merge_call(outs, lses, backend, layout)
    reason = pieces_refusal(backend, "merge_states", spec)
    if reason is not None:
        return _expect_refusal(call, backend, reason)
    with poisoned_allocations():
        try:
            out, lse = call()
        except Exception as exc:
            raise AssertionError(f"{spec.describe()}: {type(exc).__name__}: {exc}") from exc
    x64 = x.detach().to("cpu", torch.float64)
    full_lse = torch.logsumexp(x64, -1)
    expected = torch.where((full_lse == float("-inf")).unsqueeze(-1), 0.0, torch.softmax(x64, -1))
    result = compare_merge(out, lse, outs, lses, expected=(expected, full_lse), roundings=3)
    assert result.ok, f"{spec.describe()}, {layout} partials of segments {bounds}: {result.detail}"
    return None


def check_merge_backward(x: torch.Tensor, bounds: list, *, backend: str, lse_dtype=None, seed: int = 7) -> str | None:
    """Gradients of merge(split(x)) through `anysoftmax.merge_states` (autograd) against the
    float64 formula (`core.lse_merge.merge_backward_formula`) from the (out, lse) the backend
    gave. A partial whose lse is -inf weighs 0: its output (NaN for a fully masked segment)
    is never read, and its gradients are exactly 0."""
    import anysoftmax
    from ..core.lse_merge import MergeSpec, merge_backward_formula

    outs, lses = _partials(x, bounds, backend, lse_dtype)
    spec = MergeSpec.from_tensors(outs, lses)
    reason = pieces_refusal(backend, "merge_states", spec)
    if reason is not None:
        return _expect_refusal(lambda: anysoftmax.merge_states(outs, lses, backend=backend), backend, reason)
    wants = [t.detach().clone().requires_grad_() for t in (*outs, *lses)]
    k = len(outs)
    with poisoned_allocations(), named_failure(spec, "backward of "):
        out, lse = anysoftmax.merge_states(wants[:k], wants[k:], backend=backend)
        g_out, g_lse = _upstream(out, seed), _upstream(lse, seed + 1)
        grads = torch.autograd.grad((out, lse), wants, (g_out, g_lse))
    what = f"backward of {spec.describe()} of segments {bounds}"
    for i, li in enumerate(lses):
        dead = li == float("-inf")
        for name, d in ((f"outputs[{i}]", grads[i][dead]), (f"lses[{i}]", grads[k + i][dead])):
            if bool((d != 0).any()):
                raise AssertionError(f"{what}: {name}'s gradient where lses[{i}] is -inf is not 0 "
                                     f"({int((d != 0).sum())} values, e.g. {d[d != 0][0].item()})")
    f64 = lambda t: t.detach().to("cpu", torch.float64)  # noqa: E731
    o64, l64, out64, lse64, go, gl = [f64(t) for t in outs], [f64(t) for t in lses], f64(out), f64(lse), \
        f64(g_out), f64(g_lse)
    d_outs, d_lses = merge_backward_formula(go, gl, o64, l64, out64, lse64, torch.float64)
    # Bounds: the result's rounding to its dtype, plus float32 (float64) roundings of the
    # weight exp(lse_i - lse) relative to |lse_i| + |lse|, and of <g, out_i - out> relative to
    # its terms' magnitudes.
    eps = torch.finfo(spec.acc_dtype).eps
    for i in range(k):
        p = torch.exp(l64[i] - torch.where(torch.isfinite(lse64), lse64, torch.zeros_like(lse64))).nan_to_num(0.0, 0.0)
        drift = ROUNDINGS * eps * (1 + _finite_abs(l64[i]) + _finite_abs(lse64))
        tol = TOLERANCES[outs[i].dtype]
        mag = p.unsqueeze(-1) * go.abs()
        _bounded(grads[i], d_outs[i], tol.atol + tol.rtol * d_outs[i].abs().nan_to_num(0.0) + mag * drift.unsqueeze(-1),
                 f"{what}: outputs[{i}]'s gradient: ")
        tol = TOLERANCES[lses[i].dtype]
        terms = ((_finite_abs(o64[i]) + _finite_abs(out64)) * go.abs()).sum(-1) + gl.abs()
        _bounded(grads[k + i], d_lses[i], tol.atol + tol.rtol * d_lses[i].abs().nan_to_num(0.0)
                 + p * terms * (drift + ROUNDINGS * eps), f"{what}: lses[{i}]'s gradient: ")
    return None
