"""The `cute` backend's host side on a machine without a GPU: registration, availability and
refusal reasons, and the per-call path (views, strides, alignment, dtypes) with the compiled
kernel replaced by a torch implementation of the same contract (it writes softmax of its
(rows, n) input into its (rows, n) output; a column kernel over dim 1 of (outer, n, inner)
tensors; a logsumexp kernel one float32 a row into its (rows,) output), checked against the
float64 reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import anysoftmax
from anysoftmax.backends.cute import CuteBackend, compiler, env, launch
from anysoftmax.backends.cute.backend import lse_rows_of, request_layout
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare, compare_backward, compare_logsumexp
from anysoftmax.core.lse_merge import logsumexp_request, row_shape
from anysoftmax.core.reference import fused_backward, prologue
from anysoftmax.core.variant import Variant

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


def _fused_spec(shape, dim=-1, **fused):
    x = torch.empty(shape, device="meta")
    spec, _ = SoftmaxSpec.from_request(x, dim, fused=fused)
    return replace(spec, device=torch.device("cuda", 0))


def test_supports_the_fused_prologue(capable):
    assert BACKEND.supports(_fused_spec((8, 65536), scale=0.125)) is None
    assert BACKEND.supports(_fused_spec((8, 262144), softcap=30.0)) is None
    assert BACKEND.supports(_fused_spec((8, 1000), scale=-2.0, softcap=50.0)) is None


@pytest.mark.parametrize("fused,match", [
    (dict(mask=torch.zeros(8, 64, dtype=torch.bool)), r"fuses scale and softcap only, not mask=bool"),
    (dict(causal=True, scale=0.5), r"not scale=0.5, causal=top_left"),
    (dict(sinks=torch.zeros(8, 1)), r"not sinks\[8, 1\].*'triton'"),
])
def test_refuses_the_other_fused_steps(capable, fused, match):
    fused = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in fused.items()}
    reason = BACKEND.supports(_fused_spec((8, 64), **fused))
    assert reason is not None and __import__("re").search(match, reason), reason


def test_refuses_fused_columns(capable):
    reason = BACKEND.supports(_fused_spec((8192, 8192), dim=0, scale=0.5))
    assert "row kernels only" in reason and "strided" in reason


def test_rows_of():
    assert request_layout(_spec((6, 10)), (10, 1)) == (6, 10, 10)
    assert request_layout(_spec((2, 3, 10)), (30, 10, 1)) == (6, 10, 10)
    assert request_layout(_spec((6, 10)), (0, 1)) == (6, 10, 0)
    assert request_layout(_spec((10, 1), dim=0), (1, 1)) == (1, 10, 10)


# ---------------------------------------------------------------- the per-call path

class FakeKernel:
    """The compiled kernel's contract, in torch: (rows, n) tensors with unit column stride."""

    def __init__(self, key):
        self.key = key
        self.calls = []

    def __call__(self, *args):
        n = len(self.key.operand_dtypes)
        tensors, values = args[:n], args[n:]
        assert len(values) == (2 if self.key.fused or self.key.states else 0)  # (scale, softcap)
        self.calls.append([(tuple(t.shape), tuple(t.stride())) for t in tensors])
        variant = Variant(scale=values[0] if self.key.scaled else None, softcap=values[1] if self.key.capped else None)
        if self.key.states:  # (rows, n) x, the (rows,) float32 lse: contiguous
            x, lse = tensors
            assert x.dim() == 2 and x.stride(1) == 1 and lse.dim() == 1 and lse.stride(0) == 1
            assert lse.dtype == torch.float32 and x.data_ptr() % (self.key.vec * x.element_size()) == 0
            assert not self.key.staged
            lse.copy_(torch.logsumexp(prologue(x, variant, None, torch.float32), 1))
            return
        # Row kernels: (rows, n), reduced over dim 1; column kernels: (outer, n, inner), over dim 1.
        rank = 3 if self.key.lanes else 2
        for t in tensors:
            assert t.dim() == rank and (t.stride(-1) == 1 or t.shape[-1] == 1)
            assert t.data_ptr() % (self.key.vec * t.element_size()) == 0, "misaligned for the compiled vectors"
            if self.key.lanes:  # the compiled assumptions on the inner extent and the strides
                assert t.shape[2] % self.key.vec == 0 and t.stride(0) % self.key.vec == 0
                assert t.stride(1) % self.key.vec == 0
        for t, dtype in zip(tensors, self.key.operand_dtypes):
            assert str(t.dtype) == f"torch.{dtype}", (t.dtype, dtype)
        if self.key.backward:
            y, g, dx = tensors[:3]
            x = tensors[3] if self.key.fused else None
            dx.copy_(fused_backward(g, y, x, variant, 1, self.key.log, None, None, torch.float32)[0].to(dx.dtype))
        else:
            x, y = tensors
            z = prologue(x, variant, None, torch.float32)
            y.copy_((torch.log_softmax if self.key.log else torch.softmax)(z, 1).to(y.dtype))


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


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("fused", [dict(scale=0.3), dict(softcap=2.0), dict(scale=-1.5, softcap=3.0)])
@pytest.mark.parametrize("kind", ["2d", "3d", "sliced-rows", "unaligned"])
def test_fused_paths(fake_kernels, monkeypatch, kind, fused, log, gen):
    """Forward and backward of the fused prologue through the API's own dispatch (cute chosen
    explicitly, the device check and the kernels stood in for), against the float64 reference."""
    from anysoftmax.core import registry

    monkeypatch.setattr(BACKEND, "is_available", lambda: None)
    monkeypatch.setattr(registry, "get_backend", lambda name: BACKEND)
    x = (_input(kind, gen) * 4).requires_grad_(True)
    monkeypatch.setattr(type(BACKEND), "devices", ("cpu", "cuda"))
    op = anysoftmax.log_softmax if log else anysoftmax.softmax
    cpu_spec = SoftmaxSpec.from_request(x.detach(), -1, log=log, fused=fused)[0]
    monkeypatch.setattr(BACKEND, "supports", lambda spec: None)
    y = op(x, -1, backend="cute", **fused)
    result = compare(y.detach(), x.detach(), cpu_spec)
    assert result.ok, result.detail
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    variant = cpu_spec.variant
    want = fused_backward(dy.double(), y.detach().double(), x.detach().double(), replace(
        variant, scale=fused.get("scale"), softcap=fused.get("softcap")), x.dim() - 1, log, None, None,
        torch.float64)[0]
    torch.testing.assert_close(dx.double(), want, rtol=1e-4, atol=1e-5)
    keys = [k.key for k in fake_kernels]
    assert any(k.fused and not k.backward for k in keys) and any(k.fused and k.backward for k in keys)
    assert all(k.capped == ("softcap" in fused) and k.scaled == ("scale" in fused) for k in keys)


