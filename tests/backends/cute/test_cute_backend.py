"""The `cute` backend's host side on a machine without a GPU: registration, availability and
refusal reasons, and the per-call path (views, strides, alignment, dtypes) with the compiled
kernel replaced by a torch implementation of the same contract (it writes softmax of its
(rows, n) input into its (rows, n) output; a column kernel over dim 1 of (outer, n, inner)
tensors), checked against the float64 reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import anysoftmax
from anysoftmax.backends.cute import CuteBackend, compiler, env, launch
from anysoftmax.backends.cute.backend import rows_of
from anysoftmax.core import SoftmaxSpec, compare, compare_backward
from anysoftmax.core.reference import backward_from_output

BACKEND = CuteBackend()


def test_registered_below_triton():
    assert anysoftmax.get_backend("cute").priority < anysoftmax.get_backend("triton").priority
    names = [b.name for b in anysoftmax.list_backends()]
    assert "cute" in names


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given on a machine without a GPU")
def test_unavailable_reason_names_what_is_missing():
    reason = anysoftmax.core.registry.unavailable_reason("cute")
    assert reason is not None
    assert ("nvidia-cutlass-dsl is not installed" in reason and "anysoftmax[cute]" in reason) or "sm_90" in reason
    with pytest.raises(anysoftmax.BackendUnavailableError, match="cute"):
        anysoftmax.softmax(torch.randn(4, 8), -1, backend="cute")


def _spec(shape, dim=-1, dtype=torch.float32, device="cuda", strides=None, log=False, out=None):
    spec = SoftmaxSpec.from_tensor(torch.empty(shape, dtype=dtype, device="meta"), dim, out, log=log)
    return replace(spec, device=torch.device(device), strides=strides or spec.strides)


@pytest.fixture
def capable(monkeypatch):
    """Pretend device 0 is an sm_90 GPU (supports() asks it last)."""
    monkeypatch.setattr(env, "capable", lambda device: None)


def test_supports_plain_last_dim(capable):
    assert BACKEND.supports(_spec((8, 65536))) is None
    assert BACKEND.supports(_spec((4, 3, 1000), dtype=torch.bfloat16)) is None
    assert BACKEND.supports(_spec((5, 7), strides=(100, 1))) is None  # sliced rows
    assert BACKEND.supports(_spec((5, 7), strides=(0, 1))) is None  # expanded rows


@pytest.mark.parametrize("spec,match", [
    (lambda: _spec((8, 64), device="cpu"), "device type 'cpu'"),
    (lambda: _spec((8, 64), dtype=torch.float64), "float64 is not supported"),
    (lambda: _spec((3, 4, 5), strides=(40, 1, 4)), "neither contiguous nor followed by contiguous"),
    (lambda: _spec((65536, 128), dim=0), "column of 65536 elements is longer than a cluster holds"),
    (lambda: _spec((40000, 64), dim=0, dtype=torch.bfloat16), "column of 40000 elements"),
    (lambda: _spec((3, 4, 5), strides=(100, 20, 1)), "not equally spaced"),
])
def test_refusals_name_the_reason(capable, spec, match):
    reason = BACKEND.supports(spec())
    assert reason is not None
    assert __import__("re").search(match, reason), reason


def test_supports_columns(capable):
    assert BACKEND.supports(_spec((8192, 8192), dim=0)) is None
    assert BACKEND.supports(_spec((16384, 1024), dim=0)) is None
    assert BACKEND.supports(_spec((4, 300, 96), dim=1, dtype=torch.bfloat16)) is None
    assert BACKEND.supports(_spec((1000, 33), dim=0, strides=(40, 1))) is None  # sliced: odd strides, vec 1


def test_refuses_fused_variants(capable):
    # The core's coming `spec.variant` (scale/mask/causal/softcap/sinks): not plain.
    spec = _spec((8, 64))
    fused = type("FusedSpec", (), {"is_plain": False, "__getattr__": lambda self, k: getattr(spec, k)})()
    assert BACKEND.supports(fused) == "cute serves the plain softmax only"


def test_rows_of():
    assert rows_of(_spec((6, 10)), (10, 1)) == (6, 10, 10)
    assert rows_of(_spec((2, 3, 10)), (30, 10, 1)) == (6, 10, 10)
    assert rows_of(_spec((6, 10)), (0, 1)) == (6, 10, 0)
    assert rows_of(_spec((10, 1), dim=0), (1, 1)) == (1, 10, 10)


# ---------------------------------------------------------------- the per-call path

class FakeKernel:
    """The compiled kernel's contract, in torch: (rows, n) tensors with unit column stride."""

    def __init__(self, key):
        self.key = key
        self.calls = []

    def __call__(self, *tensors):
        self.calls.append([(tuple(t.shape), tuple(t.stride())) for t in tensors])
        # Row kernels: (rows, n), reduced over dim 1; column kernels: (outer, n, inner), over dim 1.
        rank = 3 if self.key.lanes else 2
        for t in tensors:
            assert t.dim() == rank and (t.stride(-1) == 1 or t.shape[-1] == 1)
            assert t.data_ptr() % (self.key.vec * t.element_size()) == 0, "misaligned for the compiled vectors"
            if self.key.lanes:  # the compiled assumptions on the inner extent and the strides
                assert t.shape[2] % self.key.vec == 0 and t.stride(0) % self.key.vec == 0
                assert t.stride(1) % self.key.vec == 0
        if self.key.backward:
            y, g, dx = tensors
            dx.copy_(backward_from_output(y, g, 1, self.key.log, torch.float32).to(dx.dtype))
        else:
            x, y = tensors
            y.copy_((torch.log_softmax if self.key.log else torch.softmax)(x.float(), 1).to(y.dtype))


