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


def _plans(x, spec):
    s = settings.current()
    x, y, layout = allocate_rows(x, spec)
    plan = plan_for(layout, spec, s, s.grid, on_npu=True)
    return plan, plan.calls((x, y), layout, spec.log, spec.out_dtype)


@pytest.mark.parametrize("ub", UB_BYTES)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPES)
@pytest.mark.parametrize("shape,dim,layout", CASES)
@pytest.mark.parametrize("log", [False, True])
def test_every_npu_plan_loads_bounded(shape, dim, layout, in_dtype, out_dtype, ub, log):
    x = _input(shape, layout, in_dtype)
    spec = SoftmaxSpec(tuple(x.shape), tuple(x.stride()), in_dtype, dim % x.dim(), out_dtype, log, x.device)
    with settings.override(**({} if ub is None else {"ub_bytes": ub})):
        plan, calls = _plans(x, spec)
    for kernel, args, meta in calls:
        kwargs = {**meta, **plan.launch_options()}
        text = compile_ttadapter(kernel, args, kwargs)
        low = classify(text)
        assert low.ok, (f"{plan} for {shape} dim={dim} {layout} {in_dtype}->{out_dtype}: unbounded accesses:\n"
                        + "\n".join(low.unbounded[:5]))
        assert low.bounded_copies >= 1, f"{plan}: no bounded load found; the classifier no longer reads this output"


def test_check_flags_the_div_mod_row_form():
    """The check can fail: the tile kernel's several-rows-per-step div/mod form (what NPU plans
    used before FLAT_ROWS) lowers unbounded, and the classifier says so."""
    from anysoftmax.backends._triton_common.rows import softmax_tile_kernel

    x = torch.randn(1823, 781)
    y = torch.empty_like(x)
    args = (x, y, 1823, 781, 1, 1823, 0, 0, 781, 1, 0, 0, 781, 1)
    meta = dict(LOG=False, ACC_FP64=False, WIDE_COLS=False, BLOCK_M=4, BLOCK_N=1024, NUM_STAGES=1, multibuffer=True)
    div_mod = classify(compile_ttadapter(softmax_tile_kernel, args, {**meta, "FLAT_ROWS": False}))
    assert not div_mod.ok and any("ExtractedLoadOrStore" in line for line in div_mod.unbounded)
    flat = classify(compile_ttadapter(softmax_tile_kernel, args, {**meta, "FLAT_ROWS": True}))
    assert flat.ok and flat.bounded_copies == 1
