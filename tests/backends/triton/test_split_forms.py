"""The cooperative split kernels' forms of their one launch (`tuning.yaml`: split_prefetch,
split_relaxed_depart, split_hold_input_16bit, split_stages and their bwd_split_* twins).

The interpreter runs programs one after another, so a row barrier that has to wait never opens:
here every cooperative launch (PHASE 0) is preceded by the two-launch form's statistics pass
(PHASE 1, which writes the same per-chunk statistics) and the rows' arrival counters are set to
"all arrived" (`opened_barriers`). PHASE 0 then runs its real code, forms included: each program
prefetches its next item (the same chunk of a later row, past the last item for the last ones),
leaves the barrier and, the last one out, resets the counters; rows end in uneven chunks. The
interpreter ignores a loop's num_stages, so the pipelined form (STAGES) runs its own code (the
loads built from scalars, the barrier and its reads in one call) without the pipelining, which
tests/backends/triton/test_compile_targets.py checks in the code compiled for sm_90. The
kit's checks compare the results with the float64 reference, every launch must leave the
counters at zero, and no load may touch memory outside the tensors a launch was given.
On a GPU (gpu-marked) the barrier really waits."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch

import anysoftmax

from anysoftmax.backends._triton_common.plan import make_plan
from anysoftmax.backends.triton import heuristics
from anysoftmax.testing.cases import LONG_DTYPES, LONG_ROW_CASES, LONG_VARIANT_CASES
from anysoftmax.testing import check_backward, check_forward
from helpers import LONG_ROW_PATHS_BACKWARD, check_variant, runnable_backends, skip_if_refused, variant_params

FORWARD_FORMS = dict(split_prefetch=True, split_relaxed_depart=True, split_hold_input_16bit=True)
BACKWARD_FORMS = dict(bwd_split_prefetch=True, bwd_split_relaxed_depart=True)
FORMS = {
    "prefetch": dict(split_prefetch=True, bwd_split_prefetch=True),
    "relaxed_depart": dict(split_relaxed_depart=True, bwd_split_relaxed_depart=True),
    "hold_input": dict(split_hold_input_16bit=True),
    "all": {**FORWARD_FORMS, **BACKWARD_FORMS},
    # PHASE 0 as the table ships it (no form on): the same opened barrier, for comparison
    "none": dict(split_prefetch=False),
    "stages": dict(split_stages=3, bwd_split_stages=3),
    "stages2": dict(split_stages=2, bwd_split_stages=2),
    # the pipelined loop with every form it combines with (prefetch it replaces)
    "stages_all": dict(split_stages=3, bwd_split_stages=2, split_relaxed_depart=True, split_hold_input_16bit=True,
                       bwd_split_relaxed_depart=True),
}
# PHASE 0 constexprs of each form set (forward, backward), seen in the launches.
FORM_FLAGS = ("PREFETCH", "RELAXED_DEPART", "HOLD_INPUT", "STAGES")
# Rows of 300 in 32-element chunks (64 for 16-bit; the backward's: 64): ten chunks a row, the
# last one uneven; three programs (`interpreter_programs`), so each walks several rows.
SMALL_SPLIT = LONG_ROW_PATHS_BACKWARD["split"]
SPLIT_CASES = [replace(c, dtypes=LONG_DTYPES) for c in LONG_ROW_CASES
               if c.name in ("long-2d", "long-specials", "long-transposed", "long-dead-head")]
# The kit checks gradients on finite data (`compare_backward`); its special values are the
# fused cases' (test_cooperative_forms_fused).
GRADIENT_CASES = ("long-2d", "long-transposed", "long-dead-head")
# Every form together on each case (plain rows in every dtype); each form alone (and none)
# on the plain rows.
FORM_RUNS = [pytest.param("all", c, d, id=f"all-{c.name}-{str(d)[6:]}")
             for c, d in [(SPLIT_CASES[0], torch.float32), (SPLIT_CASES[0], torch.bfloat16),
                          (SPLIT_CASES[0], torch.float16), (SPLIT_CASES[0], torch.float64),
                          (SPLIT_CASES[1], torch.bfloat16), (SPLIT_CASES[2], torch.float32),
                          (SPLIT_CASES[3], torch.bfloat16)]] + [
    pytest.param(f, SPLIT_CASES[0], d, id=f"{f}-{SPLIT_CASES[0].name}-{str(d)[6:]}")
    for f, d in [("prefetch", torch.float32), ("relaxed_depart", torch.float32), ("hold_input", torch.bfloat16),
                 ("none", torch.float32), ("stages", torch.float32), ("stages_all", torch.bfloat16)]] + [
    pytest.param("stages_all", SPLIT_CASES[2], torch.float32, id=f"stages_all-{SPLIT_CASES[2].name}-float32")]
SPLIT_VARIANT_CASES = [c for c in LONG_VARIANT_CASES if c.name in ("long-causal-mask-sinks", "long-softcap-additive",
                                                                   "long-uniform")]


def _needs_triton_here():
    if "triton" not in runnable_backends("cpu"):
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")


def _extents(values) -> list[tuple[int, int]]:
    """[first byte, last byte + 1) of each tensor among `values`: the elements it spans."""
    out = []
    for t in values:
        if isinstance(t, torch.Tensor) and t.numel():
            lo = sum(min(0, (n - 1) * st) for n, st in zip(t.shape, t.stride()))
            hi = sum(max(0, (n - 1) * st) for n, st in zip(t.shape, t.stride())) + 1
            out.append((t.data_ptr() + lo * t.element_size(), t.data_ptr() + hi * t.element_size()))
    return out


@contextlib.contextmanager
def _reads_recorded(outside: list):
    """Every interpreted load while the block runs, checked against `outside[0]` (the byte
    ranges of the running launch's tensors, or None): addresses of unmasked lanes that fall
    outside every range are appended to `outside` (a read past a small tensor on the CPU
    meets the allocator's header before any neighbour)."""
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder

    real = InterpreterBuilder.create_masked_load

    def recording(self, ptrs, mask, other, *args, **kwargs):
        ranges = outside[0]
        if ranges is not None:
            addr = np.asarray(ptrs.data).astype(np.uint64)[np.asarray(mask.data, dtype=bool)]
            ok = np.zeros(addr.shape, dtype=bool)
            for lo, hi in ranges:
                ok |= (addr >= lo) & (addr < hi)
            outside.extend(int(a) for a in addr[~ok][:4])
        return real(self, ptrs, mask, other, *args, **kwargs)

    InterpreterBuilder.create_masked_load = recording
    try:
        yield
    finally:
        InterpreterBuilder.create_masked_load = real


@pytest.fixture
def opened_barriers(monkeypatch):
    """Split plans made cooperative with the table's forms (as on a GPU), their PHASE 0 launches
    run through an opened barrier (module docstring). Yields a record: `launches` (PHASE 0
    launches run), `counters_left` (launches that left a counter non-zero), `outside` (addresses
    read outside the launch's tensors; its first entry is the running launch's ranges), `forms`
    (each PHASE 0 launch's form constexprs)."""
    from anysoftmax.backends.triton import backend as triton_backend

    real_draft = triton_backend.draft_plan

    def cooperative_draft(layout, elem_bytes, props, backward=False, fusion=None, **kw):
        plan = real_draft(layout, elem_bytes, props, backward, fusion, **kw)
        if plan.kind != "split":
            return plan
        return replace(plan, cooperative=True,
                       options={**plan.options, **heuristics.phase0_forms(elem_bytes, backward)})

    monkeypatch.setattr(triton_backend, "draft_plan", cooperative_draft)
    record = {"launches": 0, "counters_left": [], "outside": [None], "forms": []}
    split_kernels = ("softmax_split_kernel", "softmax_bwd_kernel")
    any_split = make_plan("split", 1, 1, 1).kernel()
    real_getitem = type(any_split).__getitem__

    def opening(self, grid):
        launch = real_getitem(self, grid)
        if getattr(self.fn, "__name__", "") not in split_kernels:
            return launch

        def run(*args, **kwargs):
            if kwargs.get("PHASE") != 0 or kwargs.get("SINGLE") or kwargs.get("STATES_ONLY"):
                return launch(*args, **kwargs)
            counts, n_rows, n_chunks = kwargs["count_ptr"], kwargs["n_rows"], kwargs["n_chunks"]
            launch(*args, **{**kwargs, "PHASE": 1})  # every chunk's statistics, as PHASE 0 writes them
            counts[0:2 * n_rows:2] = n_chunks  # every chunk of every row has arrived
            record["outside"][0] = _extents(list(args) + list(kwargs.values()))
            try:
                launch(*args, **kwargs)
            finally:
                record["outside"][0] = None
            record["launches"] += 1
            record["forms"].append({k: kwargs[k] for k in FORM_FLAGS if k in kwargs})
            if bool(counts[:2 * n_rows].ne(0).any()):
                record["counters_left"].append(counts[:2 * n_rows].tolist())

        return run

    monkeypatch.setattr(type(any_split), "__getitem__", opening)
    with _reads_recorded(record["outside"]):
        yield record


def _assert_clean(record, launches_at_least: int = 1):
    assert record["launches"] >= launches_at_least, "no cooperative (PHASE 0) launch ran"
    assert record["counters_left"] == [], f"row counters left non-zero: {record['counters_left'][:2]}"
    assert record["outside"][1:] == [], f"loads outside the launch's tensors at {record['outside'][1:5]}"


@pytest.mark.parametrize("forms,case,dtype", FORM_RUNS)
def test_cooperative_forms_forward_and_backward(opened_barriers, forms, case, dtype, gen):
    """Softmax, log_softmax and (finite data) the softmax gradient through PHASE 0 with each form
    (module docstring)."""
    _needs_triton_here()
    x = case.make(gen, dtype)
    with heuristics.override(**SMALL_SPLIT, **FORMS[forms]):
        skip_if_refused(check_forward(x, case.dim, backend="triton"))
        check_forward(x, case.dim, backend="triton", log=True)
        if case.name in GRADIENT_CASES:
            check_backward(x, case.dim, backend="triton")
    _assert_clean(opened_barriers, 2)
    if forms.startswith("stages"):
        wanted = {FORMS[forms]["split_stages"]} | ({FORMS[forms]["bwd_split_stages"]} if case.name in GRADIENT_CASES
                                                    else set())
        assert {f["STAGES"] for f in opened_barriers["forms"]} == wanted, opened_barriers["forms"]


FUSED_RUNS = [pytest.param(f, c, d, log, id=f"{f}-{c.name}-{str(d)[6:]}-{'log' if log else 'softmax'}")
              for f, c, d, log in [("all", SPLIT_VARIANT_CASES[0], torch.bfloat16, False),
                                   ("all", SPLIT_VARIANT_CASES[1], torch.float32, True),
                                   ("all", SPLIT_VARIANT_CASES[2], torch.float32, False),
                                   ("stages_all", SPLIT_VARIANT_CASES[0], torch.bfloat16, False)]]


@pytest.mark.parametrize("forms,case,dtype,log", FUSED_RUNS)
def test_cooperative_forms_fused(opened_barriers, forms, case, dtype, log, gen):
    """The fused family (masks, causal prefixes, sinks, softcap, empty rows) through PHASE 0 with
    every form on: the prefetched chunk is the causal prefix's (the pipelined one's in whole
    vectors, cut after the load), the mask read at use, the kept count merged in the barrier's call."""
    _needs_triton_here()
    x = case.make(gen, dtype)
    with heuristics.override(**SMALL_SPLIT, **FORMS[forms]):
        skip_if_refused(check_variant(x, case.dim, case.kwargs(gen, x), backend="triton", log=log))
    _assert_clean(opened_barriers, 2)
    assert {f["STAGES"] for f in opened_barriers["forms"]} >= {FORMS[forms].get("split_stages", 1)}


def test_prefetch_past_the_last_item(opened_barriers, gen):
    """Rows through three row dims that no stride merges (a sliced 4-d tensor): an item past the
    last one would address memory beyond x (with one row dim its row index wraps around to a
    real row). Twelve rows of two uneven chunks on three programs: every program's last
    prefetch lies past the last item and must read nothing."""
    _needs_triton_here()
    x = torch.randn(2, 3, 4, 100, generator=gen)[:, :2, :3, :]
    with heuristics.override(**{**SMALL_SPLIT, "split_chunk_bytes": 256}, **FORMS["all"]):
        check_forward(x, 3, backend="triton")
        check_forward(x, 3, backend="triton", log=True)
    _assert_clean(opened_barriers, 2)


def test_forms_reach_the_cooperative_plans():
    """On a GPU the table's forms become the plan's constexprs of PHASE 0 only (the two-launch
    form compiles without them), forward and backward, by the size of x's elements."""
    from anysoftmax.backends.triton.backend import draft_plan
    from helpers.gpus import H100_SXM
    from anysoftmax.core.layout import RowLayout

    layout = RowLayout.from_strides((64, 1 << 18), (1 << 18, 1), (1 << 18, 1), 1)
    plain = draft_plan(layout, 4, H100_SXM)
    assert plain.constexprs(layout, False, torch.float32)["PREFETCH"] is False
    by_size = dict(split_prefetch=[[2, False], [8, True]], split_hold_input_16bit=True, **BACKWARD_FORMS)
    with heuristics.override(**by_size):
        fp32, bf16 = draft_plan(layout, 4, H100_SXM), draft_plan(layout, 2, H100_SXM)
        bwd = draft_plan(layout, 2, H100_SXM, backward=True)
    meta = fp32.constexprs(layout, False, torch.float32)
    assert (meta["PREFETCH"], meta["HOLD_INPUT"], meta["RELAXED_DEPART"]) == (True, False, False)
    meta = bf16.constexprs(layout, False, torch.bfloat16)
    assert (meta["PREFETCH"], meta["HOLD_INPUT"]) == (False, True)
    meta = bwd.constexprs(layout, False, torch.bfloat16)
    assert (meta["PREFETCH"], meta["RELAXED_DEPART"]) == (True, True)
    assert "prefetch" not in fp32.launch_options() and fp32.launch_options()["launch_cooperative_grid"] is True


def test_stages_reach_the_cooperative_plans_on_cuda():
    """split_stages / bwd_split_stages become STAGES of PHASE 0 on CUDA GPUs only: the two-launch
    form compiles with 1 (today's loop), AMD plans drop it (the backend's draft_plan says why),
    and a table asking for the prefetch too is refused, naming both keys."""
    from anysoftmax.backends.triton.backend import draft_plan
    from helpers.gpus import H100_SXM, MI300X
    from anysoftmax.core.layout import RowLayout

    layout = RowLayout.from_strides((64, 1 << 18), (1 << 18, 1), (1 << 18, 1), 1)
    assert draft_plan(layout, 4, H100_SXM).constexprs(layout, False, torch.float32)["STAGES"] == 1
    with heuristics.override(split_stages=[[2, 2], [8, 3]], bwd_split_stages=4):
        fp32, bf16 = draft_plan(layout, 4, H100_SXM), draft_plan(layout, 2, H100_SXM)
        bwd = draft_plan(layout, 4, H100_SXM, backward=True)
        amd = draft_plan(layout, 4, MI300X)
    assert fp32.constexprs(layout, False, torch.float32)["STAGES"] == 3
    assert bf16.constexprs(layout, False, torch.bfloat16)["STAGES"] == 2
    assert bwd.constexprs(layout, False, torch.float32)["STAGES"] == 4
    assert amd.cooperative and amd.constexprs(layout, False, torch.float32)["STAGES"] == 1
    assert "stages" not in fp32.launch_options()
    assert fp32.non_cooperative().constexprs(layout, False, torch.float32, 1)["STAGES"] == 1
    with heuristics.override(split_stages=3, split_prefetch=True), \
            pytest.raises(ValueError, match="split_prefetch and split_stages"):
        draft_plan(layout, 4, H100_SXM)


# The kit's quick checks of split rows in bfloat16: plain rows with special values and a dead
# head (the last programs' next items lie past the last row), and the fused family's long
# case forward and backward (mask, causal prefix, sinks, empty rows).
KIT_PIPELINED = ("forward softmax long-specials bfloat16", "forward softmax long-dead-head bfloat16",
                 "forward log_softmax long-specials bfloat16", "forward log_softmax long-dead-head bfloat16",
                 "fused-backward softmax long-causal-mask-sinks bfloat16")


def test_kit_through_the_two_stage_pipelined_split(opened_barriers, seed):
    """The conformance kit's split-row checks with the two-stage pipelined loop forward and
    backward (split_stages, bwd_split_stages 2): every PHASE 0 launch runs STAGES 2."""
    from anysoftmax.testing.kit import conformance_checks, run_checks

    _needs_triton_here()
    checks = [c for c in conformance_checks("triton", device="cpu", quick=True) if c.name in KIT_PIPELINED]
    assert len(checks) == len(KIT_PIPELINED)
    with heuristics.override(**SMALL_SPLIT, split_stages=2, bwd_split_stages=2):
        report = run_checks(checks, "triton", "cpu", seed)
    assert report.ok and len(report.passed) == len(checks), report.text()
    _assert_clean(opened_barriers, 2)
    assert {f["STAGES"] for f in opened_barriers["forms"]} == {2}


# ---- on a GPU: the barrier really waits ----------------------------------------------------

GPU_SHAPES = [(3, 300), (64, 65536), (7, 262144), (2, 1 << 20)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=["x".join(map(str, s)) for s in GPU_SHAPES])
@pytest.mark.parametrize("forms", [f for f in FORMS if f != "none"])
def test_gpu_cooperative_forms(forms, shape, dtype, gen):
    """Each form on real cooperative launches (rows of small chunks and the table's own chunks),
    softmax and log_softmax forward, the softmax gradient."""
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).cuda()
    small = SMALL_SPLIT if shape[1] <= 300 else {}
    with heuristics.override(**small, **FORMS[forms]):
        check_backward(x, 1, backend="triton")
        check_forward(x, 1, backend="triton", log=True)


@pytest.mark.gpu
@pytest.mark.parametrize("case,dtype", variant_params(SPLIT_VARIANT_CASES))
def test_gpu_cooperative_forms_fused(case, dtype, gen):
    x = case.make(gen, dtype).cuda()
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.kwargs(gen, x).items()}
    with heuristics.override(**SMALL_SPLIT, **FORMS["all"]):
        skip_if_refused(check_variant(x, case.dim, kw, backend="triton", log=False))




