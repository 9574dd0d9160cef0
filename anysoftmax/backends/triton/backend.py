"""The `triton` backend: the shared persistent kernels on CUDA and ROCm GPUs (and, with
TRITON_INTERPRET=1 set before the kernels are imported, on CPU tensors through the interpreter:
how CI tests them). It plans (request + device properties + `tuning.yaml` -> kernel, tile, grid)
and hands the plan to the shared launchers (`backends/_triton_common`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.backend import Backend
from ...core.cache import OnceCache
from ...core.layout import RowLayout, cdiv, next_power_of_2
from ...core.lse_merge import lse_shape
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


def _operand_stand_ins(spec: SoftmaxSpec, device) -> tuple:
    """(mask, sinks, p_sink, row scale) of the variant's dtypes as the kernels take them, small:
    what a compile for the occupancy model needs (its code depends on the dtypes, not the sizes)."""
    v = spec.variant
    mask = None if v.mask is None else torch.empty(16, dtype=torch.uint8 if v.mask_kind == "bool" else v.mask.dtype,
                                                   device=device)
    sinks = None if v.sinks is None else torch.empty(16, dtype=v.sinks.dtype, device=device)
    p = None if v.sinks is None else torch.empty(16, dtype=spec.acc_dtype, device=device)
    scale = None if v.row_scale is None else torch.empty(16, dtype=v.row_scale.dtype, device=device)
    return mask, sinks, p, scale


def _programs_per_sm(plan: KernelPlan, x, y, layout: RowLayout, spec: SoftmaxSpec, index: int) -> int:
    """The occupancy model applied to the plan's kernel, compiled once per shape class."""
    from .._triton_common.launcher import scratch_maker

    log = spec.log
    phase = plan.phases()[0]
    meta = plan.constexprs(layout, log, y.dtype, phase)
    opts = plan.launch_options()
    operand_dtypes = tuple(None if t is None else t.dtype for t in _operand_stand_ins(spec, "meta"))
    key = (plan.kind, plan.backward, tuple(sorted(meta.items())), tuple(sorted(opts.items())), x.dtype, y.dtype,
           operand_dtypes, index)

    def compile_and_measure() -> int:
        nonlocal x, y
        # Fake tensors (a traced call) get small real stand-ins of the same dtypes: the
        # specialization depends on dtypes, integers and 16-byte alignment, not on sizes.
        x, y = _stand_in(x), _stand_in(y)
        mask, sinks, p, scale = _operand_stand_ins(spec, x.device)
        stats, counts = scratch_maker(replace(plan, cooperative=False), layout, y.dtype)(x.device)
        given = (x, x, y, x, mask, p, p) if plan.backward else (x, y, mask, sinks, p, scale)
        kernel, args, _ = plan.calls(plan.tensors(given), layout, log, y.dtype, stats, counts)[0]
        return compiled_programs_per_sm(kernel, index, *args, **meta, **opts)

    return _occupancy.get(key, compile_and_measure)


def _values(args) -> tuple:
    return scalars(*runtime_values(args.scale, args.softcap))


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    return t if type(t) is torch.Tensor else torch.empty(16, dtype=t.dtype, device=t.device)