@pytest.fixture
def fake_kernels(monkeypatch):
    made = []

    def kernel(key):
        made.append(FakeKernel(key))
        return made[-1]

    monkeypatch.setattr(compiler, "kernel", kernel)
    monkeypatch.setattr(env, "compile_arch", lambda: "sm_90a")
    monkeypatch.setattr(env, "tvm_ffi_available", lambda: True)
    return made


def _input(kind, gen):
    base = torch.randn(6, 40, 48, generator=gen)
    return {
        "2d": base[0],
        "3d": base,
        "sliced-rows": base[0][:, 8:40],  # row stride 48, pointer 32 bytes in
        "unaligned": base.reshape(-1)[1:1 + 5 * 44].view(5, 44),  # pointer 4 bytes in: narrower vectors
        "expanded": base[0, :1].expand(7, 48),
        "column": base[0, 0].reshape(48, 1),  # dim 0 of (48, 1): one row
        "dim0": base[0],  # the column kernels from here on
        "dim1-of-3d": base,
        "dim0-sliced": base[0][:, 8:40],  # reduced stride 48, 32 inner positions
        "dim0-odd": base[0][:, 3:40],  # 37 inner positions at 12 bytes in: vec 1
    }[kind]


COLUMN_KINDS = {"dim0": 0, "dim1-of-3d": 1, "dim0-sliced": 0, "dim0-odd": 0}


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["2d", "3d", "sliced-rows", "unaligned", "expanded", "column", *COLUMN_KINDS])
def test_forward_path(fake_kernels, kind, dtype, log, gen):
    x = _input(kind, gen).to(dtype) if dtype != torch.float32 else _input(kind, gen)
    dim = 0 if kind == "column" else COLUMN_KINDS.get(kind, -1)
    spec = SoftmaxSpec.from_tensor(x, dim, log=log)
    out = BACKEND.launcher(x, spec)(x)
    result = compare(out, x, spec)
    assert result.ok, result.detail
    assert len(fake_kernels) == 1
    if kind == "unaligned" and dtype == torch.float32:
        assert fake_kernels[0].key.vec == 1
    assert bool(fake_kernels[0].key.lanes) == (kind in COLUMN_KINDS)
    if kind == "dim0-odd":
        assert fake_kernels[0].key.vec == 1


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("grad_kind", ["contiguous", "transposed", "float32", "offset"])
def test_backward_path(fake_kernels, grad_kind, log, gen):
    y = torch.softmax(torch.randn(5, 64, generator=gen), -1).to(torch.bfloat16)
    g = torch.randn(5, 64, generator=gen)
    g = {"contiguous": g.to(torch.bfloat16), "transposed": g.t().contiguous().t().to(torch.bfloat16),
         "float32": g, "offset": torch.randn(5 * 64 + 1, generator=gen).to(torch.bfloat16)[1:].view(5, 64)}[grad_kind]
    spec = replace(SoftmaxSpec.from_tensor(y, -1, log=log), in_dtype=y.dtype, out_dtype=y.dtype)
    dx = BACKEND.backward_launcher(y, spec)(y, g)
    result = compare_backward(dx, y, g.to(y.dtype), spec)
    assert result.ok, result.detail


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim", [((40, 48), 0), ((3, 40, 16), 1), ((40, 37), 0)])
def test_backward_path_columns(fake_kernels, shape, dim, log, gen):
    y = torch.softmax(torch.randn(shape, generator=gen), dim).to(torch.bfloat16)
    g = torch.randn(shape, generator=gen).transpose(0, -1).contiguous().transpose(0, -1)  # not contiguous
    spec = replace(SoftmaxSpec.from_tensor(y, dim, log=log), in_dtype=y.dtype, out_dtype=y.dtype)
    dx = BACKEND.backward_launcher(y, spec)(y, g)
    result = compare_backward(dx, y, g.to(y.dtype), spec)
    assert result.ok, result.detail
    assert fake_kernels[-1].key.lanes and fake_kernels[-1].key.backward


def test_plans_are_memoised(fake_kernels):
    x = torch.randn(4, 4096)
    spec = SoftmaxSpec.from_tensor(x, -1)
    assert BACKEND.plan(False, spec, 4096, 64) is BACKEND.plan(False, spec, 4096, 64)


def test_rows_view_shares_storage():
    base = torch.randn(4, 10)
    v = launch.rows_view(base[:, 2:7], 4, 5, 10)
    assert v.data_ptr() == base[:, 2:7].data_ptr() and v.stride() == (10, 1)
