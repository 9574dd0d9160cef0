"""torch.compile sees the Triton kernels (issue 13): under torch.compile a request the `triton`
backend serves is traced to user-defined Triton kernels (`triton_kernel_wrapper_functional`
nodes, via the `anysoftmax::*_triton` triton_ops), not an opaque `anysoftmax::softmax` call.

On this CPU-only CI the kernels run through the Triton interpreter. torch's `wrap_triton` passes
an interpreted kernel through untraced (torch/_library/triton.py), so the traced path wraps a
`JITFunction` twin of each kernel whose launches run through the interpreter
(`backends/_triton_common/traced.py`): the graphs captured here are the ones a GPU compile
records, and they execute, so results and gradients are checked too. What only a GPU shows
(Inductor's generated code, CUDA graphs, cooperative plans) is in test_traced_kernels_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax.torchop import ops, registration  # noqa: F401  (the operators with their autograd and routing)
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare
from anysoftmax.core.layout import allocate_rows
from helpers import runnable_backends
from helpers.compile import WRAPPERS, Capture, compiled

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

PUBLIC_OPS = {torch.ops.anysoftmax.softmax.default, torch.ops.anysoftmax.softmax_backward.default}


def plan_kind(x: torch.Tensor, dim: int, backward: bool = False) -> str:
    spec = SoftmaxSpec.from_tensor(x, dim)
    x, y, layout = allocate_rows(x, spec)
    return anysoftmax.get_backend("triton").plan(x, y, layout, spec, backward=backward).kind


# (shape, dim, the forward plan kind the interpreter picks): every forward kernel the triton
# backend uses by default, the split one as two launches.
CASES = [((4, 37), -1, "tile"), ((2, 70000), -1, "split"), ((6, 40, 64), 1, "cols"),
         ((2, 3000, 64), 1, "cols_split")]
FORWARD_KERNELS = {"tile": ["softmax_tile_kernel"], "split": ["softmax_split_kernel"] * 2,
                   "cols": ["softmax_cols_kernel"], "cols_split": ["softmax_cols_split_kernel"] * 2}


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim,kind", CASES, ids=[c[2] for c in CASES])
def test_compiled_forward_is_user_triton_kernels(shape, dim, kind, log, gen):
    x = torch.randn(shape, generator=gen) * 3
    assert plan_kind(x, dim) == kind  # the case covers the kernel it names
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    cap = Capture()
    y = compiled(lambda t: fn(t, dim, backend="triton"), cap)(x)
    assert len(cap.graphs) == 1
    targets = cap.targets(0)
    assert not PUBLIC_OPS & set(targets), f"an opaque anysoftmax operator is left in the graph: {targets}"
    assert cap.kernels(0) == FORWARD_KERNELS[kind]
    result = compare(y, x, SoftmaxSpec.from_tensor(x, dim, log=log))
    assert result.ok, result.detail


@pytest.mark.parametrize("dtype,to", [(torch.float32, torch.float64), (torch.float64, torch.float32),
                                      (torch.bfloat16, None)])
def test_compiled_dtype_argument(dtype, to, gen):
    """dtype= widening (the kernel writes the wide output) and narrowing (a traced cast first)."""
    x = (torch.randn(5, 300, generator=gen) * 4).to(dtype)
    cap = Capture()
    y = compiled(lambda t: anysoftmax.softmax(t, 1, dtype=to, backend="triton"), cap)(x)
    assert cap.kernels(0) == ["softmax_tile_kernel"]
    assert compare(y, x, SoftmaxSpec.from_tensor(x, 1, to)).ok


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((4, 37), -1), ((2, 70000), -1), ((6, 40, 64), 1)],
                         ids=["tile", "split", "cols"])
def test_compiled_gradients_are_user_triton_kernels(shape, dim, log, gen):
    """The backward graph AOTAutograd builds from the registered autograd holds the backward
    kernel too (split rows: its two-launch form); gradients equal torch's."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    fn = anysoftmax.log_softmax if log else anysoftmax.softmax
    cap = Capture()
    a = x.clone().requires_grad_()
    y = compiled(lambda t: fn(t, dim, backend="triton"), cap)(a)
    y.backward(g)
    b = x.clone().requires_grad_()
    ref = (torch.log_softmax if log else torch.softmax)(b, dim)
    ref.backward(g)
    assert len(cap.graphs) == 2
    assert not PUBLIC_OPS & set(cap.targets(1)), cap.targets(1)
    split = plan_kind(y.detach(), dim, backward=True) == "split"
    assert cap.kernels(1) == ["softmax_bwd_kernel"] * (2 if split else 1)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_compiled_second_order(log, gen):
    """Second order through the compiled path: the compiled `softmax_backward` (the first-order
    gradient, a user kernel in the graph) differentiated again, against torch's
    _softmax_backward_data (whose derivatives are torch's double-backward formulas)."""
    x = torch.randn(5, 33, generator=gen, dtype=torch.float64)
    y = (torch.log_softmax if log else torch.softmax)(x, 1)
    g = torch.randn_like(x)
    w = torch.randn_like(x)
    cap = Capture()
    fn = compiled(lambda g_, y_: ops.softmax_backward_op(g_, y_, 1, log, backend="triton")[0], cap)
    ga, ya = g.clone().requires_grad_(), y.clone().requires_grad_()
    dx = fn(ga, ya)
    dx.backward(w)
    gb, yb = g.clone().requires_grad_(), y.clone().requires_grad_()
    ref = torch.ops.aten._softmax_backward_data(gb, yb, 1, torch.float64)
    if log:  # aten's log_softmax backward: grad - exp(y) * sum(grad)
        ref = torch.ops.aten._log_softmax_backward_data(gb, yb, 1, torch.float64)
    ref.backward(w)
    assert cap.kernels(0) == ["softmax_bwd_kernel"]
    # the second-order terms are torch ops (autodiff's formula of the backward)
    assert cap.kernels(1) == []
    torch.testing.assert_close(dx, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ga.grad, gb.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ya.grad, yb.grad, rtol=1e-10, atol=1e-12)


