"""torch.compile on a GPU (issue 13): an attention block with anysoftmax compiles whole
(fullgraph, no graph break), Inductor's generated code launches anysoftmax's Triton kernels as
user-defined kernels (no opaque `anysoftmax::` call), `mode="reduce-overhead"` captures them in
CUDA graphs, and results and gradients match eager torch. Long rows (a split plan, cooperative
in eager mode) run their two-launch form in the compiled graph. The tests of one plan kind name
`backend="triton"`: where the DSL imports, the automatic choice may send long rows and column
reductions to `cute` (the H100's selection table), which runs as an opaque operator.

    pytest -q -m gpu tests/backends/triton/test_traced_kernels_gpu.py
"""

from __future__ import annotations

import pytest
import torch

import anysoftmax
from anysoftmax.bench.compiled_block import Attention  # the benchmark's block: QK^T -> softmax -> V
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare
from anysoftmax.core.layout import allocate_rows

pytestmark = pytest.mark.gpu

MODES = ["default", "reduce-overhead"]


def pair(dtype, dim=256, heads=4):
    torch.manual_seed(0)
    ours = Attention(heads, dim // heads, anysoftmax.softmax).cuda().to(dtype)
    ref = Attention(heads, dim // heads, torch.softmax).cuda().to(dtype)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def compile_fn(fn, mode):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, mode=None if mode == "default" else mode)


def step(fn, x, mode):
    """One forward+backward step: (output, input gradient) as fresh tensors. The gradient is
    taken with `autograd.grad` of the output itself (a fixed upstream gradient): eager ops on a
    CUDA-graph output between steps (`out.square().sum().backward()`) read buffers the next
    replay may overwrite, which torch rejects for any compiled model, anysoftmax or not."""
    if mode == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()
    x = x.detach().requires_grad_()
    out = fn(x)
    g = torch.randn(out.shape, generator=torch.Generator(out.device).manual_seed(1), device=out.device,
                    dtype=out.dtype)
    (gx,) = torch.autograd.grad(out, x, g)
    return out.detach().clone(), gx.clone()


def assert_near(got, want, dtype):
    """Relative error in norm: compiled and eager blocks round their matmuls differently, and
    bf16 elementwise tolerances would be noise."""
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < (1e-4 if dtype == torch.float32 else 2e-2), f"relative error {err:.2e}"


def generated_code(fn, *args) -> str:
    from torch._inductor.utils import run_and_get_code

    _, codes = run_and_get_code(fn, *args)
    return "\n".join(codes)


def cudagraph_roots() -> int:
    """Graphs recorded by Inductor's CUDA-graph trees on the current device."""
    from torch._inductor import cudagraph_trees

    mgr = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    return 0 if mgr is None else sum(len(v) for v in mgr.roots.values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_block(mode, dtype):
    from torch._dynamo.utils import counters

    ours, ref = pair(dtype)
    x = torch.randn(4, 128, 256, device="cuda", dtype=dtype)
    counters.clear()
    compiled = compile_fn(ours, mode)

    def fw_bw(t):
        return step(compiled, t, mode)

    code = generated_code(fw_bw, x)  # first step: compiles forward and backward
    assert "softmax_tile_kernel" in code, "the forward kernel is not in Inductor's code"
    assert "softmax_bwd_kernel" in code, "the backward kernel is not in Inductor's code"
    assert "torch.ops.anysoftmax" not in code, "an opaque anysoftmax operator is left in the graph"
    for _ in range(3):  # reduce-overhead: warm-up, record, replay
        out, gx = fw_bw(x)
    want, gwant = step(ref, x, "default")
    assert_near(out, want, dtype)
    assert_near(gx, gwant, dtype)
    if mode == "reduce-overhead":
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        assert cudagraph_roots() > 0, "no CUDA graph was recorded"
    assert torch._dynamo.explain(ours)(x).graph_break_count == 0


def test_long_rows_split_plan():
    """8 x 262144 fp32: a split plan (cooperative in eager); compiled, its two-launch form."""
    from torch._dynamo.utils import counters

    x = torch.randn(8, 262144, device="cuda") * 4
    spec = SoftmaxSpec.from_tensor(x, -1)
    xr, y, layout = allocate_rows(x, spec)
    assert anysoftmax.get_backend("triton").plan(xr, y, layout, spec).kind == "split"
    for mode in MODES:
        counters.clear()
        fn = compile_fn(lambda t: anysoftmax.softmax(t, -1, backend="triton"), mode)
        code = generated_code(lambda t: step(fn, t, mode), x)
        assert "softmax_split_kernel" in code and "torch.ops.anysoftmax" not in code
        for _ in range(3):
            out, gx = step(fn, x, mode)
        assert compare(out, x, spec).ok, compare(out, x, spec).detail
        ref, gref = step(lambda t: torch.softmax(t, -1), x, "default")
        assert_near(gx, gref, torch.float32)
        if mode == "reduce-overhead":
            assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
            assert cudagraph_roots() > 0


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((4096, 1000), -1), ((64, 65536), -1), ((16, 512, 64), 1),
                                       ((8, 4096, 128), 1)])
def test_compiled_matches_reference(shape, dim, log):
    """Every plan kind on a GPU (tile, split, cols, cols_split) through the compiled path."""
    x = torch.randn(shape, device="cuda") * 3
    fn = compile_fn(lambda t: (anysoftmax.log_softmax if log else anysoftmax.softmax)(t, dim, backend="triton"),
                    "default")
    code = generated_code(fn, x)
    assert "torch.ops.anysoftmax" not in code and "triton_kernel_wrapper" not in code
    y = fn(x)
    result = compare(y, x, SoftmaxSpec.from_tensor(x, dim, log=log), device="cuda")
    assert result.ok, result.detail


def test_eager_path_unchanged():
    """Eager calls keep the bound raw launcher: no triton_op, no HOP in between."""
    from anysoftmax import dispatch

    x = torch.randn(64, 1000, device="cuda")
    anysoftmax.softmax(x, -1)
    hits = dispatch.stats["hits"]
    anysoftmax.softmax(x, -1)
    assert dispatch.stats["hits"] == hits + 1


def test_input_from_a_padded_matmul():
    """The kernels' strides are constants in the graph: Inductor must hand them buffers with
    exactly the traced strides (user-kernel inputs are constrained to their eager strides), even
    where it would pad a matmul output's rows (comprehensive padding, rows of 3000 fp32)."""
    from torch._inductor import config

    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 3000, device="cuda")
    with config.patch(comprehensive_padding=True, padding_stride_threshold=1):
        fn = compile_fn(lambda a_, b_: anysoftmax.softmax((a_ @ b_) * 0.5, -1), "default")
        y = fn(a, b)
    x = (a @ b) * 0.5
    result = compare(y, x, SoftmaxSpec.from_tensor(x, -1), device="cuda")
    assert result.ok, result.detail


