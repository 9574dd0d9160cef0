"""The shared kernels as torch.compile sees them (docs/kernels.md): `launch` runs a plan with torch
ops and `wrap_triton` launches only; split plans as two launches (tracing drops
`launch_cooperative_grid`: a row barrier could wait forever); scratch allocated per call."""

from __future__ import annotations

import torch

from ...core.layout import RowLayout
from .interpreted_launch import interpreted
from .plan import PLAIN_SCALARS, KernelPlan


def no_tracing():
    """A context where tensors are real again (torch.compile's modes off), for planning's compile."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


_twins: dict = {}


def traceable(kernel):
    """`kernel` as `wrap_triton` accepts it: an interpreted one (which it passes through untraced)
    as a `JITFunction` twin running through the interpreter, so a graph's kernel nodes run on CPU."""
    if not interpreted(kernel):
        return kernel
    twin = _twins.get(kernel)
    if twin is None:
        from triton.runtime.jit import JITFunction

        class InterpretedTwin(JITFunction):
            def run(self, *args, grid, warmup, **kwargs):
                return kernel.run(*args, grid=grid, warmup=warmup, **kwargs)

            @property
            def cache_key(self):
                # (JITFunction's walks the helpers it calls, which are interpreted functions.)
                import hashlib
                return hashlib.sha256(self.src.encode()).hexdigest()

        twin = _twins[kernel] = InterpretedTwin(kernel.fn)
    return twin


def traced_plan(plan: KernelPlan) -> KernelPlan:
    """The form of `plan` a traced launch runs: never cooperative (module docstring)."""
    return plan.non_cooperative() if plan.cooperative else plan


# Positions of the tensors a kernel writes, in the launcher's tuples (`KernelPlan.tensors`).
_OUTPUTS = {False: (1, 4), True: (2, 6)}


def launch(plan: KernelPlan, tensors: tuple, layout: RowLayout, log: bool, out_dtype: torch.dtype,
           values: tuple = PLAIN_SCALARS) -> None:
    """Launch `plan` on `tensors` (`KernelPlan.tensors`' order) with floats `values`: traceable, eager too."""
    from torch.library import wrap_triton

    plan = traced_plan(plan)
    kernel = plan.kernel()
    if interpreted(kernel):
        # Without a GPU driver torch assumes the kernel writes every argument: copies keep the
        # caller's tensors out of that.
        outputs = _OUTPUTS[plan.backward]
        tensors = tuple(t if t is None or i in outputs else t.clone() for i, t in enumerate(tensors))
    device = tensors[0].device
    # Absent operands get tensors of their own, not another argument: a functionalized call
    # copies every argument it may write (two aliases of one tensor would get a copy each).
    tensors = tuple(torch.empty(1, dtype=tensors[0].dtype, device=device) if t is None else t for t in tensors)
    stats = counts = None
    if plan.split or plan.backward:  # (the kernel takes the scratch)
        acc = torch.float64 if out_dtype == torch.float64 else torch.float32
        stats = torch.empty(max(plan.stats_numel(layout), 1), dtype=acc, device=device)
        counts = torch.empty(2, dtype=torch.int32, device=device)  # PHASE 0 only: never read here
    options = plan.launch_options()
    for kern, args, meta in plan.calls(plan.tensors(tensors), layout, log, out_dtype, stats, counts, values):
        wrap_triton(traceable(kern))[(plan.grid,)](*args, **meta, **options)


def kernels() -> list:
    """Every kernel `launch` may run (torch's compile caches key on their source)."""
    from .bwd import softmax_bwd_kernel
    from .cols import softmax_cols_kernel, softmax_cols_split_kernel
    from .rows import softmax_online_kernel, softmax_split_kernel, softmax_tile_kernel

    return [traceable(k) for k in (softmax_tile_kernel, softmax_online_kernel, softmax_split_kernel,
                                   softmax_cols_kernel, softmax_cols_split_kernel, softmax_bwd_kernel)]
