"""The `triton` backend: the shared persistent kernels on CUDA and ROCm GPUs (CPU tensors through the
interpreter with TRITON_INTERPRET=1), planned from the request, device properties and `tuning.yaml`."""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.backend import Backend
from ...core.cache import OnceCache
from ...core.layout import RowLayout, cdiv, next_power_of_2
from ...core.lse_merge import lse_shape, row_shape
from ...core.request import BWD, FWD, plan_key
from ...core.spec import SoftmaxSpec
from ...core.variant import NO_OPERANDS, runtime_values
from .._triton_common import interpreter, softmax_launchers, traced
from .._triton_common.plan import Fusion, KernelPlan, make_plan, scalars
from . import heuristics
from .device import compiled_programs_per_sm, device_index, device_props
from .occupancy import DeviceProps

# (kernel kind, constexprs, options, dtypes, device) -> resident programs per SM.
_occupancy: OnceCache[int] = OnceCache(maxsize=512)
# core.request.plan_key -> KernelPlan.
_plans: OnceCache[KernelPlan] = OnceCache(maxsize=4096)


def _programs_per_sm(plan: KernelPlan, x, y, layout: RowLayout, spec: SoftmaxSpec, index: int) -> int:
    """The occupancy model applied to the plan's kernel, compiled once per shape class."""
    from .._triton_common.launcher import scratch_maker

    meta = plan.constexprs(layout, spec.log, y.dtype, plan.phases()[0])
    opts = plan.launch_options()
    stand_ins = softmax_launchers.stand_in_operands(spec, "meta")
    operand_dtypes = tuple(None if t is None else t.dtype for t in stand_ins)
    key = (plan.kind, plan.backward, tuple(sorted(meta.items())), tuple(sorted(opts.items())), x.dtype, y.dtype,
           operand_dtypes, index)

    def compile_and_measure() -> int:
        nonlocal x, y
        # Fake tensors (a traced call) get small real stand-ins of the same dtypes: the
        # specialization depends on dtypes, integers and 16-byte alignment, not on sizes.
        x, y = (t if type(t) is torch.Tensor else torch.empty(16, dtype=t.dtype, device=t.device)
                for t in (x, y))
        mask, sinks, p, scale = softmax_launchers.stand_in_operands(spec, x.device)
        stats, counts = scratch_maker(replace(plan, cooperative=False), layout, y.dtype)(x.device)
        given = (x, x, y, x, mask, p, p) if plan.backward else (x, y, mask, sinks, p, scale)
        kernel, args, _ = plan.calls(plan.tensors(given), layout, spec.log, y.dtype, stats, counts)[0]
        return compiled_programs_per_sm(kernel, index, *args, **meta, **opts)

    return _occupancy.get(key, compile_and_measure)


def _resident(draft: KernelPlan, props: DeviceProps, programs_per_sm) -> tuple[KernelPlan, int]:
    """(plan, programs resident on the GPU): `draft`, or without its pipelined item loop (`stages`) where
    that needs too much shared memory (OutOfResources) or leaves fewer programs than a row's chunks."""
    staged = draft.options.get("stages", 1) > 1
    try:
        resident = props.multiprocessor_count * programs_per_sm(draft)
    except Exception as exc:
        from triton.runtime.errors import OutOfResources  # (imported here: Triton compiled, so it is present)

        if not (staged and isinstance(exc, OutOfResources)):
            raise
        resident = 0
    if staged and resident < draft.chunks:
        draft = replace(draft, options={k: v for k, v in draft.options.items() if k != "stages"})
        resident = props.multiprocessor_count * programs_per_sm(draft)
    return draft, resident


