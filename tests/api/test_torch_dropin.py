"""anysoftmax as a drop-in for torch code: torch's signatures, `nn` modules, and the opt-in
override that serves an unmodified model's own softmax calls."""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import anysoftmax
from anysoftmax.torchop import override
from anysoftmax.core import registry
from anysoftmax.core.reference import backward_from_output
from helpers import StubBackend, runnable_backends

REPO = Path(__file__).resolve().parents[2]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # gpu: skipped with the reason without CUDA


class CountingBackend(StubBackend):
    """Computes softmax with torch's formula in float64 (a different code path from torch's
    kernels: results must still match) and counts the calls it serves."""

    name, priority = "counting", -1

    def __init__(self, devices=("cpu",)):
        self.devices = devices
        self.forward = 0
        self.backward = 0

    def run(self, x, spec):
        self.forward += 1
        z = x.double()
        y = torch.log_softmax(z, spec.dim) if spec.log else torch.softmax(z, spec.dim)  # re-enters: decomposed
        return y.to(spec.out_dtype)

    def run_backward(self, y, grad, spec):
        self.backward += 1
        return backward_from_output(y, grad, spec.dim, spec.log, torch.float64).to(y.dtype)


@pytest.fixture
def counting():
    devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    b = anysoftmax.register(CountingBackend(devices))
    try:
        yield b
    finally:
        anysoftmax.disable()
        registry.unregister("counting")


# ----------------------------------------------------------------- signatures

@pytest.mark.parametrize("log", [False, True])
def test_torch_positions_and_keywords(log, gen):
    x = torch.randn(4, 7, generator=gen)
    ours, theirs = (anysoftmax.log_softmax, torch.log_softmax) if log else (anysoftmax.softmax, torch.softmax)
    f = torch.nn.functional.log_softmax if log else torch.nn.functional.softmax
    want = theirs(x, 1, dtype=torch.float64)
    for got in (ours(x, 1, torch.float64),               # torch.softmax(x, dim, dtype) positional
                ours(input=x, dim=1, dtype=torch.float64),  # keywords
                ours(x, 1, 3, torch.float64),            # F.softmax(x, dim, _stacklevel, dtype)
                ours(x, dim=1, _stacklevel=5, dtype=torch.float64)):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(ours(x, -1), f(x, -1))
    with pytest.raises(TypeError):
        ours(x, 1, backend="torch", unknown=True)


@pytest.mark.parametrize("ndim", [0, 1, 2, 3, 4])
def test_dim_none_resolved_and_warned_as_torch(ndim, gen):
    x = torch.randn([3] * ndim, generator=gen)
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        want = torch.nn.functional.softmax(x, dim=None)
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        got = anysoftmax.softmax(x)
    torch.testing.assert_close(got, want)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert ours and ours[0].filename == __file__, "the warning must point at the caller's line, as torch's does"


def test_backend_is_keyword_only(gen):
    x = torch.randn(2, 3, generator=gen)
    with pytest.raises(TypeError):
        anysoftmax.softmax(x, 1, None, 3, "torch")


# ----------------------------------------------------------------- nn modules

@pytest.mark.parametrize("log", [False, True])
def test_modules_behave_as_torchs(log, gen):
    ours_cls, torch_cls = (anysoftmax.nn.LogSoftmax, torch.nn.LogSoftmax) if log else (anysoftmax.nn.Softmax,
                                                                                       torch.nn.Softmax)
    m, ref = ours_cls(dim=1), torch_cls(dim=1)
    assert isinstance(m, torch_cls)
    assert repr(m) == repr(ref)
    assert repr(ours_cls(1, backend="torch")).endswith("backend='torch')")
    assert m.state_dict() == ref.state_dict() == {}
    x = torch.randn(3, 5, generator=gen)
    torch.testing.assert_close(m(x), ref(x))
    seq = torch.nn.Sequential(torch.nn.Linear(5, 5), ours_cls(-1, backend="torch"))
    seq.load_state_dict(copy.deepcopy(seq.state_dict()))
    clone = pickle.loads(pickle.dumps(seq))
    torch.testing.assert_close(clone(x), seq(x))
    buf = io.BytesIO()
    torch.save(seq, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False)(x), seq(x))


def test_module_dim_none_as_torch(gen):
    x = torch.randn(2, 3, 4, generator=gen)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        got = anysoftmax.nn.Softmax()(x)
    with pytest.warns(UserWarning):
        torch.testing.assert_close(got, torch.nn.Softmax()(x))


