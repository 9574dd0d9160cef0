"""What a matrix cell runs: an anysoftmax backend, anysoftmax's automatic choice, or a peer.

* a registered backend name (`torch`, `triton`, ...): `anysoftmax.softmax(..., backend=name)`;
* `auto`: anysoftmax's automatic choice (`backend=None`, or $ANYSOFTMAX_BACKEND);
* `peer:<name>`: an implementation to compare against, never anysoftmax: `peer:torch`
  (`torch.softmax`; not the `torch` backend), `peer:torch.compile`, `peer:seed` (the Triton
  tutorial kernel the project started from), `peer:liger`, `peer:quack`, and `peer:copy`.
  `peer:copy` is not a softmax: it moves the same bytes (forward: a clone; backward: y + dy,
  two reads and one write) and shows what any kernel can reach on that shape, launch overhead
  included. It is reference-only: nothing to check.

Each is built lazily for one (op, dim): a peer whose package is missing raises
`BackendUnavailableError`, one that cannot do the request (log_softmax, a dim other than the
last, no GPU) `UnsupportedRequestError`; the cell is then skipped with that reason. Forward
functions are fn(x) -> y; backward ones fn(y, dy) -> dx, over the cell's dim.

A fused cell (a variant other than plain, `matrix.variants`) gets `fused_forward`: fn(x, mask,
sinks) -> y, differentiable in x and the sinks: anysoftmax with the variant's keywords,
`peer:torch` the torch composition a user writes (`matrix.composition`), `peer:torch.compile`
that same function compiled. The row kernels (seed, Liger, QuACK) compute the plain softmax
only: their fused cells are skipped with that reason.
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

from ..torchop import api
from ..core.registry import BackendUnavailableError, UnsupportedRequestError, unavailable_reason
from .composition import composition
from .operands import Operands, call_kwargs
from .variants import VariantSpec

AUTO = "auto"
PEER_PREFIX = "peer:"
PEERS = ("copy", "torch", "torch.compile", "seed", "liger", "quack")
PEER_NAMES = tuple(PEER_PREFIX + p for p in PEERS)
REFERENCE_ONLY = (PEER_PREFIX + "copy",)
REFERENCE_NOTE = "reference: same bytes moved, not a softmax (not checked)"
# Row kernels that take 2-D CUDA tensors and reduce their last dim; their packages may be missing.
_ROW_KERNELS = ("seed", "liger", "quack")
_PACKAGES = {"liger": ("liger_kernel.ops.softmax", "liger-kernel"), "quack": ("quack.softmax", "quack-kernels")}

Forward = Callable[[torch.Tensor], torch.Tensor]
Backward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
FusedForward = Callable[[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"], torch.Tensor]


def is_peer(name: str) -> bool:
    """True for `peer:<name>` (not anysoftmax)."""
    return name.startswith(PEER_PREFIX)


def is_reference_only(name: str) -> bool:
    """True for a provider that is not a softmax (its output is not checked)."""
    return name in REFERENCE_ONLY


def _peer(name: str, op: str, dim: int, ndim: int, device: str):
    """(peer name, its package module or None) after checking it can run this request: a
    missing package first (the reason that holds everywhere), then the request's limits."""
    peer = name[len(PEER_PREFIX):]
    if name not in PEER_NAMES:
        raise BackendUnavailableError(f"unknown peer {name!r}; known: {', '.join(PEER_NAMES)}")
    module = None
    if peer in _PACKAGES:
        module_name, dist = _PACKAGES[peer]
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # ImportError, or a broken install failing at import
            raise BackendUnavailableError(f"{name}: {dist} not importable ({type(exc).__name__}: {exc})") from None
    if peer in _ROW_KERNELS:
        if op != "softmax":
            raise UnsupportedRequestError(f"{name} has no {op}")
        if ndim == 0 or dim % ndim != ndim - 1:
            raise UnsupportedRequestError(f"{name} reduces over the last dim only (dim {dim} of a {ndim}-d input)")
        if torch.device(device).type != "cuda":
            raise UnsupportedRequestError(f"{name} launches CUDA kernels only (device {device})")
    return peer, module


