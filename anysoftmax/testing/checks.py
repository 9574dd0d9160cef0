"""One request, one verdict: call a backend through the public API and compare with the float64
reference (`anysoftmax.core.compare`).

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
from ..core.compare import compare, compare_backward, compare_fused_backward, compare_mask_gradient
from ..core.errors import UnsupportedRequestError
from ..core.spec import SoftmaxSpec
from .poison import poisoned_allocations


def _api(log: bool):
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
        # One reason for the whole family (the registry's message names each variant's steps).
        return spec, FUSED_GATE
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
def _named(spec: SoftmaxSpec, what: str = ""):
    """A backend's exception, re-raised as a failure that names the request (shape, dim,
    dtypes, variant); the original stays chained to it."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"{what}{spec.describe()}: {type(exc).__name__}: {exc}") from exc


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (the input must come back unmodified)."""
    return bool((a.eq(b) | (a.isnan() & b.isnan())).all()) if a.dtype.is_floating_point else torch.equal(a, b)


def check_forward(x: torch.Tensor, dim: int, *, backend: str, log: bool = False, dtype=None,
                  fused: dict | None = None) -> str | None:
    """softmax (log_softmax with `log`) of `x` with `backend`, plain or with the fused keywords
    `fused` (scale, mask, causal, softcap, sinks, empty_rows), against the float64 reference."""
    fused = fused or {}
    fn = _api(log)
    spec, reason = declared_refusal(backend, x, dim, dtype, log, fused)
    if reason is not None:
        return _expect_refusal(lambda: fn(x, dim, dtype=dtype, backend=backend, **fused), backend, reason)
    before = x.clone()
    with poisoned_allocations(), _named(spec):
        out = fn(x, dim, dtype=dtype, backend=backend, **fused)
    if not _same(x, before):
        raise AssertionError(f"{backend} modified its input")
    result = compare(out, x, spec, mask=fused.get("mask"), sinks=fused.get("sinks"))
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
    fn = _api(log)
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
    if additive:
        fused["mask"] = mask.detach().clone().requires_grad_()
        wants.append(fused["mask"])
    with poisoned_allocations(), _named(spec, "backward of "):
        y = fn(xg, dim, dtype=dtype, backend=backend, **fused)
        g = _upstream(y, seed + x.numel())
        grads = torch.autograd.grad(y, wants, g)
    y = y.detach()
    if spec.is_plain:
        result = compare_backward(grads[0], y, g, spec)
        assert result.ok, f"backward of {spec.describe()}: {result.detail}"
        return None
    ds = grads[1] if sinks is not None else None
    result = compare_fused_backward(grads[0], y, g, x, spec, mask, sinks, ds)
    assert result.ok, f"backward of {spec.describe()}: {result.detail}"
    if additive:
        result = compare_mask_gradient(grads[-1], y, g, x, spec, mask, sinks)
        assert result.ok, f"backward of {spec.describe()}: {result.detail}"
    return None


# ---- softmax in pieces (core.pieces) ----------------------------------------------------------

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
    from ..core.compare import compare_logsumexp
    from ..core.pieces import describe_logsumexp, logsumexp_request

    fused = fused or {}
    spec, _ = logsumexp_request(x, dim, **fused)
    reason = pieces_refusal(backend, "logsumexp", spec)
    if reason is not None:
        return _expect_refusal(lambda: anysoftmax.logsumexp(x, dim, backend=backend, **fused), backend, reason)
    before = x.clone()
    with poisoned_allocations(), _named(spec, "logsumexp: "):
        out = anysoftmax.logsumexp(x, dim, keepdim=True, backend=backend, **fused)
        flat = anysoftmax.logsumexp(x, dim, backend=backend, **fused)
    if not _same(x, before):
        raise AssertionError(f"{backend} modified its input")
    result = compare_logsumexp(out, x, spec, fused.get("mask"), fused.get("sinks"))
    assert result.ok, f"{describe_logsumexp(spec)}: {result.detail}"
    want = tuple(s for d, s in enumerate(spec.shape) if d != spec.dim)
    assert tuple(flat.shape) == want, f"{describe_logsumexp(spec)}: keepdim=False gave {tuple(flat.shape)}, not {want}"
    assert _same(flat.reshape(out.shape), out), f"{describe_logsumexp(spec)}: keepdim=False differs from keepdim=True"
    return None


def check_merge_split(x: torch.Tensor, bounds: list, *, backend: str) -> str | None:
    """merge(split(x)) == (softmax(x), logsumexp(x)) along the last dim: each segment's
    softmax (in float64, rounded to x's dtype) as a partial output over all n columns
    (the attention value with V = identity) and its logsumexp (the backend's when it declares
    logsumexp, else the float64 one in float32), merged by the backend. Rows with nothing
    (every logit -inf) must merge to 0 and -inf."""
    import anysoftmax
    from ..core.compare import compare_merge
    from ..core.pieces import MergeSpec

    n = x.shape[-1]
    x64 = x.detach().to("cpu", torch.float64)
    eye = torch.eye(n, dtype=torch.float64)
    lse_spec, _ = SoftmaxSpec.from_request(x, x.dim() - 1, fused={})
    own_lse = pieces_refusal(backend, "logsumexp", lse_spec) is None
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
        lses.append(lse.to(torch.float64 if x.dtype == torch.float64 else torch.float32).to(x.device))
    spec = MergeSpec.from_tensors(outs, lses)
    reason = pieces_refusal(backend, "merge_states", spec)
    if reason is not None:
        return _expect_refusal(lambda: anysoftmax.merge_states(outs, lses, backend=backend), backend, reason)
    with poisoned_allocations():
        try:
            out, lse = anysoftmax.merge_states(outs, lses, backend=backend)
        except Exception as exc:
            raise AssertionError(f"{spec.describe()}: {type(exc).__name__}: {exc}") from exc
    full_lse = torch.logsumexp(x64, -1)
    expected = torch.where((full_lse == float("-inf")).unsqueeze(-1), 0.0, torch.softmax(x64, -1))
    result = compare_merge(out, lse, outs, lses, expected=(expected, full_lse), roundings=3)
    assert result.ok, f"{spec.describe()} of segments {bounds}: {result.detail}"
    return None
