"""The `triton_ascend` backend: the shared Triton kernels on Ascend NPUs through triton-ascend
(docs/ascend.md): a fixed grid (`settings`), tiles sized by the unified buffer (`planning`). `cpu`
(interpreter) and `cuda` ($ANYSOFTMAX_ASCEND_ON_CUDA=1) tensors when chosen explicitly; no float64."""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.backend import Backend
from ...core.layout import RowLayout
from ...core.spec import SoftmaxSpec
from .._triton_common import interpreter, softmax_launchers
from .._triton_common.launcher import bind
from .._triton_common.plan import PLAIN_SCALARS, Fusion, KernelPlan, flat_rows
from . import install, npu, planning, sampling_plan, settings, ub_retry

# shape class -> halvings of the UB budget the NPU compiler accepted (ub_retry).
_halvings = ub_retry.Halvings()

_FP64_REASON = ("float64 is not supported: the NPU's vector unit has no fp64 exp or max (Atlas A2/A3); "
                "triton_ascend refuses it on every device so that its CPU and CUDA runs match the NPU's")


def plan_for(layout: RowLayout, spec: SoftmaxSpec, s: settings.Settings, programs: int, on_npu: bool) -> KernelPlan:
    """The plan for rows of `layout` under `s` on `programs` programs (pure)."""
    # Causal rows: a per-row bound over several rows lowers to an unbounded load of the full tile
    # in triton-ascend's front end; one row a step stays bounded.
    several_rows = flat_rows(layout) and spec.variant.causal == "none"
    plan = planning.plan_rows(layout.n_rows, layout.n_cols, programs, spec.in_dtype.itemsize,
                              spec.out_dtype.itemsize, spec.acc_dtype.itemsize, s, several_rows,
                              planning.operand_bytes(spec))
    # causal_vec 1: a causal prefix loaded under its exact bound (the NPU copies by DMA under a
    # bound; whole-vector masks would lower to unbounded loads).
    # `multibuffer` is a triton-ascend option, which stock Triton (interpreter, CUDA) rejects.
    options = {"causal_vec": 1, "multibuffer": s.multibuffer} if on_npu else {"causal_vec": 1}
    return replace(plan, fusion=Fusion.of(spec), options=options)


def _refusal(device: torch.device, dtypes) -> str | None:
    """Why the backend does not run `dtypes` on `device` (see the module doc), or None."""
    if torch.float64 in dtypes:
        return _FP64_REASON
    kind = device.type
    if kind == "npu":
        return npu.missing_reason()
    if kind == "cpu":
        return None if interpreter.interpreting() else (
            "CPU tensors run only through the Triton interpreter: set TRITON_INTERPRET=1 before importing anysoftmax")
    if kind == "cuda":
        return None if npu.crosscheck_on_cuda() else (
            f"CUDA tensors run on triton_ascend only as a cross-check of the NPU launch "
            f"(set ${npu.ENV_ON_CUDA}=1); use backend='triton' for CUDA")
    return f"device type {kind!r} is not supported (npu; cpu with TRITON_INTERPRET=1; cuda with ${npu.ENV_ON_CUDA}=1)"


def _programs(device: torch.device, halvings: int = 0) -> tuple[settings.Settings, int]:
    """(settings with the UB budget halved `halvings` times, programs to launch on `device`)."""
    s = settings.current()
    if halvings:
        s = replace(s, ub_bytes=s.ub_bytes >> halvings)
    live = None
    if device.type == "npu" and s.grid == settings.VECTOR_CORES:
        live = npu.vector_cores(npu.device_index(device))
    return s, planning.resolve_programs(s, live)


def compile_may_overflow(device: torch.device) -> bool:
    """Only the NPU compiler decides the real unified-buffer use (and may refuse a tile)."""
    return device.type == "npu"


