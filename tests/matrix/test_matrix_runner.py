"""The matrix runner on small CPU configs: passes, failures, skips, benchmarks, workers, reports."""

import json

import pytest
import torch

from anysoftmax.matrix import FAILED, PASSED, SKIPPED, expand, load_config, run_matrix
from anysoftmax.matrix.report import write_reports
from anysoftmax.matrix.workers import assign
from helpers import write_matrix


def config(tmp_path, **data):
    return load_config(write_matrix(tmp_path, data, f"{data.get('name', 'tiny')}.yaml"))


def test_small_matrix_passes_on_torch_and_triton_and_writes_reports(tmp_path):
    cfg = config(tmp_path, backends=["torch", "triton"], dtypes=["float32", "bfloat16"],
                 ops=["softmax", "log_softmax"], directions=["forward", "backward"],
                 shapes=[[3, 33], {"shape": [2, 3, 5], "dims": [0, 2]}],
                 devices=[{"name": "cpu", "device": "cpu"}])
    seen = []
    run = run_matrix(cfg, on_result=seen.append)
    assert len(run.results) == len(seen) == len(expand(cfg)) == 2 * 2 * 2 * 2 * 3
    assert [r.status for r in run.results] == [PASSED] * len(run.results), \
        [(r.cell.id, r.reason) for r in run.results if r.status != PASSED]
    # the error is measured, not assumed: real rounding shows up in the narrow dtype
    assert all(r.err_ratio is not None and r.err_ratio <= 1 for r in run.results)
    assert max(r.err_ratio for r in run.results if r.cell.dtype == "bfloat16") > 0

    paths = write_reports(run, tmp_path / "out")
    names = {p.name for p in paths}
    assert {"report.json", "report.csv", "report.md", "status.png"} <= names
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["counts"] == {"passed": 48, "failed": 0, "skipped": 0}
    assert len(data["cells"]) == 48 and data["environment"]["torch"] == torch.__version__
    csv_lines = (tmp_path / "out" / "report.csv").read_text().strip().splitlines()
    assert len(csv_lines) == 49 and csv_lines[0].startswith("index,entry,device,backend")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**48 passed, 0 failed, 0 skipped**" in md and "![status](status.png)" in md


def test_missing_device_is_skipped_with_its_reason_never_passed(tmp_path):
    cfg = config(tmp_path, backends=["torch"], shapes=[[2, 8]],
                 devices=[{"name": "far gpu", "device": "cuda:64"}, {"name": "cpu", "device": "cpu"}])
    run = run_matrix(cfg)
    gpu = [r for r in run.results if r.cell.entry == "far gpu"]
    assert [r.status for r in gpu] == [SKIPPED]
    reason = gpu[0].reason
    assert ("no CUDA GPU" in reason) if not torch.cuda.is_available() else ("cuda:64 is not present" in reason)
    assert [r.status for r in run.results if r.cell.entry == "cpu"] == [PASSED]
    write_reports(run, tmp_path / "out")
    assert reason in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.usefixtures("broken")
def test_failing_crashing_and_unavailable_backends(tmp_path):
    cfg = config(tmp_path, backends=["broken_wrong", "broken_crash", "broken_absent", "broken_picky", "torch"],
                 dtypes=["float32", "float64"], shapes=[[4, 16]], devices=[{"name": "cpu", "device": "cpu"}])
    run = run_matrix(cfg)
    got = {(r.cell.backend, r.cell.dtype): r for r in run.results}
    for dtype in ("float32", "float64"):
        wrong = got["broken_wrong", dtype]
        assert wrong.status == FAILED and "exceeds" in wrong.reason and wrong.err_ratio > 1
        crash = got["broken_crash", dtype]
        assert crash.status == FAILED and "crashed: RuntimeError: deliberate crash" in crash.reason
        assert "broken_crash.run" in crash.traceback or "deliberate" in crash.traceback
        absent = got["broken_absent", dtype]
        assert absent.status == SKIPPED and "imaginary XPU-9000" in absent.reason
        assert got["torch", dtype].status == PASSED  # the run went on after the failures
    assert got["broken_picky", "float32"].status == PASSED
    assert got["broken_picky", "float64"].status == SKIPPED
    assert "float64 is not supported" in got["broken_picky", "float64"].reason


def test_benchmark_cells_on_cpu(tmp_path):
    bench = {"warmup_ms": 1, "rep_ms": 5}
    cfg = config(tmp_path, backends=["torch"], shapes=[[64, 256], [64, 1024]], checks=["conformance", "benchmark"],
                 directions=["forward", "backward"],
                 devices=[{"name": "timed", "device": "cpu", "benchmark": {**bench, "cpu": True}},
                          {"name": "untimed", "device": "cpu", "benchmark": bench}])
    run = run_matrix(cfg)
    assert all(r.status == PASSED for r in run.results)
    for r in run.results:
        if r.cell.entry == "timed":
            assert r.timer == "cpu" and r.ms > 0 and r.gbps > 0 and r.copy_gbps > 0
            assert r.frac_copy == pytest.approx(r.gbps / r.copy_gbps)
        else:
            assert r.gbps is None and "benchmark skipped: needs a GPU" in r.note
    paths = write_reports(run, tmp_path / "out")
    assert "bandwidth_timed_softmax_forward_float32.png" in {p.name for p in paths}
    assert "(cpu)" in (tmp_path / "out" / "report.md").read_text()


def test_assign_spreads_gpu_cells_round_robin_and_cpu_cells_over_workers(tmp_path):
    cfg = config(tmp_path, backends=["torch"], shapes=[[1, 8], [2, 8], [3, 8], [4, 8]],
                 devices=[{"name": "g", "device": "cuda"}, {"name": "c", "device": "cpu"}])
    cells = expand(cfg)
    slots = {a.slot: a for a in assign(cells, {"g": ["cuda:0", "cuda:1"], "c": ["cpu"]}, cpu_workers=2)}
    assert sorted(slots) == ["cpu#0", "cpu#1", "cuda:0", "cuda:1"]
    assert [c.shape[0] for c in slots["cuda:0"].cells] == [1, 3]
    assert [c.shape[0] for c in slots["cuda:1"].cells] == [2, 4]
    assert [c.shape[0] for c in slots["cpu#0"].cells] == [1, 3] and not slots["cuda:0"].interpret
    assert slots["cpu#0"].threads == 2 and slots["cuda:0"].threads == 0  # CPU work must not starve GPU launches
    assert sum(len(a.cells) for a in slots.values()) == len(cells)


@pytest.mark.usefixtures("broken")
def test_two_workers_and_a_worker_that_dies(tmp_path):
    """Cells spread over 2 worker processes; a backend that kills its process fails its cell
    with the exit code and a fresh worker finishes the rest."""
    cfg = config(tmp_path, plugins=["broken_plugin"], shapes=[[2, 8], [3, 8], [4, 8]],
                 devices=[{"name": "dies", "device": "cpu", "backends": ["broken_exit"], "shapes": [[2, 8]]},
                          {"name": "cpu", "device": "cpu", "backends": ["torch", "triton"]}])
    run = run_matrix(cfg, workers=2, cell_timeout=120)
    assert len(run.results) == 1 + 2 * 3
    dead = run.results[0]
    assert dead.cell.backend == "broken_exit" and dead.status == FAILED
    assert "died (exit code 7) while running this cell" in dead.reason
    rest = run.results[1:]
    assert all(r.status == PASSED for r in rest), [(r.cell.id, r.reason) for r in rest]
    assert all(r.ran_on == "cpu" and r.device_name for r in rest)
