"""The pieces ops in the matrix (`ops: [logsumexp, merge_states]`, `matrix.lse_merge_cells`):
checked against the float64 reference, timed, skipped with the reason where they do not apply."""

from anysoftmax.matrix import FAILED, PASSED, SKIPPED, load_config, run_matrix
from anysoftmax.matrix import lse_merge_cells
from helpers import write_matrix

BENCH = {"warmup_ms": 1, "rep_ms": 3, "cpu": True}


def _run(tmp_path, **data):
    data = {"devices": [{"name": "cpu", "device": "cpu"}], **data}
    return run_matrix(load_config(write_matrix(tmp_path, data, "pieces.yaml")))


def test_lse_merge_cells_pass_and_are_timed(tmp_path):
    run = _run(tmp_path, backends=["torch", "triton", "peer:torch", "peer:copy"],
               ops=["logsumexp", "merge_states"], dtypes=["float32", "bfloat16"],
               shapes=[[3, 2, 40], {"shape": [4, 33], "dims": [0, 1]}], directions=["forward", "backward"],
               checks=["conformance", "benchmark"], benchmark=BENCH)
    forward = [r for r in run.results if r.cell.direction == "forward"]
    assert forward and all(r.status == PASSED for r in forward), [(r.cell.id, r.reason) for r in forward
                                                                  if r.status != PASSED]
    checked = [r for r in forward if r.cell.backend != "peer:copy"]
    assert all(r.err_ratio is not None and r.err_ratio <= 1 for r in checked)
    assert all(r.ms > 0 and r.gbps > 0 and r.host_us > 0 for r in forward)
    backward = [r for r in run.results if r.cell.direction == "backward"]
    assert backward and all(r.status == SKIPPED and "forward cells only" in r.reason for r in backward)


def test_a_wrong_logsumexp_fails(tmp_path, monkeypatch):
    provider = lse_merge_cells.provider
    monkeypatch.setattr(lse_merge_cells, "provider", lambda cell, device: (lambda x: provider(cell, device)(x) + 1e-3))
    run = _run(tmp_path, backends=["torch"], ops=["logsumexp"], shapes=[[5, 30]])
    assert {r.status for r in run.results} == {FAILED}
