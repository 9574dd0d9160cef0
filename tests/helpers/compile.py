"""torch.compile with its graphs kept: an aot_autograd backend that records the forward and
backward graphs (which ops and which Triton kernels they hold) and runs them as they are."""

from __future__ import annotations

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

# The graph nodes that launch a user-defined Triton kernel.
WRAPPERS = {torch.ops.higher_order.triton_kernel_wrapper_functional,
            torch.ops.higher_order.triton_kernel_wrapper_mutation}


class Capture:
    """An aot_autograd backend that keeps the forward and backward graphs and runs them as they
    are (the user-kernel nodes then launch the kernels)."""

    def __init__(self):
        self.graphs: list = []
        self.backend = aot_autograd(fw_compiler=self._keep, bw_compiler=self._keep)

    def _keep(self, gm, example_inputs):
        self.graphs.append(gm)
        return make_boxed_func(gm.forward)

    def targets(self, index: int) -> list:
        return [n.target for n in self.graphs[index].graph.nodes if n.op == "call_function"]

    def kernels(self, index: int) -> list[str]:
        """Names of the user Triton kernels a graph launches, in order."""
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

        return [kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
                for n in self.graphs[index].graph.nodes if n.op == "call_function" and n.target in WRAPPERS]


def compiled(fn, capture: Capture):
    """`torch.compile(fn, fullgraph=True)` through `capture` (dynamo's caches reset first)."""
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=capture.backend)
