"""The `triton_ascend` backend: the shared Triton kernels (backends/_triton_common) on Ascend NPUs
through triton-ascend, with what the NPU forces: a fixed grid (`settings`), tiles sized by the
unified buffer (`planning`), the `multibuffer` launch option, the NPU host glue (`npu`); docs/ascend.md.
The sampler is the shared Triton sampler on its own plan (`sampling_plan`).

It serves `npu` tensors (automatic choice); `cpu` tensors through the Triton interpreter and `cuda`
tensors with $ANYSOFTMAX_ASCEND_ON_CUDA=1, explicit choice only (how CI and GPUs check its plans).
float64 is refused everywhere: the NPU's vector unit has no fp64 exp or max (Atlas A2/A3).
"""

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
    """The plan for rows of `layout` under settings `s` on `programs` programs (pure: the
    front-end test compiles exactly these)."""
    # Causal rows read a prefix of their own length: a per-row bound over several rows lowers to
    # an unbounded load of the full tile in triton-ascend's front end; one row a step stays bounded.
    several_rows = flat_rows(layout) and spec.variant.causal == "none"
    plan = planning.plan_rows(layout.n_rows, layout.n_cols, programs, spec.in_dtype.itemsize,
                              spec.out_dtype.itemsize, spec.acc_dtype.itemsize, s, several_rows,
                              planning.operand_bytes(spec))
    # causal_vec 1: a causal prefix is loaded under its exact bound (`fused.whole_vectors`):
    # the NPU copies by DMA under a bound, and whole-vector masks would lower to unbounded loads.
    plan = replace(plan, fusion=Fusion.of(spec), options={"causal_vec": 1})
    # `multibuffer` is a triton-ascend option, which stock Triton (interpreter, CUDA) rejects.
    return replace(plan, options={**plan.options, "multibuffer": s.multibuffer}) if on_npu else plan


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


def _programs(t: torch.Tensor, halvings: int = 0) -> tuple[settings.Settings, int]:
    """The settings in force (the UB budget halved `halvings` times) and the programs to launch on
    `t`'s device (its live vector-core count where the grid asks for it)."""
    return _device_programs(t.device, halvings)


def _device_programs(device: torch.device, halvings: int = 0) -> tuple[settings.Settings, int]:
    """`_programs` of `device`."""
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


