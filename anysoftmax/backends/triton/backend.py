"""The `triton` backend: the shared persistent kernels on CUDA and ROCm GPUs.

With TRITON_INTERPRET=1 set before anysoftmax is imported, the same kernels run through the
Triton interpreter on CPU tensors: that is how CI tests them.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.cache import BoundedDict, OnceCache
from ...core.layout import RowLayout, allocate_rows, new_output
from ...core.spec import SoftmaxSpec
from ...kernels.launch import (SPLIT_KINDS, KernelPlan, backward_args, backward_constexprs, backward_launcher,
                               forward_calls, forward_launcher, interpreter_problem, interpreting,
                               device_guard, kernel_constexprs, launch_lock, launch_options, work_items)
from . import heuristics
from .device import device_props
from .occupancy import DeviceProps, KernelResources, programs_per_sm

# (kernel kind, constexprs, options, dtypes, device) -> resident programs per SM.
_occupancy: OnceCache[int] = OnceCache(maxsize=512)
# (request layout, dtypes, alignment, device, tuning overrides) -> KernelPlan.
_plans: OnceCache[KernelPlan] = OnceCache(maxsize=4096)
# (spec, alignment, tuning overrides[, "bwd"]) -> launcher: a repeated request skips layout,
# plan lookup and launch-argument work and goes straight to the launch.
_launchers: BoundedDict = BoundedDict(maxsize=4096)


def _programs_per_sm(plan: KernelPlan, x, y, layout: RowLayout, meta: dict, index: int) -> int:
    """Compile the plan's kernel once (per shape class) and apply the occupancy model to it."""
    opts = launch_options(plan)
    key = (plan.kind, tuple(sorted(meta.items())), tuple(sorted(opts.items())), x.dtype, y.dtype, index)

    def compile_and_measure() -> int:
        scratch = torch.empty(2, device=x.device, dtype=torch.float64 if meta["ACC_FP64"] else torch.float32)
        counts = torch.zeros(1, dtype=torch.int32, device=x.device)
        if "SINGLE" in meta:  # the backward kernel
            from ...kernels.softmax_bwd import softmax_bwd_kernel as kernel
            args = backward_args(x, x, y, layout, plan.chunks, scratch, counts)
        else:
            kernel, args, _ = forward_calls(plan, x, y, layout, meta["LOG"], scratch, counts)[0]
        with launch_lock(kernel):
            compiled = kernel.warmup(*args, grid=(1,), **meta, **opts)
        compiled._init_handles()
        res = KernelResources(n_regs=compiled.n_regs, shared_mem=compiled.metadata.shared,
                              num_warps=opts["num_warps"])
        return programs_per_sm(device_props(index), res)

    return _occupancy.get(key, compile_and_measure)


def draft_plan(layout: RowLayout, elem_bytes: int, props: DeviceProps | None, backward: bool = False) -> KernelPlan:
    """Kernel, tile, warps, stages and cooperation for `layout` on a GPU with `props` (None:
    the interpreter, never cooperative); the grid, which needs the compiled kernel's
    occupancy, is left at 1."""
    tile = heuristics.choose_kernel(layout, elem_bytes, props.multiprocessor_count if props else None, backward)
    common = dict(kind=tile["kind"], block_m=tile["block_m"], block_n=tile["block_n"], chunks=tile["chunks"],
                  prefetch=tile["prefetch"], grid=1)
    if props is None:
        return KernelPlan(**common)
    options = dict(num_warps=tile["num_warps"])
    if tile["kind"] == "tile":
        options["num_stages"] = heuristics.num_stages(props.max_shared_mem)
    cooperative = tile["kind"] in SPLIT_KINDS and bool(heuristics.table()["cooperative"])
    return KernelPlan(options=options, cooperative=cooperative, **common)