@pytest.mark.parametrize("shape,dim,backward", [((4096, 1000), -1, False), ((4096, 1000), -1, True),
                                                ((8, 262144), -1, False), ((8, 262144), -1, True),
                                                ((16, 512, 64), 1, False), ((8, 4096, 128), 1, False)])
def test_no_input_looks_written(shape, dim, backward):
    """torch's analysis of which arguments a user kernel writes (it follows each store's address
    back through helper calls) must see only outputs and scratch written: an input that looks
    mutated keeps the whole model out of CUDA graphs ("skipping cudagraphs due to mutated
    inputs"), which the split kernel's shared load helper once caused."""
    import torch._higher_order_ops.triton_kernel_wrap as tkw
    from anysoftmax.backends._triton_common import traced

    x = torch.randn(shape, device="cuda")
    spec = SoftmaxSpec.from_tensor(x, dim)
    xr, y, layout = allocate_rows(x, spec)
    plan = traced.traced_plan(anysoftmax.get_backend("triton").plan(xr, y, layout, spec, backward=backward))
    stats = torch.empty(max(plan.stats_numel(layout), 1), device="cuda")
    counts = torch.empty(2, dtype=torch.int32, device="cuda")
    given = (xr, torch.randn_like(xr), y, None, None, None, None) if backward else (xr, y, None, None, None, None)
    for kern, args, meta in plan.calls(plan.tensors(given), layout, False, y.dtype, stats, counts):
        kwargs = {**dict(zip(kern.arg_names, args)), **meta}
        written = set(tkw.identify_mutated_tensors(kern, kwargs, {}))
        assert written and written <= {"y_ptr", "dx_ptr", "stats_ptr", "count_ptr"}, (kern.fn.__name__, written)