# ----------------------------------------------------------------- the override

def _all_softmax_spellings(x):
    return [torch.softmax(x, -1), torch.log_softmax(x, -1), torch.nn.functional.softmax(x, -1),
            torch.nn.functional.log_softmax(x, -1), x.softmax(-1), x.log_softmax(-1),
            torch.nn.Softmax(-1)(x), torch.nn.LogSoftmax(-1)(x), torch.special.softmax(x, -1)]


@pytest.mark.parametrize("device", DEVICES)
def test_override_serves_every_spelling_and_restores_torch(device, counting, gen):
    x = torch.randn(6, 33, generator=gen).to(device)
    want = _all_softmax_spellings(x)
    assert anysoftmax.enabled() == ()
    with anysoftmax.use(backend="counting") as served:
        assert device in served
        got = _all_softmax_spellings(x)
    assert counting.forward == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert anysoftmax.enabled() == ()
    _all_softmax_spellings(x)  # torch again: nothing reaches the backend
    assert counting.forward == len(want)


def test_override_recursion_is_served_by_torch_and_counted_apart(counting, gen):
    # CountingBackend itself calls torch.softmax: that call must not come back to it. The
    # counters tell the call the override served from the one the backend made.
    x = torch.randn(4, 9, generator=gen)
    before = dict(override.calls)
    with anysoftmax.use(backend="counting"):
        y = torch.softmax(x, 1)
    assert counting.forward == 1
    assert {k: override.calls[k] - before.get(k, 0) for k in override.calls} == {
        "forward": 1, "backward": 0, "reentrant": 1}
    torch.testing.assert_close(y, torch.softmax(x, 1))


class NoFloat64(CountingBackend):
    """A CPU backend that declares it does not take float64."""

    name = "no_float64"

    def supports(self, spec):
        if torch.float64 in (spec.in_dtype, spec.out_dtype):
            return "this test backend computes float16, bfloat16 and float32 only"
        return None


@pytest.mark.parametrize("entry", ["softmax", "log_softmax"])
def test_override_with_a_named_backend_raises_on_a_request_it_refuses(entry, gen):
    """use(backend=X) is explicit, as backend=X is: a request X refuses raises naming X and the
    reason, never runs torch's kernel instead."""
    b = anysoftmax.register(NoFloat64())
    try:
        x = torch.randn(4, 9, generator=gen, dtype=torch.float64)
        with anysoftmax.use(backend="no_float64", devices=("cpu",)):
            with pytest.raises(anysoftmax.UnsupportedRequestError,
                               match=r"backend 'no_float64' .*float32 only"):
                getattr(torch, entry)(x, 1)
            got = getattr(torch, entry)(x.float(), 1)  # a request it takes is served
        assert b.forward == 1
        torch.testing.assert_close(got, getattr(torch, entry)(x.float(), 1))
    finally:
        anysoftmax.disable()
        registry.unregister("no_float64")


def test_override_other_devices_untouched(counting, gen):
    anysoftmax.enable(backend="counting", devices=("cuda",))  # registered only for CUDA
    try:
        x = torch.randn(4, 9, generator=gen)
        torch.testing.assert_close(torch.softmax(x, 1), torch.nn.functional.softmax(x, 1))
        assert counting.forward == 0
    finally:
        anysoftmax.disable()


class CudaOnly(StubBackend):
    """Available, but runs CUDA tensors only (as the cute backend does)."""

    name, devices = "cuda_only", ("cuda",)

    def supports(self, spec):
        return None if spec.device.type == "cuda" else f"device type {spec.device.type!r}: CUDA GPUs only"


class Unavailable(StubBackend):
    name = "unavailable_here"

    def is_available(self):
        return "needs hardware this machine lacks"


def test_enable_refuses_a_backend_that_cannot_run_the_devices_named():
    anysoftmax.register(CudaOnly())
    anysoftmax.register(Unavailable())
    try:
        with pytest.raises(ValueError, match=r"'cuda_only' cannot run cpu tensors here: .*CUDA GPUs only"):
            anysoftmax.enable(backend="cuda_only", devices=("cpu",))
        with pytest.raises(ValueError, match=r"devices=\('cpu',\)"):
            with anysoftmax.use(backend="cuda_only", devices=("cpu",)):
                pass
        with pytest.raises(anysoftmax.BackendUnavailableError, match="needs hardware this machine lacks"):
            anysoftmax.enable(backend="unavailable_here", devices=("cpu",))
        # cute runs CUDA GPUs of sm_90+ only: unavailable on a machine without one, refusing CPU
        # tensors on one.
        with pytest.raises((ValueError, anysoftmax.BackendUnavailableError), match="'cute'"):
            anysoftmax.enable(backend="cute", devices=("cpu",))
        assert anysoftmax.enabled() == ()
    finally:
        anysoftmax.disable()
        registry.unregister("cuda_only")
        registry.unregister("unavailable_here")


