"""The backend protocol and its defaults for every member beyond `REQUIRED` (docs/plugins.md). A duck-typed
backend (the README's `MyBackend`) is wrapped once, when registered, in `PluginBackend`: never probed per call."""

from __future__ import annotations

import torch

from .lse_merge import lse_shape
from .reference import backward_from_output, fused_backward
from .spec import SoftmaxSpec
from .variant import NO_OPERANDS, Operands

# What every backend must have (the rest has defaults).
REQUIRED = ("name", "devices", "priority", "is_available", "supports", "run")


class _Protocol(type):
    def __instancecheck__(cls, obj) -> bool:
        # `isinstance(obj, Backend)` answers whether `obj` speaks the protocol: a subclass, or an
        # object with every required member (the duck-typed form, as a typing.Protocol checks it).
        # `issubclass(type(obj), Backend)` says whether it inherits the defaults.
        return type.__instancecheck__(cls, obj) or (cls is Backend and all(hasattr(obj, m) for m in REQUIRED))


def _pair(result):
    return result if isinstance(result, tuple) else (result, None)


# Each op's refusal attribute and the members that define its kernel (defining one declares the op).
_KERNELS = {"logsumexp_refusal": ("run_logsumexp", "logsumexp_launcher"),
            "merge_states_refusal": ("run_merge_states", "merge_states_launcher"),
            "sampler_refusal": ("sampler",)}


class Backend(metaclass=_Protocol):
    """A backend, with the protocol's defaults (see the module docstring)."""

    name: str = ""
    devices: tuple[str, ...] = ()
    priority: int = 0
    fused: bool = False
    row_scale: bool = False  # takes a tensor `scale` (one value per row); needs `fused`
    # Why it has no kernel for logsumexp / merge_states; None once it defines one.
    logsumexp_refusal: str | None = "no logsumexp kernel"
    merge_states_refusal: str | None = "no merge_states kernel"
    sampler_refusal: str | None = "no sampler kernels"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for refusal, kernels in _KERNELS.items():
            if refusal not in own and any(k in own for k in kernels):
                setattr(cls, refusal, None)

    def is_available(self) -> str | None:
        """None when it can run here, else why not (a missing package, device or driver)."""
        return None

    def supports(self, spec: SoftmaxSpec) -> str | None:
        """None when it runs `spec` (asked only when available), else why not."""
        return None

    def status_note(self) -> str:
        """How it runs here when that is worth knowing (`list_backends()`), or ''."""
        return ""

    def run(self, x: torch.Tensor, spec: SoftmaxSpec, operands: Operands = NO_OPERANDS):
        """One call, unmemoised: y, or (y, p_sink or None) for a fused spec (default: `launcher`)."""
        if type(self).launcher is Backend.launcher:
            raise NotImplementedError(f"backend {self.name!r} defines neither run nor launcher")
        f = self.launcher(x, spec)
        return f(x) if spec.is_plain else f(x, operands)

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request (memoised: a fresh output each call); for a fused spec
        `f(x, operands) -> (y, p_sink or None)`. Default: `run` per call."""
        run = self.run
        if spec.is_plain:
            return lambda t: run(t, spec)
        return lambda t, ops: _pair(run(t, spec, ops))

    def backward_launcher(self, y: torch.Tensor, spec: SoftmaxSpec):
        """`f(y, grad) -> dx` bound to this request (default: `run_backward`, or torch's formula)."""
        run_backward = self.run_backward
        if getattr(run_backward, "__func__", None) is not Backend.run_backward:
            return lambda y_, g: run_backward(y_, g, spec)
        dim, log, acc = spec.dim if spec.shape else 0, spec.log, spec.acc_dtype
        return lambda y_, g: backward_from_output(y_, g, dim, log, acc).to(y_.dtype)

    def run_backward(self, y: torch.Tensor, grad: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        """The gradient for one call, unmemoised."""
        return self.backward_launcher(y, spec)(y, grad)

    def fused_backward_launcher(self, y: torch.Tensor, spec: SoftmaxSpec):
        """`f(grad, y, x, operands, p_sink) -> (dx, ds_rows or None)` bound to this fused request."""
        v, dim, log, acc = spec.variant, spec.dim, spec.log, spec.acc_dtype

        def run(grad, y_, x, ops: Operands, p_sink):
            dx, ds, _ = fused_backward(grad, y_, x, v.with_values(ops.scale, ops.softcap), dim, log, ops.mask, p_sink,
                                       acc)
            return dx.to(y_.dtype), ds
        return run

    def supports_logsumexp(self, spec: SoftmaxSpec) -> str | None:
        """None when its logsumexp kernel runs `spec`, else why not."""
        return None

    def logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands: Operands):
        """`f(x, operands) -> lse` (keepdim, accumulation dtype) bound to this request."""
        run = self.run_logsumexp
        return lambda t, ops: run(t, spec, ops)

    def shaped_logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands: Operands, keepdim: bool):
        """`logsumexp_launcher`'s, returning `lse_shape(spec, keepdim)` (a view, unless overridden)."""
        run = self.logsumexp_launcher(x, spec, operands)
        if keepdim:
            return run
        shape = lse_shape(spec, False)
        return lambda t, ops: run(t, ops).view(shape)

    def run_logsumexp(self, x: torch.Tensor, spec: SoftmaxSpec, operands: Operands) -> torch.Tensor:
        """logsumexp for one call, unmemoised."""
        if type(self).logsumexp_launcher is Backend.logsumexp_launcher:
            raise NotImplementedError(f"backend {self.name!r}: {self.logsumexp_refusal}")
        return self.logsumexp_launcher(x, spec, operands)(x, operands)

    def supports_merge_states(self, spec) -> str | None:
        """None when its merge_states kernel runs `spec` (a `core.lse_merge.MergeSpec`), else why not."""
        return None

    def merge_states_launcher(self, outputs, lses, spec):
        """`f(outputs, lses, out, lse_out) -> (out, lse)` bound to this request."""
        run = self.run_merge_states

        def launch(outputs, lses, out, lse_out):
            if out is None and lse_out is None:  # (kernels written before out= take no keywords)
                return run(list(outputs), list(lses), spec)
            return run(list(outputs), list(lses), spec, out=out, lse_out=lse_out)
        return launch

    def run_merge_states(self, outputs, lses, spec, out=None, lse_out=None):
        """merge_states for one call, unmemoised: (out, lse), written into `out` / `lse_out` when given."""
        if type(self).merge_states_launcher is Backend.merge_states_launcher:
            raise NotImplementedError(f"backend {self.name!r}: {self.merge_states_refusal}")
        return self.merge_states_launcher(outputs, lses, spec)(outputs, lses, out, lse_out)

    def supports_sampling(self, spec, top_n: int = 0) -> str | None:
        """None when its sampler runs `spec` (a `sampling.spec.SamplingSpec`; `top_n` of
        `logprobs`), else why not: decided by the request's form, never by keyword values."""
        return self.sampler_refusal

    def sampler(self):
        """The object computing `anysoftmax.sampling`'s requests (see the module)."""
        raise NotImplementedError(f"backend {self.name!r}: {self.sampler_refusal}")


