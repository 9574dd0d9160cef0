"""The ops inside CUDA graphs, as a serving engine's decode step runs them: warmed up on a side
stream, captured once, replayed on fresh data copied into the captured inputs, with the
captured outputs poisoned before each replay; through Triton's launcher and the native one."""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax.backends._triton_common import native_launch
from anysoftmax.compat.vllm import merge_attn_states
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare, compare_backward, compare_logsumexp, compare_merge
from anysoftmax.core.lse_merge import logsumexp_request

pytestmark = pytest.mark.gpu


def _flat(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def _replayed(fn, make_inputs, check, rounds: int = 2):
    """Capture `fn(*inputs)` after three warm-up calls on a side stream (the first compiles and
    binds the request), then, `rounds` times: copy fresh inputs in, poison the outputs, replay,
    `check(outputs, inputs)`."""
    static = make_inputs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn(*static)
    for _ in range(rounds):
        for dst, src in zip(_flat(static), _flat(make_inputs())):
            dst.copy_(src)
        for t in _flat(outputs):
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(outputs, static)


@pytest.fixture(params=["triton", "native"])
def launcher(request, monkeypatch):
    if request.param == "native" and native_launch.unavailable() is not None:
        pytest.fail(f"the native launcher does not build on this GPU host: {native_launch.unavailable()}")
    monkeypatch.setattr(native_launch, "LAUNCHER", request.param)
    anysoftmax.refresh()  # (bound launchers read the launcher when they are bound)
    yield request.param
    anysoftmax.refresh()


@pytest.mark.parametrize("shape,dtype", [((16, 1024), torch.bfloat16), ((4, 131072), torch.float32)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_in_a_graph(shape, dtype, log, launcher):
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    make = lambda: (torch.randn(shape, device="cuda", dtype=dtype) * 3,)  # noqa: E731

    def check(y, inputs):
        c = compare(y, inputs[0], SoftmaxSpec.from_tensor(inputs[0], -1, log=log), device="cuda")
        assert c.ok, c.detail

    _replayed(lambda x: fn(x, -1, backend="triton"), make, check)


def test_fused_softmax_and_backward_in_a_graph(launcher):
    make = lambda: (torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.float16) * 3,  # noqa: E731
                    torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.float16))

    def run(x, g):
        y = anysoftmax.softmax(x, -1, scale=0.125, causal=True, backend="triton")
        return y, anysoftmax.softmax_backward(y, g, -1, backend="triton")

    def check(outs, inputs):
        x, g = inputs
        y, dx = outs
        spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=0.125, causal=True))
        c = compare(y, x, spec, device="cuda")
        assert c.ok, c.detail
        c = compare_backward(dx, y, g, SoftmaxSpec.from_tensor(y, -1), device="cuda")
        assert c.ok, c.detail

    _replayed(run, make, check)


def test_logsumexp_in_a_graph(launcher):
    make = lambda: (torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16) * 3,)  # noqa: E731

    def check(lse, inputs):
        spec, _ = logsumexp_request(inputs[0], -1)
        c = compare_logsumexp(lse.unsqueeze(-1), inputs[0], spec, device="cuda")
        assert c.ok, c.detail

    _replayed(lambda x: anysoftmax.logsumexp(x, -1, backend="triton"), make, check)


@pytest.mark.parametrize("k,tokens", [(2, 1), (8, 1), (2, 300)])
def test_merge_states_in_a_graph(k, tokens, launcher):
    def make():
        outs = [torch.randn(tokens, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(k)]
        lses = [torch.randn(32, tokens, device="cuda").t() * 4 for _ in range(k)]  # vLLM's layout
        lses[0][0, 0] = float("-inf")  # (an empty segment)
        return outs, lses

    def check(result, inputs):
        c = compare_merge(*result, *inputs, device="cuda")
        assert c.ok, c.detail

    _replayed(lambda outs, lses: anysoftmax.merge_states(outs, lses, backend="triton"), make, check)


def test_vllm_merge_attn_states_in_a_graph(launcher):
    tokens = 7
    out = torch.empty(tokens, 32, 128, device="cuda", dtype=torch.bfloat16)
    out_lse = torch.empty(32, tokens, device="cuda")

    def make():
        return [torch.randn(tokens, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)], \
            [torch.randn(32, tokens, device="cuda") * 4 for _ in range(2)]

    def run(outs, lses):
        merge_attn_states(out, outs[0], lses[0], outs[1], lses[1], out_lse)
        return out, out_lse

    def check(result, inputs):
        c = compare_merge(result[0], result[1].t(), inputs[0], [t.t() for t in inputs[1]], device="cuda")
        assert c.ok, c.detail

    _replayed(run, make, check)
