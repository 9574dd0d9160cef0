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


def test_host_us_is_the_best_of_rounds_taken_in_turns():
    """`host_us` is the best of `HOST_ROUNDS` rounds of back-to-back calls, the providers of a
    cell taking turns within each round (one noisy round no longer sets it); all are kept in
    `host_us_rounds`, and a provider failing in a round is marked failed, not fatal."""
    order, times = [], {"a": iter([9.0, 4.0, 65.0, 5.0, 6.0]), "b": iter([3.0, 2.0, 8.0, 2.5, 7.0])}

    def b2b(call, device, calls):
        order.append(call())
        return next(times[order[-1]])

    def failing():
        raise RuntimeError("no launch")

    rows = [dict(provider=p, status="ok") for p in ("a", "b", "c")]
    lse_merge._host_rounds([(rows[0], lambda: "a"), (rows[1], lambda: "b"), (rows[2], failing)], b2b, "cpu", 3)
    assert order == ["a", "b"] * lse_merge.HOST_ROUNDS
    assert rows[0]["host_us_rounds"] == [9.0, 4.0, 65.0, 5.0, 6.0] and rows[0]["host_us"] == 4.0
    assert rows[1]["host_us"] == 2.0
    assert rows[2]["status"] == "failed" and rows[2]["host_us"] is None and "no launch" in rows[2]["detail"]
