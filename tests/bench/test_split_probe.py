"""benchmarks/split_probe.py, checked without a GPU: its candidates name keys the tuning table
has, its whole flow (overrides, reference checks, plans, timing, tables, JSON) runs through the
interpreter on tiny rows, and its Nsight Compute summary reads ncu's raw CSV."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from anysoftmax.config import load_tuning
from helpers import runnable_backends

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "split_probe.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("split_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_candidates_name_known_tuning_keys(probe):
    known = set(load_tuning("triton"))
    for name, over in {**probe.CANDIDATES, "tiny": probe.TINY}.items():
        assert set(over) <= known, f"{name}: unknown keys {set(over) - known}"
    assert set(probe.DEFAULT_CANDIDATES) <= set(probe.CANDIDATES) | {"cute"}


def test_probe_runs_through_the_interpreter(probe, tmp_path, capsys, monkeypatch):
    if "triton" not in runnable_backends("cpu"):
        pytest.skip("triton does not run on CPU here: TRITON_INTERPRET is not set")
    monkeypatch.setenv("ANYSOFTMAX_LAUNCHER", "triton")  # (what the probe sets; undone after the test)
    assert probe.main(["--device", "cpu", "--tiny", "--shapes", "2x300", "--dtypes", "float32",
                       "--candidates", "base,prefetch_small,two_launch,cute", "--jobs", "0", "--rep-ms", "1",
                       "--warmup-ms", "0", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "split_probe.json").read_text())
    rows = {(r["direction"], r["candidate"]): r for r in doc["rows"]}
    assert set(rows) == {(d, c) for d in ("fwd", "bwd") for c in ("copy", "base", "prefetch_small", "two_launch")}
    assert all(r["ok"] for r in rows.values()), [r for r in rows.values() if not r["ok"]]
    assert rows[("fwd", "base")]["kind"] == "split" and rows[("fwd", "base")]["chunks"] == 5
    # the same plan is measured once (under the interpreter no plan is cooperative)
    assert rows[("fwd", "prefetch_small")]["same_as"] == "base"
    assert doc["cute_skipped"]
    text = capsys.readouterr().out
    assert "choice per dtype and direction" in text and "2x300" in text
    assert (tmp_path / "split_probe.txt").read_text().count("2x300") == 8


def test_ncu_summary_reads_the_raw_csv(probe, tmp_path):
    stalls = {"barrier": 6.5, "long_scoreboard": 5.9, "membar": 0.2, "wait": 1.0, "not_selected": 9.0, "selected": 8.0}
    names = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
             "dram__bytes_read.sum", "dram__bytes_write.sum", "sm__warps_active.avg.pct_of_peak_sustained_active",
             "launch__registers_per_thread", "launch__grid_size",
             "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"] + \
        [f"smsp__average_warps_issue_stalled_{k}_per_issue_active.ratio" for k in stalls]
    units = ["", "", "nsecond", "%", "byte", "byte", "%", "register/thread", "", "byte"] + ["inst"] * len(stalls)
    values = ["0", "softmax_split_kernel", "210,530", "73.21", "268435456", "268435456", "30.65", "96", "656", "0"] + \
        [str(v) for v in stalls.values()]
    csv = tmp_path / "raw.csv"
    csv.write_text("==PROF== Disconnected\n" + "\n".join(",".join(f'"{v}"' for v in row)
                                                      for row in (names, units, values)) + "\n")
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps([dict(candidate="prefetch", shape="512x262144", dtype="bfloat16", direction="fwd")]))
    lines = probe.ncu_summary(str(csv), str(labels))
    assert lines[0] == "1 kernels profiled"
    assert lines[1].startswith("prefetch 512x262144 bf16 fwd: 210.5 us, DRAM 73.2% of peak (2550 GB/s)")
    assert "warps active 30.6%" in lines[1] and "96 regs" in lines[1] and "local memory: none" in lines[1]
    assert lines[1].endswith("stalls/issue: barrier 6.50, long_scoreboard 5.90, wait 1.00, membar 0.20")


def test_kernel_lines_mark_a_stage_form_left_unpipelined(probe):
    """A pipelined candidate (stagesN) whose compiled kernel holds no cp.async (a Triton that did
    not pipeline the loop) is marked in the summary, beside its registers and shared memory."""
    row = dict(shape="512x262144", dtype="float32", direction="fwd", chunk=4096, warps=4, grid=640, regs=95, spills=0)
    doc = {"rows": [dict(row, candidate="copy"),
                    dict(row, candidate="stages3", forms=["stages3"], shared=32784, cp_async=24),
                    dict(row, candidate="stages4", forms=["stages4"], shared=16, cp_async=0),
                    dict(row, candidate="base", forms=[], shared=16, cp_async=0)]}
    lines = probe.kernel_lines(doc)
    assert [line.split()[0] for line in lines] == ["stages3", "stages4", "base"]
    assert "shared 32784, cp.async 24" in lines[0] and not lines[0].endswith("NOT PIPELINED")
    assert lines[1].endswith("NOT PIPELINED") and not lines[2].endswith("NOT PIPELINED")


@pytest.mark.parametrize("mode", [[], ["--ncu"]], ids=["measure", "ncu"])
def test_without_a_gpu_it_stops_with_a_clear_message(probe, tmp_path, monkeypatch, mode):
    """On a machine without a CUDA GPU (as seen by torch) the probe and its profiling mode exit
    at once with a message naming the way to run the flow on the CPU, not a torch traceback."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        probe.main(["--out", str(tmp_path), "--candidates", "base,stages2", "--shapes", "2x300", *mode])
    assert "no CUDA GPU" in str(stop.value.code) and "--device cpu" in str(stop.value.code)
    assert not (tmp_path / "split_probe.json").exists()
