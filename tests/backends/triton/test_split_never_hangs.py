"""The cooperative split cannot hang: its programs wait for each other at a per-row barrier, so
they are launched as a cooperative grid, which the driver co-schedules (or refuses, and the
launcher falls back to two launches that wait on nothing)."""

from __future__ import annotations

import threading

import pytest
import torch

import anysoftmax
from anysoftmax.backends._triton_common.launcher import bind
from anysoftmax.backends.triton import heuristics
from helpers import as_backend_sees_it

TIMEOUT_S = 120


def test_cooperative_plans_ask_for_a_cooperative_grid():
    from anysoftmax.backends.triton.backend import draft_plan
    from helpers.gpus import H100_SXM
    from anysoftmax.core.layout import RowLayout

    layout = RowLayout.from_strides((64, 1 << 20), (1 << 20, 1), (1 << 20, 1), 1)
    plan = draft_plan(layout, 4, H100_SXM)
    assert plan.kind == "split" and plan.cooperative
    assert plan.launch_options().get("launch_cooperative_grid") is True


@pytest.mark.parametrize("forms", [{}, {"prefetch": True, "relaxed_depart": True}, {"stages": 3}],
                         ids=["plain", "forms", "stages"])
def test_refused_cooperative_launch_falls_back_to_two_launches(monkeypatch, gen, forms):
    """A refusal ("too many blocks in cooperative launch") reruns the request as the two-launch
    form, with the right answer, and later calls go straight there; a plan with forms of the
    cooperative launch (`tuning.yaml`: split_prefetch, ...) falls back alike."""
    if "triton" not in [b.name for b in anysoftmax.list_backends() if b.available]:
        pytest.skip("triton does not run here")
    from dataclasses import replace

    x, y, layout, spec = as_backend_sees_it(torch.randn(3, 300, generator=gen), 1)
    with heuristics.override(max_tile_elems=64, long_rows="split"):
        plan = anysoftmax.get_backend("triton").plan(x, y, layout, spec)
    assert plan.split
    plan = replace(plan, cooperative=True, options={**plan.options, **forms})  # as on a GPU
    calls = {"coop": 0}
    kernel = plan.kernel()
    real_getitem = type(kernel).__getitem__

    def refusing(self, grid):
        launch = real_getitem(self, grid)

        def run(*args, **kwargs):
            if kwargs.get("PHASE") == 0:
                calls["coop"] += 1
                raise RuntimeError("Triton Error [CUDA]: too many blocks in cooperative launch")
            return launch(*args, **kwargs)
        return run

    monkeypatch.setattr(type(kernel), "__getitem__", refusing)
    run = bind(plan, layout, spec.log, spec.out_dtype)
    for _ in range(2):
        out = torch.full_like(y, float("nan"))
        run((x, out, None, None, None, None))
        torch.testing.assert_close(out, torch.softmax(x, 1))
    assert calls["coop"] == 1, "the refused cooperative launch must be tried once, then not again"


@pytest.mark.parametrize("stage_fit", ["too_large", "too_few"])
def test_pipelined_plan_that_does_not_fit_drops_its_stages(monkeypatch, stage_fit):
    """A pipelined split plan (split_stages) whose kernel needs more shared memory than a program
    may have (Triton's OutOfResources when it is compiled), or whose shared memory leaves too few
    resident programs for a row's chunks, is planned without its stages: the same cooperative
    one-launch kernel, sized by its own occupancy, never a launch the driver refuses or a row
    sent to the two launches because of the form."""
    from triton.runtime.errors import OutOfResources

    from anysoftmax.backends.triton import backend as triton_backend
    from helpers.gpus import H100_SXM

    sized = []

    def programs_per_sm(plan, *args):
        sized.append(plan.options.get("stages", 1))
        if plan.options.get("stages", 1) > 1:
            if stage_fit == "too_large":
                raise OutOfResources(H100_SXM.max_shared_mem + 1024, H100_SXM.max_shared_mem, "shared memory")
            return 1  # one program per SM: 132 < the row's 256 chunks
        return 8

    monkeypatch.setattr(triton_backend.interpreter, "interpreting", lambda: False)
    monkeypatch.setattr(triton_backend, "device_props", lambda index: H100_SXM)
    monkeypatch.setattr(triton_backend, "_programs_per_sm", programs_per_sm)
    monkeypatch.setattr(triton_backend, "device_index", lambda device: 0)
    x, y, layout, spec = as_backend_sees_it(torch.empty(4, 1 << 20), 1)
    with heuristics.override(split_stages=3):
        plan = triton_backend.TritonBackend()._make_plan(x, y, layout, spec, False)
    assert sized == [3, 1]
    assert plan.kind == "split" and plan.chunks == 256 and plan.cooperative
    assert "stages" not in plan.options and plan.constexprs(layout, False, torch.float32)["STAGES"] == 1
    assert plan.grid == min(4 * 256, (H100_SXM.multiprocessor_count * 8 // 256) * 256)


@pytest.mark.gpu
@pytest.mark.parametrize("forms", [{}, dict(split_prefetch=True, split_relaxed_depart=True),
                                   dict(split_stages=3, bwd_split_stages=3)], ids=["plain", "forms", "stages"])
def test_split_finishes_while_another_stream_holds_the_sms(gen, forms):
    """A long kernel on another stream keeps every SM busy while the cooperative split is
    launched: the split must still finish (bounded) with the right answer (also with the
    forms of the cooperative launch that `tuning.yaml` can turn on)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _spin(buf_ptr, n_iter):
        pid = tl.program_id(0)
        acc = tl.load(buf_ptr + pid)
        for _ in range(n_iter):
            acc = acc * 1.0000001 + 1e-7
        tl.store(buf_ptr + pid, acc)

    props = torch.cuda.get_device_properties(0)
    busy_programs = props.multi_processor_count * 8
    buf = torch.ones(busy_programs, device="cuda")
    x = torch.randn(64, 1 << 20, device="cuda", generator=None) * 3
    _spin[(busy_programs,)](buf, 10)  # compile first
    with heuristics.override(**forms):
        anysoftmax.softmax(x, -1)  # compile the split kernels
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        _spin[(busy_programs,)](buf, 20_000_000)  # ~ a second of every SM
    with heuristics.override(**forms):
        y = anysoftmax.softmax(x, -1)
    done = threading.Event()

    def wait():
        torch.cuda.current_stream().synchronize()
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    assert done.wait(TIMEOUT_S), f"the split kernel did not finish within {TIMEOUT_S} s beside a busy stream"
    side.synchronize()
    torch.testing.assert_close(y, torch.softmax(x.double(), -1).float())