def draft_plan(layout: RowLayout, elem_bytes: int, props: DeviceProps | None, backward: bool = False,
               fusion: Fusion = Fusion(), out_bytes: int | None = None) -> KernelPlan:
    """Kernel, tile, warps and cooperation for `layout` (x of `elem_bytes`, y of `out_bytes`) on a GPU
    with `props` (None: the interpreter); grid 1 (decided from the compiled kernel's occupancy)."""
    tile = heuristics.choose_kernel(layout, elem_bytes, props.multiprocessor_count if props else None, backward,
                                    out_bytes)
    common = dict(chunks=tile["chunks"], backward=backward, fusion=fusion)
    if props is None:
        return make_plan(tile["kind"], tile["block_m"], tile["block_n"], 1, **common)
    options = dict(num_warps=tile["num_warps"])
    if tile["kind"] == "tile" and not backward and (fusion.mask or fusion.has_cap):
        options["num_warps"] = heuristics.fused_tile_warps(tile["block_m"] * tile["block_n"] * elem_bytes,
                                                           tile["num_warps"])
    if fusion.causal and (tile["kind"] == "tile" or backward):
        options["causal_vec"] = heuristics.causal_vec(elem_bytes, backward)
    cooperative = tile["kind"] in ("split", "cols_split") and bool(heuristics.table()["cooperative"])
    if cooperative:
        # The driver guarantees a cooperative grid's co-residency (or refuses it): the row barrier
        # never waits on a program that is not running.
        options["launch_cooperative_grid"] = True
        options.update(tile.get("forms", {}))
        if props.is_hip:
            # No pipelined item loop on AMD: Triton 3.6's AMD pipeliner fails at the barrier's call,
            # later ones hold the next chunks in registers (the prefetch form again).
            options.pop("stages", None)
    return make_plan(tile["kind"], tile["block_m"], tile["block_n"], 1, options=options, cooperative=cooperative,
                     **common)