def test_split_chunks_are_sized_by_the_wider_operand(monkeypatch):
    """A forward split's chunk holds `split_chunk_bytes` of the wider of x and y: bfloat16
    logits written as float32 probabilities take float32's chunk (half bfloat16's elements:
    NVIDIA H100/H200, 0.96 -> 1.15 of the same-bytes copy at 512 x 128256), bfloat16 written
    as bfloat16 keeps its own; the backend plans with the request's output dtype."""
    from anysoftmax.backends.triton import backend as triton_backend
    from helpers.gpus import H100_SXM
    from anysoftmax.core.layout import RowLayout

    layout = RowLayout.from_strides((512, 128256), (128256, 1), (128256, 1), 1)
    same = triton_backend.draft_plan(layout, 2, H100_SXM)
    wider = triton_backend.draft_plan(layout, 2, H100_SXM, out_bytes=4)
    fp32 = triton_backend.draft_plan(layout, 4, H100_SXM)
    assert same.block_n == 2 * wider.block_n and wider.block_n == fp32.block_n
    assert triton_backend.draft_plan(layout, 4, H100_SXM, out_bytes=2).block_n == fp32.block_n
    assert triton_backend.draft_plan(layout, 2, H100_SXM, backward=True, out_bytes=4).block_n == \
        triton_backend.draft_plan(layout, 2, H100_SXM, backward=True).block_n

    seen = []
    real = triton_backend.draft_plan

    def spy(*args, **kwargs):
        seen.append(kwargs.get("out_bytes"))
        return real(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "draft_plan", spy)
    x = torch.randn(3, 300, dtype=torch.bfloat16)
    with heuristics.override(max_tile_elems=64, split_chunk_bytes=128):
        y = anysoftmax.softmax(x, -1, dtype=torch.float32, backend="triton")
        seen_wide = list(seen)
        anysoftmax.softmax(x, -1, backend="triton")
    torch.testing.assert_close(y, torch.softmax(x.double(), -1).float(), atol=1e-6, rtol=1e-5)
    assert seen_wide == [4] and seen[1:] == [2]
