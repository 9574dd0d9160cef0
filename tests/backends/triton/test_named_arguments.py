"""Kernels are launched with arguments bound by name: every plan kind names exactly the runtime
parameters its kernel declares (no more, no fewer), in the order the launch engine's positional
fast path passes them (pointers, integers, floats), and that fast path passes what Triton's
launcher takes."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.backends._triton_common.plan import VALUE_NAMES, Fusion, by_name, make_plan, runtime_params
from anysoftmax.backends._triton_common.softmax_launchers import backward_layout, forward_layout
from anysoftmax.core.layout import allocate_rows
from anysoftmax.core.spec import SoftmaxSpec
from helpers import active_launch_hook

CASES = [("tile", False, -1), ("online", False, -1), ("split", False, -1), ("cols", False, 0),
         ("cols_split", False, 0), ("tile", True, -1), ("split", True, -1)]


def _spec(x, dim, fused: bool):
    if not fused:
        return SoftmaxSpec.from_tensor(x, dim)
    sinks_shape = tuple(1 if d == dim % x.dim() else s for d, s in enumerate(x.shape))
    kw = dict(scale=0.5, softcap=3.0, mask=torch.rand(x.shape) < 0.3, sinks=torch.randn(sinks_shape),
              empty_rows="nan", causal=dim == -1)
    return SoftmaxSpec.from_request(x, dim, fused=kw)[0]


@pytest.mark.parametrize("kind,backward,dim", CASES, ids=[f"{k}-{'bwd' if b else 'fwd'}" for k, b, _ in CASES])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_plan_names_every_kernel_argument(kind, backward, dim, fused):
    x = torch.randn(2, 4, 8)
    spec = _spec(x, dim, fused)
    layout = backward_layout(x, spec)[0] if backward else forward_layout(x, spec)[2]
    plan = make_plan(kind, 1, 8, 1, backward=backward, chunks=2, fusion=Fusion.of(spec))
    kernel = plan.kernel()
    head = tuple(torch.empty(1) for _ in plan.pointer_names())
    named = plan.arguments(head, layout)
    assert sorted(named) == sorted(runtime_params(kernel))
    assert runtime_params(kernel) == (*plan.pointer_names(), *plan.static_args(layout), *VALUE_NAMES)
    # Every value sits where the kernel's signature puts its name.
    args = by_name(kernel, named)
    assert all(args[i] is named[n] for i, n in enumerate(runtime_params(kernel)))


def test_a_missing_or_unknown_argument_is_named():
    x = torch.randn(4, 8)
    spec = SoftmaxSpec.from_tensor(x, -1)
    _, _, layout = allocate_rows(x, spec)
    plan = make_plan("tile", 1, 8, 1)
    named = plan.arguments(tuple(torch.empty(1) for _ in plan.pointer_names()), layout)
    del named["n_cols"]
    named["n_colz"] = 8
    with pytest.raises(ValueError, match=r"missing \['n_cols'\], unknown \['n_colz'\]"):
        by_name(plan.kernel(), named)


class _Recorder:
    """Stands in for a compiled kernel's launcher; named like Triton's CUDA one (`direct`) to
    take the branch that calls its extension function with no frame between."""

    def __init__(self, direct: bool):
        self.seen = []
        if direct:
            self.launch = lambda *a: self.seen.append(a)
            self.launch_cooperative_grid, self.launch_pdl = "coop", "pdl"
            self.global_scratch_size = self.profile_scratch_size = 0
            self.num_ctas = 1

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # (Triton 3.6's signature)
        self.seen.append((gridX, gridY, gridZ, stream, function, *args))


def _compiled(direct: bool):
    from types import SimpleNamespace

    run = type("CudaLauncher", (_Recorder,), {})(True) if direct else _Recorder(False)
    return SimpleNamespace(run=run, function="fn", packed_metadata="packed")


@pytest.mark.parametrize("direct", [True, False], ids=["cuda-launcher", "generic"])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_fast_path_passes_what_triton_launch_takes(direct, backward):
    """After the first launch a bound launcher calls Triton's launcher positionally: grid,
    stream, function, launch flags, packed metadata, then the pointers (absent operands stood in
    for), the integers, the per-call floats and the constexpr tail, for plain and fused calls."""
    from anysoftmax.backends._triton_common.launcher import bind
    from anysoftmax.backends._triton_common.plan import PLAIN_SCALARS

    x = torch.randn(2, 4, 8)
    spec = SoftmaxSpec.from_tensor(x, -1)
    layout = backward_layout(x, spec)[0] if backward else forward_layout(x, spec)[2]
    plan = make_plan("tile", 2, 8, 3, backward=backward, chunks=1, fusion=Fusion.of(spec))
    launch = bind(plan, layout, False, torch.float32)
    static = tuple(plan.static_args(layout).values())
    compiled = _compiled(direct)
    ts = [torch.randn(2, 4, 8) for _ in range(3)]
    given = tuple(ts[:3]) + (None,) * 4 if backward else (ts[0], ts[1], None, None, None, None)
    launch.prime([compiled], given, stream_of=lambda index: 7)
    ptrs = tuple(t.data_ptr() for t in plan.tensors(given))
    # The constexprs, in the kernel's declaration order after its runtime arguments.
    meta = plan.constexprs(layout, False, torch.float32)
    kernel = plan.kernel()
    tail = tuple(meta[n] for n in kernel.arg_names[len(runtime_params(kernel)):])
    flags = ("fn", "coop", "pdl", None, None, "packed", None, None, None) if direct else \
        ("fn", "packed", None, None, None)
    n_scratch = 2 if backward else 0  # (the backward kernel also takes its stats and counters)
    for values in (PLAIN_SCALARS, (0.5, 3.0)):
        compiled.run.seen.clear()
        launch(given, values)
        (got,) = compiled.run.seen
        head = (plan.grid, 1, 1, 7, *flags, *ptrs)
        rest = (*static, *values, *tail)
        assert got[:len(head)] == head and got[len(head) + n_scratch:] == rest and len(got) == len(head + rest) + n_scratch
    with active_launch_hook(launch.state["fast"]) as active:
        if active:  # an active launch hook needs Triton's own path: the fast path stands aside
            compiled.run.seen.clear()
            launch(given)
            assert compiled.run.seen == []


def test_fast_calls_follow_the_launchers_argument_layout():
    """Triton's CUDA launcher changed how it calls its extension: the extension is called directly
    only for the layout `_fast_calls` packs (`__call__(gridX, gridY, gridZ, stream, function, *args)`,
    Triton 3.2-3.6, as `_Recorder`'s); a later launcher (named metadata, the arguments as one
    tuple) is called through its own `__call__`, which takes what Triton's JIT passes it."""
    from anysoftmax.backends._triton_common.launcher import _fast_calls

    class Later(_Recorder):
        def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                     launch_enter_hook, launch_exit_hook, *args):
            pass

    old = _compiled(True)
    ((fn, _, after, _),) = _fast_calls([old], [()], 4)
    assert fn is old.run.launch and after[:3] == ("fn", "coop", "pdl")  # function, cooperative, pdl
    new = _compiled(True)
    new.run = type("CudaLauncher", (Later,), {})(True)
    ((fn, _, after, _),) = _fast_calls([new], [()], 4)
    assert fn is new.run and after == ("fn", "packed", None, None, None)  # as JITFunction.run calls it