class TritonBackend:
    name = "triton"
    devices = ("cuda",)  # CPU tensors only when chosen explicitly under the interpreter
    priority = 100

    def is_available(self) -> str | None:
        if interpreting():
            return interpreter_problem()
        if not torch.cuda.is_available():
            return "no CUDA or ROCm GPU visible (torch.cuda.is_available() is False) and TRITON_INTERPRET is not set"
        return None

    def supports(self, spec: SoftmaxSpec) -> str | None:
        if spec.device.type == "cuda":
            return None
        if spec.device.type == "cpu":
            return None if interpreting() else (
                "CPU tensors run only through the Triton interpreter: "
                "set TRITON_INTERPRET=1 before importing anysoftmax")
        return f"device type {spec.device.type!r} is not supported (cuda, or cpu with TRITON_INTERPRET=1)"

    def plan(self, x: torch.Tensor, y: torch.Tensor, layout: RowLayout, spec: SoftmaxSpec,
             backward: bool = False) -> KernelPlan:
        """The kernel, tile and grid for this request (cached per shape class)."""
        key = (layout, x.dtype, y.dtype, spec.log, x.data_ptr() % 16, x.device, backward, heuristics.overrides_key())
        return _plans.get(key, lambda: self._make_plan(x, y, layout, spec, backward))

    def _make_plan(self, x, y, layout: RowLayout, spec: SoftmaxSpec, backward: bool) -> KernelPlan:
        props = None if interpreting() else device_props(self._index(x))
        draft = draft_plan(layout, x.element_size(), props, backward)
        n_items = work_items(draft, layout)
        if props is None:
            # Programs run one after another here: few of them, each looping over several
            # work items, and never the cooperative split (its barrier would never open).
            return replace(draft, grid=max(min(n_items, heuristics.table()["interpreter_programs"]), 1))
        phase = 0 if draft.cooperative else 1
        meta = (backward_constexprs(draft, spec.log, spec.out_dtype, phase) if backward
                else kernel_constexprs(draft, layout, spec.log, spec.out_dtype, phase))
        resident = props.multiprocessor_count * _programs_per_sm(draft, x, y, layout, meta, self._index(x))
        cooperative = draft.cooperative and resident >= draft.chunks  # else a row outgrows the GPU
        if cooperative:
            # Every chunk of a row must be in flight together: whole rows per wave of programs.
            grid = min(n_items, (resident // draft.chunks) * draft.chunks)
        elif draft.kind in ("tile", "cols"):
            grid = min(n_items, resident * heuristics.table()["tile_programs_per_slot"])
        else:
            grid = min(n_items, resident)
        return replace(draft, grid=max(grid, 1), cooperative=cooperative)

    @staticmethod
    def _index(x: torch.Tensor) -> int:
        return x.device.index if x.device.index is not None else torch.cuda.current_device()

    def run(self, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        key = (spec, x.data_ptr() % 16, heuristics.overrides_key())
        launcher = _launchers.get(key)
        if launcher is None:
            given = x
            x, y, layout = allocate_rows(x, spec)
            launcher = forward_launcher(self.plan(x, y, layout, spec), layout, spec.log, spec.out_dtype)
            if x is given:  # (an irregular layout is copied on every call: nothing to keep)
                _launchers.put(key, launcher)
        else:
            y = new_output(spec.shape, spec.out_dtype, x.device)
        with device_guard(x.device):
            launcher(x, y)
        return y

    def run_backward(self, y: torch.Tensor, grad: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        """Gradient w.r.t. the input from the forward output `y` and the output gradient."""
        # One row layout serves y, dy and dx: make y and dy contiguous (a copy only when the
        # caller hands in other layouts; autograd's usually are contiguous already).
        y, grad = y.contiguous(), grad.to(y.dtype).contiguous()
        dx = new_output(spec.shape, y.dtype, y.device)
        key = (spec, y.data_ptr() % 16, heuristics.overrides_key(), "bwd")
        launcher = _launchers.get(key)
        if launcher is None:
            layout = RowLayout.from_strides(spec.shape, tuple(y.stride()), tuple(y.stride()), spec.dim)
            launcher = backward_launcher(self.plan(y, dx, layout, spec, backward=True), layout, spec.log, y.dtype)
            _launchers.put(key, launcher)
        with device_guard(y.device):
            launcher(y, grad, dx)
        return dx