def backend_argument(name: str) -> str | None:
    """The `backend=` argument of anysoftmax provider `name` (None: the automatic choice). A
    named backend that cannot run here raises now, when the provider is built, like a peer
    whose package is missing (not at its first call)."""
    if name == AUTO:
        return None
    reason = unavailable_reason(name)
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} is not available: {reason}")
    return name


def _rows(fn):
    """fn on 2-D (rows, last dim) views: the row kernels take 2-D tensors only."""
    return lambda *ts: fn(*(t.reshape(-1, t.shape[-1]) for t in ts)).view(ts[0].shape)


def fresh_compiled(fn):
    # A fresh dynamo state per cell: with dynamic=False every shape recompiles the same code
    # object, and past torch's recompile limit dynamo would silently run it eagerly.
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def forward(name: str, op: str, dim: int, ndim: int, device: str) -> Forward:
    """The forward function of provider `name` for `op` over `dim` of an `ndim`-d input on `device`."""
    log = op == "log_softmax"
    if not is_peer(name):
        fn, backend = (api.log_softmax if log else api.softmax), backend_argument(name)
        return lambda x: fn(x, dim, backend=backend)
    peer, module = _peer(name, op, dim, ndim, device)
    torch_op = torch.log_softmax if log else torch.softmax
    if peer == "copy":
        return lambda x: x.clone()
    if peer == "torch":
        return lambda x: torch_op(x, dim)
    if peer == "torch.compile":
        return fresh_compiled(lambda x: torch_op(x, dim))
    if peer == "seed":
        from .seed_kernel import seed_softmax
        return _rows(seed_softmax)
    if peer == "liger":
        return _rows(module.LigerSoftmaxFunction.apply)
    return _rows(module.softmax_fwd)  # quack


def backward(name: str, op: str, dim: int, ndim: int, device: str) -> Backward:
    """The backward function (y, dy) -> dx of provider `name` for `op` over `dim`."""
    log = op == "log_softmax"
    if not is_peer(name):
        backend = backend_argument(name)
        return lambda y, dy: api.softmax_backward(y, dy, dim, log=log, backend=backend)
    peer, module = _peer(name, op, dim, ndim, device)
    torch_bwd = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    if peer == "copy":
        return lambda y, dy: torch.add(y, dy)
    if peer == "torch":
        return lambda y, dy: torch_bwd(dy, y, dim, y.dtype)
    if peer == "torch.compile":
        return fresh_compiled(lambda y, dy: torch_bwd(dy, y, dim, y.dtype))
    if peer == "seed":
        raise UnsupportedRequestError("peer:seed has no backward")
    if peer == "liger":
        from liger_kernel.ops.utils import calculate_settings

        def liger_backward(y, dy):
            block, warps = calculate_settings(y.shape[-1])  # what its forward would have chosen
            return module._softmax_backward(dy, y, block, warps, y.shape[-1] > block)
        return _rows(liger_backward)
    return _rows(lambda y, dy: module.softmax_bwd(dy, y))  # quack


def fused_forward(name: str, op: str, dim: int, shape: tuple[int, ...], device: str,
                  spec: VariantSpec) -> FusedForward:
    """fn(x, mask, sinks) -> y of provider `name` for the fused variant `spec` over `dim` of
    inputs of `shape` on `device` (`peer:copy` has none: it is no softmax)."""
    log = op == "log_softmax"
    if not is_peer(name):
        fn, backend = (api.log_softmax if log else api.softmax), backend_argument(name)
        return lambda x, mask, sinks: fn(x, dim, backend=backend, **call_kwargs(spec, Operands(mask, sinks)))
    peer, _ = _peer(name, op, dim, len(shape), device)
    if peer in _ROW_KERNELS:
        raise UnsupportedRequestError(f"{name} computes the plain softmax only (variant {spec.name!r}: "
                                      f"{spec.describe()})")
    if peer == "torch":
        return composition(spec, dim, log, shape, device)
    if peer == "torch.compile":
        return fresh_compiled(composition(spec, dim, log, shape, device))
    raise UnsupportedRequestError(f"{name} is not a softmax: a fused cell times it on its own inputs")