def test_attention_block_compiles_to_kernels_without_graph_breaks(gen):
    """A model shape (projections around softmax) compiled whole: kernels in both graphs,
    results and parameter gradients as in eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            return anysoftmax.softmax(q @ k.transpose(-1, -2) / 4.0, -1, backend="triton") @ v

    model = Block()
    x = torch.randn(2, 24, 16, generator=gen)
    cap = Capture()
    out = torch.compile(model, fullgraph=True, backend=cap.backend)(x)
    out.sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(x)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(got, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert cap.kernels(0) == ["softmax_tile_kernel"] and cap.kernels(1) == ["softmax_bwd_kernel"]
    assert torch._dynamo.explain(model)(x).graph_break_count == 0


def test_a_new_temperature_keeps_the_kernels_and_the_graph(gen):
    """scale and softcap as arguments of the compiled function (torch's default mode): the
    second value makes them symbols, applied before the kernels in torch ops (a float operator
    argument would recompile per value); every later value reuses that graph, kernels in both
    of its graphs, results and gradients right."""
    x = torch.randn(3, 40, generator=gen) * 3
    mask = torch.rand(3, 40, generator=gen) < 0.2
    cap = Capture()
    fn = compiled(lambda t, s, c: anysoftmax.softmax(t, -1, scale=s, softcap=c, mask=mask, backend="triton"), cap)
    for s, c in ((0.5, 4.0), (0.7, 5.0), (1.3, 2.5)):
        xg = x.clone().requires_grad_()
        y = fn(xg, s, c)
        y.backward(torch.ones_like(y) + x)
        want = x.double().requires_grad_()
        ref = anysoftmax.softmax(want, -1, scale=s, softcap=c, mask=mask, backend="torch")
        ref.backward(torch.ones_like(ref) + x.double())
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(xg.grad.double(), want.grad, rtol=1e-4, atol=1e-5)
    assert len(cap.graphs) == 4  # (forward and backward of the constant values, then of the symbols)
    assert cap.kernels(2) == ["softmax_tile_kernel"] and cap.kernels(3) == ["softmax_bwd_kernel"]


# ---- routing: what stays an opaque operator ------------------------------------------------

def test_other_backends_keep_the_opaque_operator(gen):
    x = torch.randn(4, 37, generator=gen)
    cap = Capture()
    y = compiled(lambda t: anysoftmax.softmax(t, -1, backend="torch"), cap)(x)
    assert torch.ops.anysoftmax.softmax.default in cap.targets(0) and cap.kernels(0) == []
    assert compare(y, x, SoftmaxSpec.from_tensor(x, -1)).ok


def test_inductor_on_cpu_tensors_keeps_the_opaque_operator(gen):
    """Inductor compiles a user Triton kernel for its tensors' device, which needs a Triton
    driver; the interpreter is none. So torch.compile's default backend on CPU tensors keeps
    the operator (which runs the interpreted kernels): plain and fused, forward and backward."""
    x = torch.randn(4, 37, generator=gen, dtype=torch.float64) * 2
    mask = torch.rand(4, 37, generator=gen) < 0.2
    g = torch.randn(4, 37, generator=gen, dtype=torch.float64)
    for kw in (dict(), dict(scale=0.5, softcap=4.0, mask=mask)):
        torch._dynamo.reset()
        fn = torch.compile(lambda t: anysoftmax.log_softmax(t, -1, backend="triton", **kw), fullgraph=True)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        y = fn(xa)
        ref = anysoftmax.log_softmax(xb, -1, backend="torch", **kw)
        torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
        gm = g.masked_fill(torch.isinf(ref), 0.0)
        torch.testing.assert_close(torch.autograd.grad(y, xa, gm)[0], torch.autograd.grad(ref, xb, gm)[0],
                                   rtol=1e-10, atol=1e-12)


def test_switch_keeps_the_opaque_operator(monkeypatch, gen):
    monkeypatch.setenv("ANYSOFTMAX_COMPILE_KERNELS", "0")
    x = torch.randn(4, 37, generator=gen)
    cap = Capture()
    y = compiled(lambda t: anysoftmax.softmax(t, -1, backend="triton"), cap)(x)
    assert torch.ops.anysoftmax.softmax.default in cap.targets(0) and cap.kernels(0) == []
    assert compare(y, x, SoftmaxSpec.from_tensor(x, -1)).ok


def test_dynamic_shapes_keep_the_opaque_operator(gen):
    """A plan is chosen per shape: a graph with symbolic sizes keeps the operator (which plans
    each call at run time) instead of specializing on the first shape."""
    cap = Capture()
    torch._dynamo.reset()
    fn = torch.compile(lambda t: anysoftmax.softmax(t, -1, backend="triton"), fullgraph=True,
                       backend=cap.backend, dynamic=True)
    for n in (37, 50):
        x = torch.randn(4, n, generator=gen)
        assert compare(fn(x), x, SoftmaxSpec.from_tensor(x, -1)).ok
    assert torch.ops.anysoftmax.softmax.default in cap.targets(0) and cap.kernels(0) == []


def test_export_keeps_the_operator(gen):
    """torch.export keeps custom (and triton) ops whole: no backend-specific kernels exported."""
    x = torch.randn(4, 37, generator=gen)

    class M(torch.nn.Module):
        def forward(self, t):
            return anysoftmax.softmax(t, -1, backend="triton")

    ep = torch.export.export(M(), (x,))
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert torch.ops.anysoftmax.softmax.default in targets and not targets & WRAPPERS


# ---- the triton_ops themselves ---------------------------------------------------------------

@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_triton_ops_run_eagerly(log, gen):
    registration.traced_ops()  # the triton_ops, with their autograd and vmap rules

    x = torch.randn(3, 70000, generator=gen)
    y, _ = torch.ops.anysoftmax.softmax_triton(x, -1, log=log, backend="triton")
    assert compare(y, x, SoftmaxSpec.from_tensor(x, -1, log=log)).ok
    g = torch.randn_like(y)
    dx, _ = torch.ops.anysoftmax.softmax_backward_triton(g, y, -1, log, backend="triton")
    torch.testing.assert_close(dx, anysoftmax.softmax_backward(y, g, -1, log=log, backend="torch"),
                               rtol=1e-5, atol=1e-6)


def test_triton_ops_opcheck(gen):
    registration.traced_ops()

    x = torch.randn(5, 33, generator=gen, dtype=torch.float64).requires_grad_()
    torch.library.opcheck(torch.ops.anysoftmax.softmax_triton.default, (x, 1), {"backend": "triton"},
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_triton_ops_refuse_other_backends(gen):
    registration.traced_ops()

    with pytest.raises(RuntimeError, match="served by another backend"):
        torch.ops.anysoftmax.softmax_triton(torch.randn(3, 4, generator=gen), 1, backend="torch")


# ---- GPU plans, traced on this CPU-only machine ----------------------------------------------

GPU_PLAN_TRACE = r'''
import json, sys
import torch
import anysoftmax
from anysoftmax.torchop import ops, registration  # noqa: F401  (the operators with their autograd and routing)
from anysoftmax.backends.triton import backend as tb
from anysoftmax.backends.triton.occupancy import DeviceProps
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

# An H100's properties and occupancy stand in for the GPU this machine lacks.
tb.device_props = lambda index: DeviceProps(name="H100", multiprocessor_count=132, max_num_regs=65536,
                                            max_shared_mem=232448, warp_size=32, max_threads_per_sm=2048,
                                            is_hip=False, is_cdna=False)
tb._programs_per_sm = lambda *a, **k: 2
tb.TritonBackend.is_available = lambda self: None
tb.TritonBackend._index = staticmethod(lambda x: 0)

def launches(gm):
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target):
            k = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
            configs = getattr(k, "configs", [])
            fn = getattr(k, "fn", k)
            out.append(dict(kernel=fn.__name__, phase=n.kwargs["kwargs"].get("PHASE"), grid=list(n.kwargs["grid"][0]),
                            num_warps=configs[0].num_warps if configs else None, args=sorted(n.kwargs["kwargs"])))
    return out, [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

from anysoftmax.core.layout import allocate_rows

result = {}
with FakeTensorMode():
    cases = {"split": torch.empty(8, 262144, device="cuda"), "tile": torch.empty(64, 1000, device="cuda",
             dtype=torch.bfloat16)}
    plans = {}
    for name, x in cases.items():
        spec = anysoftmax.SoftmaxSpec.from_tensor(x, -1)
        xr, y, layout = allocate_rows(x, spec)
        plans[name] = anysoftmax.get_backend("triton").plan(xr, y, layout, spec)
for name, x in cases.items():
    plan = plans[name]
    fw = make_fx(dispatch_functionalize(lambda t: ops.softmax_op(t, -1)), tracing_mode="fake")(x)
    bw = make_fx(dispatch_functionalize(lambda g, y: ops.softmax_backward_op(g, y, -1)),
                 tracing_mode="fake")(x, x)
    result[name] = dict(eager_plan=dict(kind=plan.kind, cooperative=plan.cooperative, options=plan.options),
                        forward=launches(fw), backward=launches(bw))
print("RESULT" + json.dumps(result))
'''


def test_gpu_plans_trace_on_fake_cuda_tensors():
    """What a GPU compile records, on this CPU-only machine: fake CUDA tensors, an H100's
    properties stubbed in, kernels compiled-mode (`JITFunction`s: a fresh interpreter without
    TRITON_INTERPRET), traced through functionalization as AOTAutograd does. A split plan that is
    cooperative in eager mode is traced as its two launches (PHASE 1, 2) with launch options
    passed as torch's single-config autotuner (num_warps), never `launch_cooperative_grid`."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", GPU_PLAN_TRACE], capture_output=True, text=True, env=env, timeout=600)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")]
    assert res.returncode == 0 and line, res.stderr[-3000:]
    got = json.loads(line[0][len("RESULT"):])
    split, tile = got["split"], got["tile"]
    assert split["eager_plan"]["kind"] == "split" and split["eager_plan"]["cooperative"]
    assert split["eager_plan"]["options"].get("launch_cooperative_grid") is True
    fw, fw_targets = split["forward"]
    assert [(k["kernel"], k["phase"]) for k in fw] == [("softmax_split_kernel", 1), ("softmax_split_kernel", 2)]
    assert all(k["num_warps"] == split["eager_plan"]["options"]["num_warps"] for k in fw)
    assert not any("launch_cooperative_grid" in k["args"] for k in fw)
    assert not any("anysoftmax" in t for t in fw_targets), fw_targets
    bw, bw_targets = split["backward"]
    assert [k["kernel"] for k in bw] in (["softmax_bwd_kernel"], ["softmax_bwd_kernel"] * 2)
    assert not any("anysoftmax" in t for t in bw_targets)
    assert [k["kernel"] for k in tile["forward"][0]] == ["softmax_tile_kernel"]
    assert [k["kernel"] for k in tile["backward"][0]] == ["softmax_bwd_kernel"]


def test_a_bool_mask_reaches_the_traced_kernels_as_bool(gen):
    """A broadcast bool mask through the compiled fused path: the graph hands the kernels the
    bool tensor itself (Inductor cannot lower a dtype view of a bool graph input), results and
    gradients against the float64 reference."""
    x = torch.randn(2, 3, 4, 8, generator=gen, dtype=torch.float64)
    mask = torch.rand(2, 1, 4, 8, generator=gen) < 0.3
    g = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    cap = Capture()
    a = x.clone().requires_grad_()
    y = compiled(lambda t, m: anysoftmax.softmax(t, -1, mask=m, scale=0.5, backend="triton"), cap)(a, mask)
    y.backward(g)
    assert cap.kernels(0) == ["softmax_tile_kernel"] and cap.kernels(1) == ["softmax_bwd_kernel"]
    b = x.clone().requires_grad_()
    ref = torch.softmax((b * 0.5).masked_fill(mask, float("-inf")), -1).nan_to_num(0.0)
    ref.backward(g)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)