# The optional methods a duck-typed backend may define in place of the defaults.
_OPTIONAL = ("status_note", "launcher", "backward_launcher", "run_backward", "fused_backward_launcher",
             "supports_logsumexp", "logsumexp_launcher", "run_logsumexp", "supports_merge_states",
             "merge_states_launcher", "run_merge_states", "supports_sampling", "sampler")


class PluginBackend(Backend):
    """A duck-typed backend, its members read once: its methods take the place of the defaults."""

    def __init__(self, plugin):
        self.name, self.devices, self.priority = plugin.name, plugin.devices, plugin.priority
        self.fused = bool(getattr(plugin, "fused", False))
        self.row_scale = self.fused and getattr(plugin, "row_scale", False) is True
        self.is_available, self.supports, self.run = plugin.is_available, plugin.supports, plugin.run
        for member in _OPTIONAL:
            method = getattr(plugin, member, None)
            if method is not None:
                setattr(self, member, method)
        for refusal, kernels in _KERNELS.items():
            setattr(self, refusal, None if any(getattr(plugin, k, None) is not None for k in kernels)
                    else getattr(plugin, refusal, None) or getattr(Backend, refusal))


def as_backend(obj) -> Backend:
    """`obj` as a `Backend` (wrapped in `PluginBackend` unless a subclass); TypeError when incomplete."""
    if issubclass(type(obj), Backend):
        return obj
    if not isinstance(obj, Backend):
        missing = [m for m in REQUIRED if not hasattr(obj, m)]
        raise TypeError(f"{obj!r} does not implement the Backend protocol (missing {', '.join(missing)})")
    return PluginBackend(obj)