def _resident(draft: KernelPlan, props: DeviceProps, programs_per_sm) -> tuple[KernelPlan, int]:
    """(plan, programs resident on the whole GPU): `draft`, or, where its pipelined item loop
    (`stages`, shared memory per stage) does not fit, the same plan without it. It does not fit
    when its kernel needs more shared memory than a program may have (Triton raises
    OutOfResources when it loads it), or when its shared memory leaves fewer resident programs
    than a row has chunks (the row would go to the two launches because of the form)."""
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
    """Kernel, tile, warps and cooperation for `layout` (x of `elem_bytes`, the forward's y of
    `out_bytes`) on a GPU with `props` (None: the interpreter, never cooperative); the grid (it
    needs the compiled kernel's occupancy) is 1."""
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
        # The driver guarantees co-residency of a cooperative grid (and refuses one that cannot
        # be): the row barrier can then never wait on a program that is not running.
        options["launch_cooperative_grid"] = True
        options.update(tile.get("forms", {}))
        if props.is_hip:
            # No pipelined item loop on AMD: Triton 3.6's AMD pipeliner stops compiling at the
            # barrier's call ("pipeliner doesn't know how to predicate this op"), and later ones
            # hold the next chunks in registers (no LDS), the prefetch form again.
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
        if missing is not None:
            return missing
        if interpreter.interpreting():
            return interpreter.interpreter_problem()
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
        """The kernel, tile and grid for this request (cached per request: `core.request.plan_key`;
        `layout` and x's dtype follow from the spec)."""
        key = plan_key(spec, BWD if backward else FWD, x)
        return _plans.get(key, lambda: self._make_plan(x, y, layout, spec, backward))

    def _make_plan(self, x, y, layout: RowLayout, spec: SoftmaxSpec, backward: bool) -> KernelPlan:
        index = None if interpreter.interpreting() else device_index(x.device)
        props = None if index is None else device_props(index)
        draft = draft_plan(layout, x.element_size(), props, backward, Fusion.of(spec),
                           out_bytes=spec.out_dtype.itemsize)
        n_items = draft.work_items(layout)
        if props is None:
            # Programs run one after another here: few of them, each looping over several
            # work items, and never the cooperative split (its barrier would never open).
            return replace(draft, grid=max(min(n_items, heuristics.table()["interpreter_programs"]), 1))
        draft, resident = _resident(draft, props, lambda plan: _programs_per_sm(plan, x, y, layout, spec, index))
        if draft.cooperative and resident >= draft.chunks:
            # Every chunk of a row must be in flight together: whole rows per wave of programs.
            return replace(draft, grid=max(min(n_items, (resident // draft.chunks) * draft.chunks), 1))
        draft = draft.non_cooperative()  # (a row outgrows the GPU)
        per_slot = heuristics.table()["tile_programs_per_slot"] if draft.kind in ("tile", "cols") else 1
        return replace(draft, grid=max(min(n_items, resident * per_slot), 1))

    def launcher(self, x: torch.Tensor, spec: SoftmaxSpec):
        """`f(x) -> y` bound to this request (dispatch memoises it); for a fused spec
        `f(x, operands) -> (y, p_sink)`."""
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

    def fused_backward_launcher(self, y: torch.Tensor, spec: SoftmaxSpec):
        """`f(grad, y, x, operands, p_sink) -> (dx, ds_rows)` bound to this fused request."""
        return self.backward_launcher(y, spec)

    # ---- torch.compile: the kernels as user-defined Triton kernels (anysoftmax.torchop.traced_ops) ----

    @staticmethod
    def traceable(spec: SoftmaxSpec) -> bool:
        """Whether a compiled graph may call this backend's kernels directly for `spec`: GPU
        tensors, and CPU tensors under the interpreter (how CI traces them)."""
        return spec.device.type == "cuda" or (spec.device.type == "cpu" and interpreter.interpreting())

    def traced_forward(self, x: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        """Softmax of `x` per `spec` as torch ops and `wrap_triton` launches: the body of the
        `anysoftmax::softmax_triton` operator (traced on fake tensors, run eagerly on real ones)."""
        return self.traced_fused_forward(x, spec, NO_OPERANDS)[0]

    def traced_backward(self, y: torch.Tensor, grad: torch.Tensor, spec: SoftmaxSpec) -> torch.Tensor:
        """`softmax_backward` per `spec` (y's dtype), traceable like `traced_forward`."""
        return self.traced_fused_backward(grad, y, None, spec, NO_OPERANDS, None)[0]

    def traced_fused_forward(self, x: torch.Tensor, spec: SoftmaxSpec, args) -> tuple:
        """The fused family, traceable like `traced_forward`: (y, p_sink or None). `args` are
        the call's `dispatch.FusedArgs` (scale and softcap become the launch's float arguments)."""
        x, y, layout, materialise = softmax_launchers.forward_layout(x, spec)
        plan = self._traced_plan(x, y, layout, spec, False)
        p_shape = softmax_launchers.row_shape(spec) if plan.fusion.has_sink else None
        t = softmax_launchers.forward_tensors(x, y, args, spec, p_shape, materialise, as_bytes=False)
        traced.launch(plan, t, layout, spec.log, y.dtype, _values(args))
        return t[1], t[4]

    def traced_fused_backward(self, grad, y, x, spec: SoftmaxSpec, args, p_sink) -> tuple:
        """Gradients of the fused family, traceable: (dx, ds_rows or None)."""
        y = y.contiguous()
        layout, materialise = softmax_launchers.backward_layout(y, spec)
        plan = self._traced_plan(y, y, layout, spec, True)
        ds_shape = softmax_launchers.row_shape(spec) if plan.fusion.has_sink else None
        t = softmax_launchers.backward_tensors(grad, y, x, args, p_sink, spec, plan.fusion.has_cap, ds_shape,
                                               materialise, as_bytes=False)
        traced.launch(plan, t, layout, spec.log, spec.out_dtype, _values(args))
        return t[2], t[6]

    def _traced_plan(self, x, y, layout: RowLayout, spec: SoftmaxSpec, backward: bool) -> KernelPlan:
        # Outside the tracing modes: the occupancy model's compile needs real stand-in tensors.
        with traced.no_tracing():
            return self.plan(x, y, layout, spec, backward=backward)

    # ---- logsumexp and merge_states (core.lse_merge) ----

    def supports_logsumexp(self, spec: SoftmaxSpec) -> str | None:
        return self.supports(spec)

    def supports_merge_states(self, spec) -> str | None:
        return self.supports(spec)

    # ---- the sampler (anysoftmax.sampling; kernels in _triton_common/sampling.py, sampling_kernels.py) ----

    def supports_sampling(self, spec, top_n: int = 0) -> str | None:
        from .._triton_common import sampling

        return self.supports(spec) or sampling.supports(spec, top_n)

    def sampler(self):
        """The Triton sampler: `probs`, `sample`, `logprobs` on validated requests (those that
        need no filter read the logits once, through this backend's softmax and logsumexp)."""
        from .._triton_common import sampling_one_read

        return sampling_one_read.sampler_for(self)

    def _sms(self, t: torch.Tensor) -> int | None:
        return None if interpreter.interpreting() else device_props(device_index(t.device)).multiprocessor_count

    def logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands):
        """`f(x, operands) -> lse` bound to one request: a row plan runs the softmax forward's own
        plan in its STATES_ONLY form (`lse_rows`), a column plan `lse_kernel`."""
        return self.shaped_logsumexp_launcher(x, spec, operands, True)

    def shaped_logsumexp_launcher(self, x: torch.Tensor, spec: SoftmaxSpec, operands, keepdim: bool):
        """`logsumexp_launcher`'s, allocating the result in `lse_shape(spec, keepdim)` (the kernels
        write a contiguous result by row number: either shape is the same memory)."""
        from .._triton_common import logsumexp, lse_rows

        shape = lse_shape(spec, keepdim)
        xr, planning, layout, materialise = lse_rows.layouts(x, spec)
        run = lse_rows.launcher_for(self.plan(xr, xr, planning, spec), layout, spec, materialise, xr is not x, shape)
        if run is not None:
            return run
        sms, item = self._sms(x), x.element_size()
        return logsumexp.launcher(x, spec, lambda n_rows, n_cols: lse_plan(n_rows, n_cols, item, sms), shape=shape)

    def merge_states_launcher(self, outputs, lses, spec):
        """`f(outputs, lses, out, lse_out) -> (out, lse)` bound to one request
        (`merge_states.merge_launcher`), the device's SM count read once."""
        from .._triton_common.merge_states import merge_launcher

        sms, item = self._sms(outputs[0]), spec.dtype.itemsize
        return merge_launcher(spec, lambda k, rows, d: merge_plan(k, rows, d, item, sms))

    @staticmethod
    def sharded_softmax_launcher(x: torch.Tensor, dim: int, **kwargs):
        """The launcher of this rank's shard of a softmax whose `dim` is sharded across GPUs
        (`sharded.launcher`, `anysoftmax.distributed.one_read`)."""
        from . import sharded

        return sharded.launcher(x, dim, **kwargs)


def lse_plan(n_rows: int, n_cols: int, elem_bytes: int, sms: int | None, elems: int | None = None,
             programs_per_sm: int = 8, num_warps: int | None = None):
    """Tiles and grid of `lse_kernel`: ~16 KB of input per step (`elems`: 16 elements a thread of
    8 warps, 16-byte loads) over BLOCK_M short rows or a long row's sub-blocks; rows leaving
    fewer than two work items per SM are cut into chunks; 8 programs per SM keep loads in
    flight. The keywords override the choices (`anysoftmax.bench.tune_triton`'s lse sweep)."""
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
    """Tiles and grid of `merge_kernel`: a whole head (D <= 256) per tile row, one warp per
    program, each thread reading 32 bytes of every partial for K <= 4 and 8 bytes for more,
    one program per tile (persistent only past 256 programs per SM); tiles shrink towards one
    row while that leaves fewer than 4 programs per SM (docs/speed.md)."""
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
