"""`python -m anysoftmax.bench.lse_merge --device cpu`: the whole path on tiny shapes (checked
results, every provider timed, JSON and PNG written); says nothing about speed."""

import json

from anysoftmax.bench import lse_merge


def test_cpu_run_writes_checked_rows(tmp_path):
    assert lse_merge.main(["--device", "cpu", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "cpu"
    for stem, op in (("pieces_logsumexp", "logsumexp"), ("pieces_merge", "merge_states")):
        rows = json.loads((folder / f"{stem}.json").read_text())["results"]
        assert rows and all(r["op"] == op and r["status"] == "ok" and r["us"] > 0 for r in rows), rows
        assert {"anysoftmax", "torch", "copy"} <= {r["provider"] for r in rows}
    merge = json.loads((folder / "pieces_merge.json").read_text())["results"]
    assert any(r["provider"] == "vllm-dropin" for r in merge)
