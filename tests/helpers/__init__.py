"""The shared test helpers (the one place for them: test modules never import each other).

Which backends run here and what they declare they take, checks of one request against the
one reference (the conformance kit's), pytest params of the shipped cases, a stub backend, the
tuning overrides that force the long-row paths, and the one matrix-YAML writer. Backend-specific
shared data lives beside it: `helpers.ascend`, `helpers.wave`, `helpers.compile` (captured
torch.compile graphs), `helpers.vendor` (the vendors' softmax conventions).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch

import anysoftmax
from anysoftmax.core import SoftmaxSpec
from anysoftmax.core.layout import allocate_rows
from anysoftmax.dispatch import prepare
from anysoftmax.testing import check_backward, check_forward


def runnable_backends(device_type: str) -> list[str]:
    """Backends that can run tensors of `device_type` on this machine (explicit choice)."""
    names = []
    for status in anysoftmax.list_backends():
        if not status.available:
            continue
        probe = SoftmaxSpec.from_tensor(torch.empty(2, 2, device=device_type), 1)
        if anysoftmax.get_backend(status.name).supports(probe) is None:
            names.append(status.name)
    return names


def backends_that_run(device_type: str = "cpu", dtype: torch.dtype = torch.float32, fused: dict | None = None,
                      backends: list[str] | None = None) -> list[str]:
    """The runnable backends of `device_type` (or of `backends`) that declare they take a
    request of `dtype` (and, with `fused`, those fused keywords): chosen by what each backend
    declares (its `supports()` and the fused-family gate), never by name, so a third-party
    plugin that refuses float64 or the fused family is simply not picked."""
    from anysoftmax.core import registry

    x = torch.empty(2, 3, 4, 6, dtype=dtype, device="meta")
    spec, _ = SoftmaxSpec.from_request(x, -1, fused={k: (v.to("meta") if isinstance(v, torch.Tensor) else v)
                                                     for k, v in (fused or {}).items()})
    spec = replace(spec, device=torch.device(device_type))
    names = runnable_backends(device_type) if backends is None else backends
    return [n for n in names if registry.refusal(registry.get_backend(n), spec) is None]


def takes_float64(backend: str, device_type: str = "cpu") -> bool:
    """True when `backend` declares it takes float64 requests on `device_type`."""
    return bool(backends_that_run(device_type, torch.float64, backends=[backend]))


# A fused request every fused backend takes: tests that need the fused family pick backends by it.
FUSED_PROBE = {"scale": 0.5, "softcap": 3.0, "causal": "bottom_right", "mask": torch.zeros(6, dtype=torch.bool),
               "sinks": torch.zeros(3, 1, 1)}


def as_backend_sees_it(x: torch.Tensor, dim: int, dtype=None, log: bool = False) -> tuple:
    """(x, y, layout, spec) of a request as `run` receives and lays it out: validated and
    converted by the API (`prepare`), output allocated and rows described (`allocate_rows`)."""
    x, spec = prepare(x, dim, dtype, log)
    x, y, layout = allocate_rows(x, spec)
    return x, y, layout, spec


def check(x: torch.Tensor, dim: int, *, backend: str, log: bool, dtype=None) -> str | None:
    """Run softmax/log_softmax on `x` with `backend` and assert it matches the reference (the
    kit's `check_forward`); returns the backend's declared refusal (after checking that it was
    raised as UnsupportedRequestError), or None when it ran."""
    return check_forward(x, dim, backend=backend, log=log, dtype=dtype)


def skip_if_refused(refusal: str | None) -> None:
    """A declared refusal (a check's return value) is a skip with the backend's reason, never a
    pass: nothing was computed."""
    if refusal is not None:
        pytest.skip(f"declared refusal: {refusal}")


def kit_params(backends, device: str, **marks) -> list:
    """(backend, check) pytest params: the kit's checks (`anysoftmax.testing.conformance_checks`)
    for each backend on `device`, ids '<backend>-<check name>'."""
    from anysoftmax.testing import conformance_checks

    return [pytest.param(b, c, id=f"{b}-{c.name}".replace(" ", "-"), **marks)
            for b in backends for c in conformance_checks(b, device=device)]


class StubBackend:
    """A test backend: available, supports everything, serves CPU tensors; subclasses override."""

    name = "stub"
    devices = ("cpu",)
    priority = -1

    def is_available(self):
        return None

    def supports(self, spec):
        return None

    def run(self, x, spec):
        raise NotImplementedError


def backend_devices() -> list:
    """(backend, device) pairs: the backends runnable on CPU tensors here, and on CUDA tensors
    those runnable there, marked `gpu` (skipped with the reason on a machine without CUDA)."""
    pairs = [(b, "cpu") for b in runnable_backends("cpu")]
    cuda = runnable_backends("cuda") if torch.cuda.is_available() else ["torch", "triton"]
    return pairs + [pytest.param(b, "cuda", marks=pytest.mark.gpu) for b in cuda]


def check_variant(x: torch.Tensor, dim: int, kwargs: dict, *, backend: str, log: bool, dtype=None,
                  backward: bool = True) -> str | None:
    """A fused-family call on `x` with `backend`: the forward against the float64 reference and,
    with `backward`, dx, dsinks and a floating mask's gradient (the kit's `check_forward` and
    `check_backward`); returns the declared refusal, or None when it ran."""
    refusal = check_forward(x, dim, backend=backend, log=log, dtype=dtype, fused=kwargs)
    if refusal is None and backward:
        check_backward(x, dim, backend=backend, log=log, dtype=dtype, fused=kwargs)
    return refusal


def params(cases):
    """(case, dtype) pairs of `anysoftmax.testing.cases` as pytest params with readable ids."""
    return [pytest.param(c, d, id=f"{c.name}-{str(d).removeprefix('torch.')}") for c in cases for d in c.dtypes]


variant_params = params


# Tuning overrides (anysoftmax/backends/triton/tuning.yaml) that send short rows down each
# long-row path of the triton kernels, so the interpreter runs them on small inputs.
LONG_ROW_PATHS = {
    "split": dict(max_tile_elems=64, split_chunk_bytes=128, cols_tile_bytes=256, cols_block_bytes=64,
                  cols_chunk_bytes=1024),
    "online": dict(max_tile_elems=64, long_rows="online", online_block_n=32),
}
# The same with the backward's own tile limit lowered (its split kernel too).
LONG_ROW_PATHS_BACKWARD = {"split": {**LONG_ROW_PATHS["split"], "bwd_max_tile_bytes": 64},
                           "online": LONG_ROW_PATHS["online"]}


def write_matrix(folder, data, file: str = "matrix.yaml"):
    """Write a device-matrix YAML file `folder/file` holding `data` (a mapping, keys in their
    order; or text, written as it is, for files that must not parse) and return its path. The
    one YAML writer of the suite."""
    import yaml

    path = folder / file
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def config_errors(folder, data) -> list[str]:
    """The errors `load_config` reports for a matrix of `data` (it must fail), each checked to
    name the file first."""
    from anysoftmax.matrix import ConfigError, load_config

    path = write_matrix(folder, data, "m.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert all(line.startswith(f"{path}: ") for line in info.value.errors), info.value.errors
    return info.value.errors


@contextlib.contextmanager
def active_launch_hook(fast: tuple):
    """A no-op hook added to the launch-enter hook chain a bound launcher's fast path saw
    (`launcher.FastPath`) for the block; yields False where this Triton's hook is no chain
    (nothing added: the caller's check does not apply)."""
    chain = fast[1].launch_enter_hook
    if not hasattr(chain, "add"):
        yield False
        return

    def hook(*a):
        return None

    chain.add(hook)
    try:
        yield True
    finally:
        chain.remove(hook)


def bound_launchers(fn) -> list:
    """The launch engine's launchers (`launcher.bind_kernel`: they have `prime`) a request's
    launcher holds, found through its closures, lists and `state` dicts."""
    found, todo, seen = [], [fn], set()
    while todo:
        f = todo.pop(0)
        if id(f) in seen:
            continue
        seen.add(id(f))
        if hasattr(f, "prime"):
            found.append(f)
            continue
        if isinstance(f, (list, tuple)):
            todo += list(f)
            continue
        state = getattr(f, "state", None)
        todo += list(state.values()) if isinstance(state, dict) else []
        for cell in getattr(f, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # (an empty cell)
                todo.append(cell.cell_contents)
    return found
