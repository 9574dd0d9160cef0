"""Peers in the matrix (`peer:torch`, `peer:copy`, ...): checked like backends, skipped with the
reason when their package is missing or they cannot do the request, timed with the
back-to-back host time beside the median."""

import importlib.util

import pytest

from anysoftmax.matrix import FAILED, PASSED, SKIPPED, ConfigError, load_config, run_matrix
from anysoftmax.matrix import providers
from helpers import write_matrix

BENCH = {"warmup_ms": 1, "rep_ms": 3, "cpu": True}
SHAPES = [[3, 33], {"shape": [2, 3, 5], "dims": [0, 2]}]


def config(tmp_path, **data):
    data = {"shapes": SHAPES, "devices": [{"name": "cpu", "device": "cpu"}], **data}
    return load_config(write_matrix(tmp_path, data, "peers.yaml"))


def by_backend(run):
    out = {}
    for r in run.results:
        out.setdefault(r.cell.backend, []).append(r)
    return out


def test_peers_pass_copy_is_reference_only_and_missing_packages_skip(tmp_path):
    cfg = config(tmp_path, backends=["peer:torch", "peer:copy", "auto", "peer:liger", "peer:quack", "peer:seed"],
                 ops=["softmax", "log_softmax"], directions=["forward", "backward"], dtypes=["float32", "bfloat16"],
                 checks=["conformance", "benchmark"], benchmark=BENCH)
    groups = by_backend(run_matrix(cfg))
    for name in ("peer:torch", "auto"):
        rs = groups[name]
        assert len(rs) == 2 * 2 * 2 * 3 and all(r.status == PASSED for r in rs), [(r.cell.id, r.reason) for r in rs]
        assert all(r.err_ratio is not None and r.err_ratio <= 1 for r in rs)  # checked, not assumed
        assert all(r.ms > 0 and r.gbps > 0 and r.frac_copy > 0 and r.host_us > 0 for r in rs)
    for r in groups["peer:copy"]:
        assert r.status == PASSED and r.err_ratio is None and "reference" in r.note
        assert r.host_us > 0 and r.frac_copy > 0
    for name, package in (("peer:liger", "liger_kernel"), ("peer:quack", "quack")):
        if importlib.util.find_spec(package) is None:
            assert {r.status for r in groups[name]} == {SKIPPED}
            assert all("not importable" in r.reason for r in groups[name])
    # the tutorial kernel is a CUDA row kernel: every CPU cell is skipped, each with its reason
    assert {r.status for r in groups["peer:seed"]} == {SKIPPED}
    assert all(r.reason.startswith("peer:seed") for r in groups["peer:seed"])


def test_a_wrong_peer_fails(tmp_path, monkeypatch):
    forward, backward = providers.forward, providers.backward
    monkeypatch.setattr(providers, "forward", lambda *a: (lambda x: forward(*a)(x) * 1.02))
    # forgot the row-sum term: y * dy
    monkeypatch.setattr(providers, "backward", lambda name, *a: (lambda y, dy: y * dy)
                        if providers.is_peer(name) else backward(name, *a))
    cfg = config(tmp_path, backends=["peer:torch", "peer:copy"], directions=["forward", "backward"])
    groups = by_backend(run_matrix(cfg))
    assert {r.status for r in groups["peer:torch"]} == {FAILED}
    assert all("exceeds" in r.reason for r in groups["peer:torch"])
    assert {r.status for r in groups["peer:copy"]} == {PASSED}  # reference-only: never compared


def test_host_time_only_when_the_cpu_is_timed(tmp_path):
    cfg = config(tmp_path, backends=["peer:torch"], checks=["conformance", "benchmark"],
                 benchmark={"warmup_ms": 1, "rep_ms": 3})
    assert all(r.status == PASSED and r.host_us is None and r.ms is None for r in run_matrix(cfg).results)


def test_unknown_peer_is_a_schema_error_naming_the_peers(tmp_path):
    with pytest.raises(ConfigError) as info:
        config(tmp_path, backends=["peer:torch", "peer:numpy", "torch"])
    (err,) = info.value.errors
    assert "backends[1]" in err and "'peer:numpy'" in err and "peer:torch.compile" in err and "auto" in err


def test_peer_spelling_cannot_collide_with_backends():
    import anysoftmax

    backends = {b.name for b in anysoftmax.list_backends()}
    assert "torch" in backends and "peer:torch" in providers.PEER_NAMES
    assert not backends & set(providers.PEER_NAMES)