def _stand_in_operands(spec: SoftmaxSpec, device) -> tuple:
    """(mask, sinks, p_sink, row scale) for a first compile: the variant's dtypes, zero-filled, of
    the shapes the request reads (compiling is what may overflow the unified buffer); no row scale
    (this backend does not declare one)."""
    v = spec.variant
    rows = softmax_launchers.row_shape(spec)
    mask = None if v.mask is None else torch.zeros(spec.shape, dtype=torch.uint8 if v.mask_kind == "bool"
                                                   else v.mask.dtype, device=device)
    sinks = None if v.sinks is None else torch.zeros(rows, dtype=v.sinks.dtype, device=device)
    p = None if v.sinks is None else torch.empty(rows, dtype=spec.acc_dtype, device=device)
    return mask, sinks, p, None


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
        if missing is not None:
            return missing
        if interpreter.interpreting():
            return interpreter.interpreter_problem()
        if npu.crosscheck_on_cuda() and torch.cuda.is_available():
            return None
        reason = npu.missing_reason()
        if reason is None:
            return None
        return (f"{reason} (without an NPU: CPU tensors with TRITON_INTERPRET=1, "
                f"or CUDA tensors with ${npu.ENV_ON_CUDA}=1)")

    def supports(self, spec: SoftmaxSpec) -> str | None:
        """None for fp16/bf16/fp32 on the devices above, else the reason."""
        return _refusal(spec.device, (spec.in_dtype, spec.out_dtype))

    def plan(self, x: torch.Tensor, layout: RowLayout, spec: SoftmaxSpec, halvings: int = 0) -> KernelPlan:
        """Kernel, tile, grid and launch options for rows of `layout` (x on its device), with the
        unified-buffer budget halved `halvings` times (after a compile-time overflow)."""
        s, programs = _programs(x, halvings)
        return plan_for(layout, spec, s, programs, x.device.type == "npu")

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request, on the device's current stream (dispatch memoises
        it). On an NPU the first plan is compiled here: a unified-buffer overflow halves the
        tile and retries (`ub_retry`), and the halvings are remembered per shape class."""
        given = x
        x, y, layout, materialise = softmax_launchers.forward_layout(x, spec)
        cls = ub_retry.shape_class(spec.in_dtype, spec.out_dtype, spec.log, layout.n_cols, flat_rows(layout),
                                   spec.variant.key())
        if compile_may_overflow(x.device):
            def attempt(plan: KernelPlan) -> None:  # the first launch compiles: an overflow shows here
                tensors = (x, y, *_stand_in_operands(spec, x.device))
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

    def supports_logsumexp(self, spec: SoftmaxSpec) -> str | None:
        return self.supports(spec)

    def supports_merge_states(self, spec) -> str | None:
        return _refusal(spec.device, (spec.dtype, *spec.lse_dtypes))

    def run_logsumexp(self, x: torch.Tensor, spec: SoftmaxSpec, operands) -> torch.Tensor:
        """logsumexp through `lse_kernel`: one row a step (bounded loads on the NPU), sub-blocks sized
        by the UB budget for the input and three accumulator lanes (max, sum, NaN count)."""
        from .._triton_common.logsumexp import LsePlan, launcher

        s, programs = _programs(x)
        per_elem = x.element_size() + 3 * 4

        def plan_for(n_rows: int, n_cols: int) -> LsePlan:
            bn = max(planning.min_block_n(s, x.element_size(), 4),
                     min(planning.floor_pow2(planning.tile_budget(s) // per_elem), 1 << max(n_cols - 1, 0).bit_length()))
            return LsePlan(1, bn, 1, planning.grid_size(programs, n_rows))

        return launcher(x, spec, plan_for, guard=npu.device_guard)(x, operands)

    def run_merge_states(self, outputs, lses, spec, out=None, lse_out=None):
        """merge_states through `merge_kernel`: one row a step, the head tiled by the UB budget
        (accumulator, one partial and the output per element)."""
        from .._triton_common.merge_states import MergePlan, merge_launcher

        s, programs = _programs(outputs[0])
        per_elem = 4 + 2 * spec.dtype.itemsize

        def plan_for(k, n_rows, d):
            bd = min(planning.floor_pow2(planning.tile_budget(s) // per_elem), 1 << max(d - 1, 0).bit_length())
            return MergePlan(1, max(bd, 1), planning.grid_size(programs, n_rows * -(-d // max(bd, 1))))

        return merge_launcher(spec, plan_for, guard=npu.device_guard)(outputs, lses, out, lse_out)

    # ---- the sampler (anysoftmax.sampling): the shared Triton sampler on the NPU's plan

    def sampling_plan(self, spec):
        """The sampler's plan for `spec` (a `sampling.spec.SamplingSpec`): UB-sized chunks, slots
        and tiles on the NPU's grid, no runs pre-pass (`sampling_plan`); the same plan on every
        device this backend serves."""
        s, programs = _device_programs(spec.device)
        return sampling_plan.plan_for(spec.rows, spec.vocab, s, programs)

    def supports_sampling(self, spec, top_n: int = 0) -> str | None:
        """None for fp16/bf16/fp32 logits on the devices above; `logprobs`' top_n up to half the
        plan's slots (`sampling_plan.MAX_SLOTS` // 2 at most)."""
        from .._triton_common import sampling

        reason = _refusal(spec.device, (spec.dtype,))
        return reason or sampling.supports(spec, top_n, self.sampling_plan(spec))

    def sampler(self):
        """The shared Triton sampler (`sampling_one_read.Sampler`) on this backend's plans: the scan
        and select with `sampling_plan`, the one-read paths through this backend's softmax and
        logsumexp."""
        from .._triton_common import sampling_one_read

        return sampling_one_read.sampler_for(self, self.sampling_plan)