class TritonAscendBackend(Backend):
    name = "triton_ascend"
    devices = ("npu",)  # CPU (interpreter) and CUDA (cross-check) tensors only when chosen explicitly
    priority = 100
    fused = True  # the fused family: the same shared kernels and prologue as `triton`

    @staticmethod
    def needs_interpreter() -> bool:
        """True when no NPU stack is installed (detected without importing torch_npu)."""
        return npu.missing_reason() is not None

    status_note = staticmethod(interpreter.status_note)

    def is_available(self) -> str | None:
        """None when some device can run it here (interpreter, CUDA cross-check or an NPU)."""
        missing = interpreter.triton_missing(
            f"on an Ascend host, {install.INSTALL_ORDER}; elsewhere {interpreter.TRITON_EXTRA} for the CPU "
            "interpreter")
        if missing is not None or interpreter.interpreting():
            return missing or interpreter.interpreter_problem()
        if npu.crosscheck_on_cuda() and torch.cuda.is_available():
            return None
        reason = npu.missing_reason()
        return None if reason is None else (f"{reason} (without an NPU: CPU tensors with TRITON_INTERPRET=1, "
                                            f"or CUDA tensors with ${npu.ENV_ON_CUDA}=1)")

    def supports(self, spec: SoftmaxSpec) -> str | None:
        """None for fp16/bf16/fp32 on the devices above, else the reason."""
        return _refusal(spec.device, (spec.in_dtype, spec.out_dtype))

    def plan(self, x: torch.Tensor, layout: RowLayout, spec: SoftmaxSpec, halvings: int = 0) -> KernelPlan:
        """Kernel, tile, grid and options for rows of `layout`, the UB budget halved `halvings` times."""
        s, programs = _programs(x.device, halvings)
        return plan_for(layout, spec, s, programs, x.device.type == "npu")

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request. On an NPU the first plan is compiled here: a
        unified-buffer overflow halves the tile and retries (`ub_retry`), remembered per shape class."""
        given = x
        x, y, layout, materialise = softmax_launchers.forward_layout(x, spec)
        cls = ub_retry.shape_class(spec.in_dtype, spec.out_dtype, spec.log, layout.n_cols, flat_rows(layout),
                                   spec.variant.key())
        if compile_may_overflow(x.device):
            def attempt(plan: KernelPlan) -> None:  # the first launch compiles: an overflow shows here
                # (operands of the request's shapes: compiling is what may overflow the unified buffer)
                tensors = (x, y, *softmax_launchers.stand_in_operands(spec, x.device, full=True))
                bind(plan, layout, spec.log, spec.out_dtype)(tensors, PLAIN_SCALARS)

            with npu.device_guard(x.device):
                plan, halvings = ub_retry.fit_plan(lambda h: self.plan(x, layout, spec, h), attempt,
                                                   _halvings.get(cls))
            _halvings.put(cls, halvings)
        else:
            plan = self.plan(x, layout, spec, _halvings.get(cls))
        return softmax_launchers.forward(plan, layout, spec, contiguous=x is not given, guard=npu.device_guard,
                                         materialise=materialise)

    # ---- logsumexp and merge_states (core.lse_merge): the shared kernels, on the NPU's grid and UB tiles

    supports_logsumexp = supports

    def supports_merge_states(self, spec) -> str | None:
        return _refusal(spec.device, (spec.dtype, *spec.lse_dtypes))

    def run_logsumexp(self, x: torch.Tensor, spec: SoftmaxSpec, operands) -> torch.Tensor:
        """logsumexp through `lse_kernel`: one row a step, sub-blocks sized by the UB budget."""
        from .._triton_common.logsumexp import LsePlan, launcher

        s, programs = _programs(x.device)
        per_elem = x.element_size() + 3 * 4

        def plan_for(n_rows: int, n_cols: int) -> LsePlan:
            bn = max(planning.min_block_n(s, x.element_size(), 4),
                     min(planning.floor_pow2(planning.tile_budget(s) // per_elem), 1 << max(n_cols - 1, 0).bit_length()))
            return LsePlan(1, bn, 1, planning.grid_size(programs, n_rows))

        return launcher(x, spec, plan_for, guard=npu.device_guard)(x, operands)

    def run_merge_states(self, outputs, lses, spec, out=None, lse_out=None):
        """merge_states through `merge_kernel`: one row a step, the head tiled by the UB budget."""
        from .._triton_common.merge_states import MergePlan, merge_launcher

        s, programs = _programs(outputs[0].device)
        per_elem = 4 + 2 * spec.dtype.itemsize

        def plan_for(k, n_rows, d):
            bd = min(planning.floor_pow2(planning.tile_budget(s) // per_elem), 1 << max(d - 1, 0).bit_length())
            return MergePlan(1, max(bd, 1), planning.grid_size(programs, n_rows * -(-d // max(bd, 1))))

        return merge_launcher(spec, plan_for, guard=npu.device_guard)(outputs, lses, out, lse_out)

    # ---- the sampler (anysoftmax.sampling): the shared Triton sampler on the NPU's plan

    def sampling_plan(self, spec):
        """The sampler's plan for a `SamplingSpec`: UB-sized chunks, slots and tiles on the NPU's grid."""
        s, programs = _programs(spec.device)
        return sampling_plan.plan_for(spec.rows, spec.vocab, s, programs)

    def supports_sampling(self, spec, top_n: int = 0) -> str | None:
        """None for fp16/bf16/fp32 logits on the devices above; `logprobs`' top_n up to half the slots."""
        from .._triton_common import sampling

        reason = _refusal(spec.device, (spec.dtype,))
        return reason or sampling.supports(spec, top_n, self.sampling_plan(spec))

    def sampler(self):
        """The shared Triton sampler on `sampling_plan`."""
        from .._triton_common import sampling_one_read

        return sampling_one_read.sampler_for(self, self.sampling_plan)
