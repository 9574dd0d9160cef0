"""The `triton` backend: the shared persistent kernels on CUDA and ROCm GPUs.

With TRITON_INTERPRET=1 set before anysoftmax is imported, the same kernels run through the
Triton interpreter on CPU tensors: that is how CI tests them.
"""

from __future__ import annotations

import torch

from ...core.cache import OnceCache
from ...core.layout import allocate_rows
from ...core.spec import SoftmaxSpec
from ...kernels.launch import KernelPlan, interpreting, kernel_args, kernel_constexprs, kernel_for, launch
from . import heuristics
from .device import device_props
from .occupancy import KernelResources, programs_per_sm

# (kernel kind, constexprs, dtypes, device index) -> resident programs per SM.
_occupancy: OnceCache[int] = OnceCache(maxsize=512)


def _programs_per_sm(plan: KernelPlan, x, y, layout, meta: dict, index: int) -> int:
    key = (plan.kind, tuple(sorted(meta.items())), tuple(sorted(plan.options.items())), x.dtype, y.dtype, index)

    def compile_and_measure() -> int:
        compiled = kernel_for(plan.kind).warmup(*kernel_args(x, y, layout), grid=(1,), **meta, **plan.options)
        compiled._init_handles()
        res = KernelResources(n_regs=compiled.n_regs, shared_mem=compiled.metadata.shared,
                              num_warps=plan.options["num_warps"])
        return programs_per_sm(device_props(index), res)

    return _occupancy.get(key, compile_and_measure)


class TritonBackend:
    name = "triton"
    devices = ("cuda",)  # CPU tensors only when chosen explicitly under the interpreter
    priority = 100

    def is_available(self) -> str | None:
        if interpreting():
            return None
        if not torch.cuda.is_available():
            return "no CUDA or ROCm GPU visible (torch.cuda.is_available() is False) and TRITON_INTERPRET is not set"
        return None

    def supports(self, spec: SoftmaxSpec) -> str | None:
        if spec.device.type == "cuda":
            return None
        if spec.device.type == "cpu":
            return None if interpreting() else (
                "CPU tensors run only through the Triton interpreter: set TRITON_INTERPRET=1 before importing anysoftmax")
        return f"device type {spec.device.type!r} is not supported (cuda, or cpu with TRITON_INTERPRET=1)"

    def plan(self, x, y, layout, spec: SoftmaxSpec) -> KernelPlan:
        """The kernel, tile and grid for this request."""
        tile = heuristics.choose_tile(layout)
        n_work = -(-layout.n_rows // tile["block_m"])
        if interpreting():
            grid = min(n_work, heuristics.table()["interpreter_programs"])
            return KernelPlan(tile["kind"], tile["block_m"], tile["block_n"], max(grid, 1), {})
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        props = device_props(index)
        options = dict(num_warps=tile["num_warps"])
        if tile["kind"] == "tile":
            options["num_stages"] = heuristics.num_stages(props.max_shared_mem)
        draft = KernelPlan(tile["kind"], tile["block_m"], tile["block_n"], 1, options)
        meta = kernel_constexprs(draft, layout, spec.log, spec.out_dtype)
        compile_opts = {k: v for k, v in options.items() if k != "num_stages"}
        per_sm = _programs_per_sm(KernelPlan(draft.kind, draft.block_m, draft.block_n, 1, compile_opts),
                                  x, y, layout, meta, index)
        grid = max(1, min(props.multiprocessor_count * per_sm, n_work))
        return KernelPlan(draft.kind, draft.block_m, draft.block_n, grid, options)

    def run(self, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        x, y, layout = allocate_rows(x, spec)
        plan = self.plan(x, y, layout, spec)
        if x.device.type == "cuda":
            with torch.cuda.device(x.device):
                launch(plan, x, y, layout, spec.log)
        else:
            launch(plan, x, y, layout, spec.log)
        return y
