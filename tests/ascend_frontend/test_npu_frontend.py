"""Every kernel the triton_ascend planner can choose lowers every load bounded in
triton-ascend's own front end (TTIR passes + triton-adapter-opt, run on the CPU).

Runs only in the venv that `tests/ascend_frontend/run.sh` builds (triton-ascend==3.2.0 in
place of stock triton, CPU torch, no torch_npu, no CANN); skipped elsewhere with that reason.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton.backends.ascend") is None,
    reason="needs triton-ascend in place of stock triton: run tests/ascend_frontend/run.sh")

from anysoftmax.backends.triton_ascend import settings  # noqa: E402
from anysoftmax.backends.triton_ascend.backend import plan_for  # noqa: E402
from anysoftmax.core.layout import allocate_rows  # noqa: E402
from anysoftmax.core.spec import SoftmaxSpec  # noqa: E402

from .frontend import classify, compile_ttadapter  # noqa: E402

# (shape, dim, how the input is laid out): last and non-last dims, transposed and sliced
# views, 3-D middle dims (two row dimensions), rows longer than one tile (online kernel).
CASES = [
    ((1823, 781), -1, "contiguous"),
    ((1823, 781), 0, "contiguous"),
    ((7, 5), -1, "contiguous"),
    ((64, 4096), -1, "contiguous"),
    ((3, 5000), -1, "contiguous"),
    ((2, 151936), -1, "contiguous"),
    ((300, 200), -1, "transposed"),
    ((40, 96), -1, "sliced"),
    ((6, 33, 17), 1, "contiguous"),
    ((5, 9, 130), 0, "contiguous"),
    ((4, 3, 2, 70), 2, "contiguous"),
]
DTYPES = [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
          (torch.bfloat16, torch.float32)]
# Small unified buffers make the planner take the online kernel and narrow tiles too.
UB_BYTES = [None, 4096]

def _input(shape, layout, dtype):
    if layout == "transposed":
        return torch.randn(tuple(reversed(shape)), dtype=torch.float32).to(dtype).t()
    if layout == "sliced":
        return torch.randn(shape[0], shape[1] * 2, dtype=torch.float32).to(dtype)[:, ::2]
    return torch.randn(shape, dtype=torch.float32).to(dtype)


def _plans(x, spec, operands=None):
    s = settings.current()
    x, y, layout = allocate_rows(x, spec)
    plan = plan_for(layout, spec, s, s.grid, on_npu=True)
    mask, sinks, p = operands or (None, None, None)
    if mask is not None and mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    return plan, plan.calls(plan.tensors((x, y, mask, sinks, p, None)), layout, spec.log, spec.out_dtype)


def _check(plan, calls, what):
    for kernel, args, meta in calls:
        kwargs = {**meta, **plan.launch_options()}
        low = classify(compile_ttadapter(kernel, args, kwargs))
        assert low.ok, f"{plan} for {what}: unbounded accesses:\n" + "\n".join(low.unbounded[:5])
        assert low.bounded_copies >= 1, f"{plan}: no bounded load found; the classifier no longer reads this output"


@pytest.mark.parametrize("ub", UB_BYTES)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPES)
@pytest.mark.parametrize("shape,dim,layout", CASES)
@pytest.mark.parametrize("log", [False, True])
def test_every_npu_plan_loads_bounded(shape, dim, layout, in_dtype, out_dtype, ub, log):
    x = _input(shape, layout, in_dtype)
    spec = SoftmaxSpec(tuple(x.shape), tuple(x.stride()), in_dtype, dim % x.dim(), out_dtype, log, x.device)
    with settings.override(**({} if ub is None else {"ub_bytes": ub})):
        plan, calls = _plans(x, spec)
    _check(plan, calls, f"{shape} dim={dim} {layout} {in_dtype}->{out_dtype}")


# The fused family on attention-shaped scores [B, H, Sq, Sk] (and a long row): every step's
# plan, with masks broadcast over heads (stride 0) and full ones, sinks per head.
VARIANTS = {
    "scale": lambda sh: dict(scale=0.125),
    "softcap": lambda sh: dict(scale=0.5, softcap=30.0),
    "bool-mask-broadcast": lambda sh: dict(mask=torch.rand(sh[0], 1, *sh[2:]) < 0.3),
    "bool-mask-full-uniform": lambda sh: dict(mask=torch.rand(sh) < 0.3, empty_rows="uniform"),
    "additive-mask": lambda sh: dict(mask=torch.randn(sh[-2:])),
    "causal-top-left": lambda sh: dict(causal=True),
    "causal-bottom-right-nan": lambda sh: dict(causal="bottom_right", mask=torch.rand(sh) < 0.1, empty_rows="nan"),
    "sinks": lambda sh: dict(sinks=torch.randn(sh[1], 1, 1)),
    "everything": lambda sh: dict(scale=0.2, softcap=20.0, mask=torch.rand(sh[0], 1, *sh[2:]) < 0.3,
                                  causal="bottom_right", sinks=torch.randn(sh[1], 1, 1), empty_rows="uniform"),
}
VARIANT_SHAPES = [(2, 4, 64, 96), (1, 2, 8, 9000)]


@pytest.mark.parametrize("ub", UB_BYTES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=["x".join(map(str, s)) for s in VARIANT_SHAPES])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("log", [False, True])
def test_every_variant_plan_loads_bounded(variant, shape, dtype, ub, log):
    x = torch.randn(shape).to(dtype)
    kwargs = VARIANTS[variant](shape)
    spec, _ = SoftmaxSpec.from_request(x, -1, log=log, fused=kwargs)
    mask, sinks = kwargs.get("mask"), kwargs.get("sinks")
    p = None if sinks is None else torch.empty(*shape[:-1], 1, dtype=spec.acc_dtype)
    with settings.override(**({} if ub is None else {"ub_bytes": ub})):
        plan, calls = _plans(x, spec, (mask, sinks, p))
    assert plan.fusion.has_sink == (sinks is not None) and plan.fusion.causal == ("causal" in kwargs)
    _check(plan, calls, f"{variant} {shape} {dtype}")


def test_check_flags_the_div_mod_row_form():
    """The check can fail: the tile kernel's several-rows-per-step div/mod form (what NPU plans
    used before FLAT_ROWS) lowers unbounded, and the classifier says so."""
    from anysoftmax.backends._triton_common.rows import softmax_tile_kernel

    from anysoftmax.backends._triton_common.plan import NO_FUSION, PLAIN_SCALARS

    x = torch.randn(1823, 781)
    y = torch.empty_like(x)
    # x, y, mask, sinks, p_sink, row scale; sizes and strides; mask, sink and p_sink strides,
    # causal geometry (SQ, Q_DIV, C_OFF); values
    args = (x, y, x, x, y, y, 1823, 781, 1, 1823, 0, 0, 781, 1, 0, 0, 781, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0,
            *PLAIN_SCALARS)
    meta = dict(LOG=False, ACC_FP64=False, WIDE_COLS=False, BLOCK_M=4, BLOCK_N=1024, CAUSAL_VEC=1,
                STATES_ONLY=False, multibuffer=True,
                **NO_FUSION.constexprs(torch.float32))
    div_mod = classify(compile_ttadapter(softmax_tile_kernel, args, {**meta, "FLAT_ROWS": False}))
    assert not div_mod.ok and any("ExtractedLoadOrStore" in line for line in div_mod.unbounded)
    flat = classify(compile_ttadapter(softmax_tile_kernel, args, {**meta, "FLAT_ROWS": True}))
    assert flat.ok and flat.bounded_copies == 1


def _record_launches(monkeypatch, module):
    """Replace `module`'s `bind_kernel` by one recording (binding, operands, floats, per-call
    integers) instead of launching."""
    launches = []

    def bind(b, **kw):
        def record(args, values=b.values, per_call=()):
            scratch = kw.get("scratch")
            launches.append((b, (*args, *scratch(torch.device("cpu"))) if scratch else args, values, per_call))
        return record

    monkeypatch.setattr(module, "bind_kernel", bind)
    return launches


def _lower(launches) -> set:
    """The names of the kernels launched, each launch's binding lowered with its constexprs."""
    lowered = set()
    for b, args, values, per_call in launches:
        kw = {**dict(zip(b.pointer_names, b.pointers(args))), **b.ints, **dict(zip(b.floats, values)),
              **dict(zip(b.per_call, per_call or (0,) * len(b.per_call)))}
        for meta in b.metas:
            assert "func.func" in compile_ttadapter(b.kernel, (), {**kw, **meta}), b.kernel.fn.__name__
            lowered.add(b.kernel.fn.__name__)
    return lowered