def test_plans_are_memoised(fake_kernels):
    x = torch.randn(4, 4096)
    spec = SoftmaxSpec.from_tensor(x, -1)
    assert BACKEND.plan(False, spec, 4096, 64) is BACKEND.plan(False, spec, 4096, 64)


def test_rows_view_shares_storage():
    base = torch.randn(4, 10)
    v = launch.rows_view(base[:, 2:7], 4, 5, 10)
    assert v.data_ptr() == base[:, 2:7].data_ptr() and v.stride() == (10, 1)


# ---------------------------------------------------------------- logsumexp (the states kernels)

def _lse_spec(shape, dim=-1, dtype=torch.float32, strides=None, **fused):
    x = torch.empty(shape, dtype=dtype, device="meta")
    if strides is not None:
        x = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    fused = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in fused.items()}
    spec, _ = logsumexp_request(x, dim, **fused)
    return replace(spec, device=torch.device("cuda", 0))


def test_supports_logsumexp(capable):
    assert BACKEND.supports_logsumexp(_lse_spec((8, 65536))) is None
    assert BACKEND.supports_logsumexp(_lse_spec((4, 3, 1000), dtype=torch.bfloat16, scale=0.5, softcap=30.0)) is None
    assert BACKEND.supports_logsumexp(_lse_spec((2, 3, 5, 700), sinks=torch.zeros(3, 1, 1))) is None
    # The reduced dim contiguous but not last (the softmax's column case): the row kernels read it.
    assert BACKEND.supports_logsumexp(_lse_spec((700, 6), dim=0, strides=(1, 700))) is None
    assert BACKEND.supports_logsumexp(_lse_spec((5, 7), strides=(0, 1))) is None  # expanded rows


@pytest.mark.parametrize("spec,match", [
    (lambda: _lse_spec((8, 64), mask=torch.zeros(8, 64, dtype=torch.bool)),
     r"cute's logsumexp takes scale, softcap and sinks only, not mask=bool.*\(masks and causal: backend 'triton'\)"),
    (lambda: _lse_spec((8, 64), causal=True, sinks=torch.zeros(8, 1)), r"only, not .*causal"),
    (lambda: _lse_spec((8, 64), dtype=torch.float64), "float64 is not supported"),
    (lambda: replace(_lse_spec((8, 64)), device=torch.device("cpu")), "device type 'cpu'"),
    (lambda: _lse_spec((8192, 64), dim=0), r"reduced dim 0 of \[8192, 64\] is strided \(input stride 64\).*'triton'"),
    (lambda: _lse_spec((3, 4, 5), strides=(100, 20, 1)), "not equally spaced"),
])
def test_logsumexp_refusals_name_the_reason(capable, spec, match):
    reason = BACKEND.supports_logsumexp(spec())
    assert reason is not None and __import__("re").search(match, reason), reason


def test_logsumexp_is_declared_to_the_registry(capable):
    """The registry sees the op (`run_logsumexp`): a served request passes, a refused one gets
    cute's reason, and merge_states stays a declared refusal."""
    from anysoftmax.core import registry
    from anysoftmax.core.lse_merge import MergeSpec

    assert registry.op_refusal(BACKEND, "logsumexp", _lse_spec((4, 65536), softcap=20.0)) is None
    assert "masks and causal" in registry.op_refusal(BACKEND, "logsumexp", _lse_spec((4, 64), causal=True))
    merge = MergeSpec(2, (4, 64), torch.float32, (torch.float32,) * 2, torch.device("cuda", 0))
    assert "no merge_states kernel" in registry.op_refusal(BACKEND, "merge_states", merge)


