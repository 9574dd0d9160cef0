"""Kernels are launched with arguments bound by name: every plan kind names exactly the runtime
parameters its kernel declares (no more, no fewer), and the launcher's positional fast path is
only taken where the signature's order is the one `KernelPlan.arguments` gives."""

from __future__ import annotations

import pytest
import torch

from anysoftmax.backends._triton_common.launcher import _positional_order
from anysoftmax.backends._triton_common.plan import Fusion, by_name, make_plan, runtime_params
from anysoftmax.core.layout import allocate_rows
from anysoftmax.core.spec import SoftmaxSpec

FUSED = Fusion(has_scale=True, has_cap=True, mask=1, causal=True, has_sink=True, empty=1, sq=4, c_off=0)
CASES = [("tile", False, -1), ("online", False, -1), ("split", False, -1), ("cols", False, 0),
         ("cols_split", False, 0), ("tile", True, -1), ("split", True, -1)]


@pytest.mark.parametrize("kind,backward,dim", CASES, ids=[f"{k}-{'bwd' if b else 'fwd'}" for k, b, _ in CASES])
@pytest.mark.parametrize("fusion", [Fusion(), FUSED], ids=["plain", "fused"])
def test_plan_names_every_kernel_argument(kind, backward, dim, fusion):
    x = torch.randn(2, 4, 8)
    spec = SoftmaxSpec.from_tensor(x, dim)
    _, _, layout = allocate_rows(x, spec)
    plan = make_plan(kind, 1, 8, 1, backward=backward, chunks=2, fusion=fusion)
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