def test_enable_refuses_triton_on_cpu_without_the_interpreter():
    """Without TRITON_INTERPRET, Triton runs no CPU tensor: enable() says so instead of
    registering an override whose every call would fail (a fresh interpreter: the choice is
    process-wide)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_INTERPRET": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    code = ("import anysoftmax\n"
            "try:\n"
            "    anysoftmax.enable(backend='triton', devices=('cpu',))\n"
            "except (ValueError, anysoftmax.BackendUnavailableError) as exc:\n"
            "    print(type(exc).__name__, exc)\n"
            "print('enabled:', anysoftmax.enabled())\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "'triton'" in res.stdout and "TRITON_INTERPRET" in res.stdout, res.stdout
    assert res.stdout.strip().endswith("enabled: ()"), res.stdout


def test_override_bad_arguments():
    with pytest.raises(ValueError, match="unknown backend"):
        anysoftmax.enable(backend="no_such_backend")
    with pytest.raises(ValueError, match="cannot be overridden"):
        anysoftmax.enable(backend="torch", devices=("tpu",))
    assert anysoftmax.enabled() == ()


def test_override_nested_blocks_restore_outer_choice(counting):
    with anysoftmax.use(backend="counting", devices=("cpu",)):
        with anysoftmax.use(backend="torch", devices=("cpu",)):
            assert anysoftmax.enabled() == ("cpu",)
        assert override._active["backend"] == "counting"
    assert anysoftmax.enabled() == ()


def _grads(module, call, x, seed):
    out = call(x)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device)).sum() for o in outs)
    loss.backward()
    return [o.detach().clone() for o in outs], [p.grad.clone() for p in module.parameters()], x.grad.clone()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", ["encoder_layer", "mha"])
def test_unmodified_model_under_override(device, model, counting, gen):
    """An unmodified TransformerEncoderLayer (forward and backward) and MultiheadAttention give
    eager's outputs and gradients under the override, and the calls were served by anysoftmax.
    On CPU torch's default attention is a fused kernel without a softmax op: the math path
    (the one that calls softmax) is chosen so there is something to serve."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    if model == "encoder_layer":
        m = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(device).double()
        call = lambda x: m(x)  # noqa: E731
    else:
        m = torch.nn.MultiheadAttention(32, 4, batch_first=True).to(device).double()
        call = lambda x: m(x, x, x, need_weights=True)  # noqa: E731
    x = torch.randn(2, 7, 32, generator=gen, dtype=torch.float64).to(device)

    def run():
        m.zero_grad()
        xi = x.clone().requires_grad_()
        with sdpa_kernel(SDPBackend.MATH):
            return _grads(m, call, xi, seed=1)

    want = run()
    with anysoftmax.use(backend="counting"):
        got = run()
    assert counting.forward >= 1 and counting.backward >= 1, (counting.forward, counting.backward)
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(got[2], want[2])


@pytest.mark.parametrize("device", DEVICES)
def test_override_with_real_backends(device, gen):
    """The override with each backend that runs here (not a test double): an attention block's
    forward and gradients match eager torch's within the dtype's tolerance."""
    for name in runnable_backends(device):
        if name == "wave":
            continue  # no autograd-free double path needed: wave is covered by its own GPU tests
        x = torch.randn(3, 5, 16, generator=gen).to(device).requires_grad_()
        w = torch.randn(16, 16, generator=gen).to(device)
        scores = lambda t: (t @ w) @ t.transpose(1, 2) / 4  # noqa: E731
        want = torch.softmax(scores(x), -1)
        (gw,) = torch.autograd.grad(want.pow(2).sum(), x)
        with anysoftmax.use(backend=name, devices=(device,)):
            got = torch.softmax(scores(x), -1)
            (gg,) = torch.autograd.grad(got.pow(2).sum(), x)
        torch.testing.assert_close(got, want, msg=name)
        torch.testing.assert_close(gg, gw, msg=name)