def test_logsumexp_refused_through_the_api(monkeypatch):
    """An explicit request that cute refuses raises with its reason (the fused steps are
    checked before the device: this runs on a CPU tensor)."""
    monkeypatch.setattr(type(BACKEND), "is_available", lambda self: None)
    x = torch.randn(4, 64)
    with pytest.raises(anysoftmax.UnsupportedRequestError, match="cute.*takes scale, softcap and sinks only"):
        anysoftmax.logsumexp(x, -1, mask=torch.ones(4, 64, dtype=torch.bool), backend="cute")


@pytest.mark.parametrize("fused", [{}, dict(scale=-0.7), dict(softcap=2.0), dict(scale=1.5, softcap=3.0), "sinks"])
@pytest.mark.parametrize("kind", ["2d", "3d", "sliced-rows", "unaligned", "expanded", "column", "transposed"])
def test_logsumexp_path(fake_kernels, kind, fused, gen):
    """The launcher's views, alignment, result layout and sink fold, with the states kernel
    stood in for, against the float64 reference."""
    x = _input("dim0" if kind == "transposed" else kind, gen)  # (views: the layouts are the point)
    if kind == "transposed":
        x = x.t()  # (48, 40): dim 0 is contiguous, rows 40 apart
    dim = 0 if kind in ("column", "transposed") else -1
    if fused == "sinks":
        sinks = torch.randn(row_shape(tuple(x.shape), dim % x.dim()), generator=gen) * 4
        fused = dict(sinks=sinks[..., :1, :] if kind == "3d" else sinks)  # 3d: broadcast over a row dim
    spec, ops = logsumexp_request(x, dim, **fused)
    assert lse_rows_of(spec, tuple(x.stride())) == lse_rows_of(spec, spec.strides)
    lse = BACKEND.logsumexp_launcher(x, spec, ops)(x, ops)
    result = compare_logsumexp(lse, x, spec, None, fused.get("sinks"))
    assert result.ok, result.detail
    (kernel,) = fake_kernels
    assert kernel.key.states and not kernel.key.backward and not kernel.key.staged
    assert (kernel.key.scaled, kernel.key.capped) == ("scale" in fused, "softcap" in fused)
    if kind == "unaligned":
        assert kernel.key.vec == 1


def test_logsumexp_through_the_api(fake_kernels, monkeypatch, gen):
    """`anysoftmax.logsumexp(..., backend="cute")` reaches the launcher (dispatch memoises it
    per request: a repeated call plans nothing) and gives keepdim and flat results."""
    from anysoftmax.core import registry

    monkeypatch.setattr(BACKEND, "is_available", lambda: None)
    monkeypatch.setattr(registry, "get_backend", lambda name: BACKEND)
    monkeypatch.setattr(BACKEND, "supports_logsumexp", lambda spec: None)
    x = torch.randn(6, 4096, generator=gen) * 5
    sinks = torch.randn(6, 1, generator=gen)
    lse = anysoftmax.logsumexp(x, -1, scale=0.5, sinks=sinks, keepdim=True, backend="cute")
    spec, _ = logsumexp_request(x, -1, scale=0.5, sinks=sinks)
    result = compare_logsumexp(lse, x, spec, None, sinks)
    assert result.ok, result.detail
    flat = anysoftmax.logsumexp(x, -1, scale=0.5, sinks=sinks, backend="cute")
    assert flat.shape == (6,) and torch.equal(flat, lse.view(6))
    # keepdim and flat are two requests (their own memo entries), each bound once to the same
    # kernel (the compiler caches it by key); repeated calls plan nothing more.
    anysoftmax.logsumexp(x, -1, scale=0.5, sinks=sinks, keepdim=True, backend="cute")
    anysoftmax.logsumexp(x, -1, scale=0.5, sinks=sinks, backend="cute")
    assert len(fake_kernels) == 2 and fake_kernels[0].key == fake_kernels[1].key
    assert [len(k.calls) for k in fake_kernels] == [2, 2]


def test_logsumexp_plan_is_the_forward_plan(fake_kernels):
    """The states kernel runs the softmax forward's plan (CTAs, vectors, tiles) under its own
    memo key, without tiles held in shared memory."""
    x = torch.randn(2, 1 << 20, dtype=torch.bfloat16)
    spec, _ = logsumexp_request(x, -1)
    fwd = BACKEND.plan(False, spec, 1 << 20, 64)
    lse = BACKEND.plan(False, spec, 1 << 20, 64, states=True)
    assert fwd.two_pass and fwd.staged and lse == replace(fwd, states=True, staged=0)
    assert BACKEND.plan(False, spec, 1 << 20, 64, states=True) is lse
