"""Kernels are launched with arguments bound by name: every plan kind names exactly the runtime
parameters its kernel declares (no more, no fewer), and the launcher's positional fast path is
only taken where the signature's order is the one `KernelPlan.arguments` gives."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.backends._triton_common.launcher import _positional_order
from anysoftmax.backends._triton_common.plan import Fusion, by_name, make_plan, runtime_params
from anysoftmax.backends._triton_common.request import backward_layout, forward_layout
from anysoftmax.core.layout import allocate_rows
from anysoftmax.core.spec import SoftmaxSpec

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
    assert _positional_order(kernel, plan.pointer_names(), plan.static_args(layout))
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