@pytest.mark.parametrize("ub", UB_BYTES)
def test_sampler_kernels_lower_on_the_ascend_plan(monkeypatch, ub):
    """Every kernel the backend's sampling plan launches (the scan, the select, probs' second pass)
    lowers through triton-ascend's front end with that plan's constexprs (UB-sized chunks, slots,
    tiles; several chunks a row), and so do the one-read paths' small kernels. Their candidate
    scatter and gathers lower to discrete accesses (which touch every lane: the kernels clamp
    masked lanes' offsets in range, checked through the interpreter in
    tests/backends/triton_ascend/test_ascend_sampling.py); the IR does not say which offsets a
    select clamped, so this checks the lowering only."""
    import anysoftmax
    from anysoftmax.backends._triton_common import sampling as triton_sampling
    from anysoftmax.backends._triton_common import sampling_one_read
    from anysoftmax.backends._triton_common import sampling_one_read_kernels as one_read
    from anysoftmax.sampling.spec import SamplingSpec

    backend = anysoftmax.get_backend("triton_ascend")
    launches = _record_launches(monkeypatch, triton_sampling)
    x = torch.randn(3, 5000) * 3
    ids = torch.randint(0, 5000, (3, 4))
    with settings.override(**({} if ub is None else {"ub_bytes": ub})):
        for op, extra in (("sample", dict(seed=11)), ("probs", {}), ("logprobs", {})):
            kw = dict(temperature=0.9) if op == "logprobs" else \
                dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.05, **extra)
            spec = SamplingSpec.from_request(op, x, **kw)
            plan = backend.sampling_plan(spec)
            assert plan.chunks(5000) > 1 and not plan.runs
            run = triton_sampling.runner(op, spec, 4 if op == "logprobs" else 0, 4 if op == "logprobs" else 0,
                                         plan=plan)
            args = (x, triton_sampling.keyword_values(spec))
            run(*args, ids) if op == "logprobs" else run(*args)
    assert _lower(launches) == {"scan_kernel", "select_kernel", "probs_kernel"}
    # The one-read paths' kernels (a row temperature's scale, probs' fix-up, logprobs' gather)
    t, s, y, lse = torch.rand(3) + 0.3, torch.empty(3, 1), torch.empty_like(x), torch.empty(3, 1)
    tile, block, id_block = sampling_one_read.TILE, sampling_one_read.SCALE_BLOCK, sampling_one_read.ID_BLOCK
    for kernel, kw in (
            (one_read.row_scale_kernel, dict(t_ptr=t, s_ptr=s, n_rows=3, t_stride=1, BLOCK=block)),
            (one_read.probs_fixup_kernel, dict(x_ptr=x, y_ptr=y, t_ptr=t, n_rows=3, vocab=5000, xs=5000, ys=5000,
                                               t_stride=1, TILE=tile)),
            (one_read.logprobs_gather_kernel, dict(x_ptr=x, lse_ptr=lse, s_ptr=s, t_ptr=t, ids_ptr=ids,
                                                   out_ptr=torch.empty(3, 4), n_rows=3, vocab=5000, xs=5000, n_ids=4,
                                                   t_stride=1, temperature=1.0, scale=1.0, ROW_T=True, TILE=tile,
                                                   ID_BLOCK=id_block))):
        assert "func.func" in compile_ttadapter(kernel, (), kw), kernel.fn.__name__