class TritonBackend(Backend):
    name = "triton"
    devices = ("cuda",)  # CPU tensors only when chosen explicitly under the interpreter
    priority = 100
    fused = True  # the fused family (core.variant): every kernel kind applies it
    row_scale = True  # a tensor scale, one value per row: every forward kernel kind reads it

    @staticmethod
    def needs_interpreter() -> bool:
        """True when no GPU is visible: the kernels then run only through the interpreter."""
        return not torch.cuda.is_available()

    status_note = staticmethod(interpreter.status_note)

    def is_available(self) -> str | None:
        missing = interpreter.triton_missing(
            f"{interpreter.TRITON_EXTRA} (CUDA and ROCm builds of torch bring it; on a CPU it runs the kernels "
            f"through the interpreter)")
        if missing is not None or interpreter.interpreting():
            return missing or interpreter.interpreter_problem()
        if not torch.cuda.is_available():
            return ("no CUDA or ROCm GPU visible (torch.cuda.is_available() is False) and TRITON_INTERPRET is not set "
                    "(TRITON_INTERPRET=1 before importing anysoftmax runs CPU tensors through the interpreter)")
        return None

    def supports(self, spec: SoftmaxSpec) -> str | None:
        if self.traceable(spec):
            return None
        if spec.device.type == "cpu":
            return ("CPU tensors run only through the Triton interpreter: "
                    "set TRITON_INTERPRET=1 before importing anysoftmax")
        return f"device type {spec.device.type!r} is not supported (cuda, or cpu with TRITON_INTERPRET=1)"

    def plan(self, x: torch.Tensor, y: torch.Tensor, layout: RowLayout, spec: SoftmaxSpec,
             backward: bool = False) -> KernelPlan:
        """The kernel, tile and grid for this request (cached by `core.request.plan_key`)."""
        key = plan_key(spec, BWD if backward else FWD, x)
        return _plans.get(key, lambda: self._make_plan(x, y, layout, spec, backward))

    def _make_plan(self, x, y, layout: RowLayout, spec: SoftmaxSpec, backward: bool) -> KernelPlan:
        index = None if interpreter.interpreting() else device_index(x.device)
        props = None if index is None else device_props(index)
        draft = draft_plan(layout, x.element_size(), props, backward, Fusion.of(spec),
                           out_bytes=spec.out_dtype.itemsize)
        n_items = draft.work_items(layout)
        if props is None:
            # Programs run one after another: few, each looping over several items, never the
            # cooperative split (its barrier would never open).
            return replace(draft, grid=max(min(n_items, heuristics.table()["interpreter_programs"]), 1))
        draft, resident = _resident(draft, props, lambda plan: _programs_per_sm(plan, x, y, layout, spec, index))
        if draft.cooperative and resident >= draft.chunks:
            # Every chunk of a row must be in flight together: whole rows per wave of programs.
            return replace(draft, grid=max(min(n_items, (resident // draft.chunks) * draft.chunks), 1))
        draft = draft.non_cooperative()  # (a row outgrows the GPU)
        per_slot = heuristics.table()["tile_programs_per_slot"] if draft.kind in ("tile", "cols") else 1
        return replace(draft, grid=max(min(n_items, resident * per_slot), 1))

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request; for a fused spec `f(x, operands) -> (y, p_sink)`."""
        given = x
        x, y, layout, materialise = softmax_launchers.forward_layout(x, spec)
        return softmax_launchers.forward(self.plan(x, y, layout, spec), layout, spec, contiguous=x is not given,
                                         materialise=materialise)

    def backward_launcher(self, y: torch.Tensor, spec: SoftmaxSpec):
        """`f(y, grad) -> dx` bound to this request; y, dy and dx share one contiguous layout."""
        y = y.contiguous()
        layout, materialise = softmax_launchers.backward_layout(y, spec)
        return softmax_launchers.backward(self.plan(y, y, layout, spec, backward=True), layout, spec,
                                          materialise=materialise)

    # A fused spec's: `f(grad, y, x, operands, p_sink) -> (dx, ds_rows)`.
    fused_backward_launcher = backward_launcher

    # ---- torch.compile: the kernels as user-defined Triton kernels (anysoftmax.torchop.traced_ops) ----

    @staticmethod
    def traceable(spec: SoftmaxSpec) -> bool:
        """Whether a compiled graph may call the kernels for `spec` (GPU, or interpreted CPU)."""
        return spec.device.type == "cuda" or (spec.device.type == "cpu" and interpreter.interpreting())

    def traced_forward(self, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        """Softmax of `x` per `spec` through `wrap_triton` launches: `anysoftmax::softmax_triton`'s body."""
        return self.traced_fused_forward(x, spec, NO_OPERANDS)[0]

    def traced_backward(self, y: torch.Tensor, grad: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        """`softmax_backward` per `spec` (y's dtype), traceable like `traced_forward`."""
        return self.traced_fused_backward(grad, y, None, spec, NO_OPERANDS, None)[0]

    def traced_fused_forward(self, x: torch.Tensor, spec: SoftmaxSpec, args) -> tuple:
        """The fused family, traceable: (y, p_sink or None); `args`: `dispatch.FusedArgs`."""
        x, y, layout, materialise = softmax_launchers.forward_layout(x, spec)
        with traced.no_tracing():  # (the occupancy model's compile needs real stand-in tensors)
            plan = self.plan(x, y, layout, spec)
        p_shape = row_shape(spec.shape, spec.dim) if plan.fusion.has_sink else None
        t = softmax_launchers.forward_tensors(x, y, args, spec, p_shape, materialise, as_bytes=False)
        traced.launch(plan, t, layout, spec.log, y.dtype, scalars(*runtime_values(args.scale, args.softcap)))
        return t[1], t[4]

    def traced_fused_backward(self, grad, y, x, spec: SoftmaxSpec, args, p_sink) -> tuple:
        """Gradients of the fused family, traceable: (dx, ds_rows or None)."""
        y = y.contiguous()
        layout, materialise = softmax_launchers.backward_layout(y, spec)
        with traced.no_tracing():
            plan = self.plan(y, y, layout, spec, backward=True)
        ds_shape = row_shape(spec.shape, spec.dim) if plan.fusion.has_sink else None
        t = softmax_launchers.backward_tensors(grad, y, x, args, p_sink, spec, plan.fusion.has_cap, ds_shape,
                                               materialise, as_bytes=False)
        traced.launch(plan, t, layout, spec.log, spec.out_dtype, scalars(*runtime_values(args.scale, args.softcap)))
        return t[2], t[6]

    # ---- logsumexp and merge_states (core.lse_merge): wherever the softmax runs ----

    supports_logsumexp = supports_merge_states = supports

    # ---- the sampler (anysoftmax.sampling; kernels in _triton_common/sampling.py, sampling_kernels.py) ----

    def supports_sampling(self, spec, top_n: int = 0) -> str | None:
        from .._triton_common import sampling

        return self.supports(spec) or sampling.supports(spec, top_n)

    def sampler(self):
        """The Triton sampler (the one-read paths through this backend's softmax and logsumexp)."""
        from .._triton_common import sampling_one_read

        return sampling_one_read.sampler_for(self)

    def _sms(self, t: torch.Tensor) -> int | None:
        return None if interpreter.interpreting() else device_props(device_index(t.device)).multiprocessor_count

    def logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands):
        """`f(x, operands) -> lse`: the row plan's STATES_ONLY form (`lse_rows`), else `lse_kernel`."""
        return self.shaped_logsumexp_launcher(x, spec, operands, True)

    def shaped_logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands, keepdim: bool):
        """`logsumexp_launcher`'s, the result allocated in `lse_shape(spec, keepdim)`."""
        from .._triton_common import logsumexp, lse_rows

        shape = lse_shape(spec, keepdim)
        xr, planning, layout, materialise = lse_rows.layouts(x, spec)
        plan = self.plan(xr, xr, planning, spec)
        if plan.kind in lse_rows.ROW_KINDS:
            return lse_rows.launcher(plan, layout, spec, materialise, xr is not x, shape)
        sms, item = self._sms(x), x.element_size()
        return logsumexp.launcher(x, spec, lambda n_rows, n_cols: lse_plan(n_rows, n_cols, item, sms), shape=shape)

    def merge_states_launcher(self, outputs, lses, spec):
        """`f(outputs, lses, out, lse_out) -> (out, lse)` bound to one request."""
        from .._triton_common.merge_states import merge_launcher

        sms, item = self._sms(outputs[0]), spec.dtype.itemsize
        return merge_launcher(spec, lambda k, rows, d: merge_plan(k, rows, d, item, sms))

    @staticmethod
    def sharded_softmax_launcher(x: torch.Tensor, dim: int, **kwargs):
        """The launcher of this rank's shard of a softmax sharded across GPUs along `dim`."""
        from . import sharded

        return sharded.launcher(x, dim, **kwargs)


def lse_plan(n_rows: int, n_cols: int, elem_bytes: int, sms: int | None, elems: int | None = None,
             programs_per_sm: int = 8, num_warps: int | None = None):
    """Tiles and grid of `lse_kernel`: ~16 KB of input a step (`elems`: 16 elements a thread of 8
    warps) over BLOCK_M short rows or a long row's sub-blocks; rows leaving fewer than two items
    per SM are cut into chunks; 8 programs per SM keep loads in flight. The keywords override the
    choices (`anysoftmax.bench.tune_triton`)."""
    from .._triton_common.logsumexp import LsePlan

    if sms is None:  # the interpreter: small tiles, few programs, chunks exercised on long rows
        bn = min(next_power_of_2(n_cols), 64)
        bm = min(4, next_power_of_2(n_rows))
        work = cdiv(n_rows, bm)
        chunks = 2 if n_cols > 2 * bn else 1
        return LsePlan(bm, bn, chunks, min(work * chunks, 4))
    elems = elems or (4096 if elem_bytes <= 2 else 2048)
    bn = min(next_power_of_2(n_cols), elems)
    bm = max(1, min(elems // bn, next_power_of_2(n_rows)))
    work = cdiv(n_rows, bm)
    chunks = 1
    if work < 2 * sms and n_cols > 4 * bn:
        chunks = min(cdiv(2 * sms, work), cdiv(n_cols, bn))
    return LsePlan(bm, bn, chunks, min(work * chunks, sms * programs_per_sm),
                   num_warps=num_warps or (8 if bm * bn >= 2048 else 4))


def merge_plan(k: int, n_rows: int, d: int, elem_bytes: int, sms: int | None):
    """Tiles and grid of `merge_kernel`: a whole head (D <= 256) a tile row, threads reading 32 bytes of
    each partial (K > 4: 8), one program a tile, tiles shrunk while under 4 per SM (docs/speed.md)."""
    from .._triton_common.merge_states import MergePlan

    if sms is None:
        return MergePlan(min(4, next_power_of_2(n_rows)), min(next_power_of_2(d), 32),
                         min(cdiv(n_rows, 4) * cdiv(d, 32), 4))
    bd = min(next_power_of_2(d), 256)
    per_thread = max(1, (32 if k <= 4 else 8) // elem_bytes)
    br = max(1, min(32 * per_thread // bd, next_power_of_2(n_rows)))
    while br > 1 and cdiv(n_rows, br) < 4 * sms:
        br //= 2
    tiles = cdiv(n_rows, br) * cdiv(d, bd)
    return MergePlan(br, bd, min(tiles, sms * 256), num_warps=min(8, max(1, br * bd // (32 * per_thread))))
