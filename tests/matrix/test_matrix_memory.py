"""A cell too large for its device is refused before anything is allocated, naming the bytes it
needs and the bytes the device has; ordinary cells are not affected."""

from __future__ import annotations

import json
import subprocess
import sys


from anysoftmax.matrix import memory
from anysoftmax.matrix.cells import Cell
from helpers import write_matrix


def _cell(shape, direction="forward", benchmark=False, dtype="float32"):
    return Cell(0, "cpu", "cpu", "torch", "softmax", direction, dtype, tuple(shape), -1, benchmark,
                10.0, 10.0, False, 1)


def test_estimate_counts_reference_and_backward():
    fwd = memory.bytes_needed(_cell([1000, 1000]), "cpu")["cpu"]
    bwd = memory.bytes_needed(_cell([1000, 1000], "backward"), "cpu")["cpu"]
    # at least input, output and the float64 reference; the backward holds more
    assert fwd >= 1000 * 1000 * (4 + 4 + 8) and bwd > fwd
    on_gpu = memory.bytes_needed(_cell([1000, 1000]), "cuda:0")
    assert set(on_gpu) == {"cuda:0"}  # CUDA cells compare on the GPU itself


def test_small_cells_fit_and_huge_ones_are_refused():
    assert memory.refusal(_cell([64, 64]), "cpu") is None
    why = memory.refusal(_cell([100000, 100000, 100000]), "cpu")
    assert why is not None and "bytes" in why and "free" in why and "cpu" in why


def test_cli_reports_the_refusal_and_runs_the_rest(tmp_path):
    config = write_matrix(tmp_path, {"name": "huge", "backends": ["torch"], "shapes": [[100000, 100000, 100000], [3, 17]],
                                     "devices": [{"name": "cpu", "device": "cpu"}]}, "huge.yaml")
    proc = subprocess.run([sys.executable, "-m", "anysoftmax", "matrix", str(config), "--out", str(tmp_path / "o"),
                           "--no-progress", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {tuple(r["shape"]): r for r in json.loads((tmp_path / "o" / "report.json").read_text())["cells"]}
    huge = rows[(100000, 100000, 100000)]
    assert huge["status"] == "skipped" and "GiB" in huge["reason"] and "refused before running" in huge["reason"]
    assert rows[(3, 17)]["status"] == "passed"
