"""The matrix on Ray: a simulated three-node cluster on this machine (bound to 127.0.0.1).

Nodes: the head (CPU only), one with a custom `FAKEGPU` resource, one with `NPU: 1`. Entries
pinned by `resources:` must run only there (checked from each cell's Ray node id); a worker
that dies in a cell costs one retry, then the cell fails and the rest still pass; results
equal a local run's cell for cell; an impossible entry is skipped as not schedulable.
"""

import importlib.util
import os
import sys
import uuid
from pathlib import Path

import pytest

from anysoftmax.matrix import FAILED, PASSED, SKIPPED, load_config, run_matrix
from anysoftmax.matrix.report import load_report, write_reports
from anysoftmax.matrix.resources import accelerator_types, capacity, ray_options
from anysoftmax.matrix.schema import ConfigError
from helpers import write_matrix

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed (pip install 'anysoftmax[ray]')", allow_module_level=True)

TESTS = Path(__file__).resolve().parents[1]
LOOPBACK = {"node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="module")
def cluster():
    """Three nodes; worker processes find anysoftmax and the test plugins through PYTHONPATH,
    and share a token made for this test (the user's ~/.ray/auth_token is not touched)."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                                             "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS / "plugins"), str(TESTS), str(TESTS.parent)] + (
        [saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = uuid.uuid4().hex
    # Ray reads the auth mode once per process: import it only now, or make it read again
    # (what Ray's own token set-up does) when something imported it earlier.
    # Keep the driver on loopback too (Ray would swap 127.0.0.1 for the host's address).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    imported = "ray" in sys.modules
    import ray
    if imported:
        ray._raylet.Config.initialize("")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**LOOPBACK, "num_cpus": 2, "include_dashboard": False})
    nodes = {"head": c.head_node,
             "fakegpu": c.add_node(**LOOPBACK, num_cpus=1, resources={"FAKEGPU": 1}),
             "npu": c.add_node(**LOOPBACK, num_cpus=1, resources={"NPU": 1})}
    ray.init(address=c.address, _node_ip_address="127.0.0.1", log_to_driver=False)
    ids = {name: n.node_id for name, n in nodes.items()}
    yield c, ids
    ray.shutdown()
    c.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def config(tmp_path, **data):
    return load_config(write_matrix(tmp_path, data, "ray.yaml"))


def entries(backends):
    return [{"name": "head cpu", "device": "cpu"},
            {"name": "gpu-like", "device": "cpu", "resources": {"FAKEGPU": 1}, "backends": backends},
            {"name": "npu host", "device": "cpu", "resources": {"NPU": 1}, "backends": backends}]


def test_cells_run_only_on_nodes_with_their_resources_and_match_a_local_run(tmp_path, cluster):
    _, ids = cluster
    backends = ["torch", "broken_wrong", "broken_crash", "broken_absent", "broken_picky"]
    cfg = config(tmp_path, plugins=["broken_plugin"], backends=backends, dtypes=["float32", "float64"],
                 shapes=[[3, 17], {"shape": [2, 3, 5], "dims": [0, -1]}], devices=entries(backends))
    seen = []
    from anysoftmax.matrix.ray_runner import run_matrix_ray

    run = run_matrix_ray(cfg, "auto", on_result=seen.append)
    assert len(seen) == len(run.results) == 3 * 5 * 2 * 3
    node = {"gpu-like": ids["fakegpu"], "npu host": ids["npu"]}
    for r in run.results:
        if r.status == SKIPPED and "imaginary" in r.reason:
            continue
        assert r.node and r.host, r.cell.id
        if r.cell.entry in node:
            assert r.node == node[r.cell.entry], (r.cell.id, r.node)
    assert {r.node for r in run.results if r.cell.entry == "head cpu" and r.node} <= set(ids.values())

    local = run_matrix(cfg)  # in this process: the same cells, the same seeds
    assert [r.cell for r in run.results] == [r.cell for r in local.results]
    for a, b in zip(run.results, local.results):
        assert (a.status, a.reason, a.err_ratio, a.max_abs_err) == (b.status, b.reason, b.err_ratio,
                                                                    b.max_abs_err), a.cell.id
    counts = run.counts()
    assert counts[PASSED] and counts[FAILED] and counts[SKIPPED]  # every outcome was exercised

    write_reports(run, tmp_path / "out")
    back = load_report(tmp_path / "out" / "report.json")
    assert [(r.status, r.node, r.host) for r in back.results] == [(r.status, r.node, r.host) for r in run.results]
    assert run.environment["ray"]["nodes"] == 3 and not run.interrupted


def test_dying_worker_costs_one_retry_then_the_cell_fails_and_the_rest_pass(tmp_path, cluster):
    _, ids = cluster
    cfg = config(tmp_path, plugins=["broken_plugin"], backends=["torch", "broken_exit"], shapes=[[2, 8], [4, 5]],
                 devices=[{"name": "gpu-like", "device": "cpu", "resources": {"FAKEGPU": 1}}])
    from anysoftmax.matrix.ray_runner import run_matrix_ray

    run = run_matrix_ray(cfg, "auto")
    got = {(r.cell.backend, r.cell.shape): r for r in run.results}
    for shape in ((2, 8), (4, 5)):
        dead = got["broken_exit", shape]
        assert dead.status == FAILED, dead
        assert "Ray worker died while running this cell" in dead.reason
        assert "died again on its retry" in dead.reason
        assert got["torch", shape].status == PASSED and got["torch", shape].node == ids["fakegpu"]


def test_entry_no_node_can_hold_is_not_schedulable_instead_of_hanging(tmp_path, cluster):
    cfg = config(tmp_path, backends=["torch"], shapes=[[2, 8]],
                 devices=[{"name": "tpu", "device": "cpu", "resources": {"TPU": 1}},
                          {"name": "gpu", "device": "cuda"},
                          {"name": "npu", "device": "npu"},
                          {"name": "cpu", "device": "cpu"}])
    from anysoftmax.matrix.ray_runner import run_matrix_ray

    run = run_matrix_ray(cfg, "auto")
    by = {r.cell.entry: r for r in run.results}
    assert by["tpu"].status == SKIPPED and "not schedulable" in by["tpu"].reason and "TPU: 1" in by["tpu"].reason
    assert by["gpu"].status == SKIPPED and "GPU: 1" in by["gpu"].reason
    assert run.devices["tpu"]["reason"] == by["tpu"].reason
    # the NPU node exists, so the npu entry is scheduled there; this torch has no torch_npu
    assert by["npu"].status == SKIPPED and "torch_npu" in by["npu"].reason and by["npu"].node == cluster[1]["npu"]
    assert by["cpu"].status == PASSED


def test_ctrl_c_leaves_a_valid_partial_report(tmp_path, cluster):
    cfg = config(tmp_path, backends=["torch"], shapes=[[2, n] for n in range(4, 40)],
                 devices=[{"name": "cpu", "device": "cpu"}])
    seen = []

    def on_result(r):
        seen.append(r)
        if len(seen) == 3:
            raise KeyboardInterrupt

    from anysoftmax.matrix.ray_runner import run_matrix_ray

    run = run_matrix_ray(cfg, "auto", on_result=on_result)
    assert run.interrupted == "interrupted (Ctrl-C)"
    assert [r.status for r in run.results[:3]] == [PASSED] * 3 and len(run.results) == 36
    assert all(r.status == SKIPPED and "not run" in r.reason for r in run.results[3:])
    write_reports(run, tmp_path / "out")
    assert "Partial report: interrupted (Ctrl-C)" in (tmp_path / "out" / "report.md").read_text()


def test_resource_mapping_and_validation(tmp_path):
    def entry(**kw):
        return config(tmp_path, backends=["torch"], shapes=[[2, 8]], devices=[{"name": "e", **kw}]).devices[0]

    known = ["H100", "H200", "A100", "A100-80G", "AMD-Instinct-MI300X-OAM", "Ascend910B"]
    assert ray_options(entry(device="cuda", match=["H100", "H200"]), known) == {
        "num_cpus": 0, "num_gpus": 1, "label_selector": {"ray.io/accelerator-type": "in(H100,H200)"}}
    assert ray_options(entry(device="cuda", match="MI300X"), known)["label_selector"] == {
        "ray.io/accelerator-type": "in(AMD-Instinct-MI300X-OAM)"}
    assert "label_selector" not in ray_options(entry(device="cuda", match=["H100", "RTX 9999"]), known)
    assert ray_options(entry(device="npu:0", match="910B"), known) == {
        "num_cpus": 0, "num_gpus": 0, "resources": {"NPU": 1},
        "label_selector": {"ray.io/accelerator-type": "in(Ascend910B)"}}
    assert ray_options(entry(device="cpu", resources={"host_a": 1}, labels={"zone": "lab"})) == {
        "num_cpus": 1, "num_gpus": 0, "resources": {"host_a": 1}, "label_selector": {"zone": "lab"}}
    assert accelerator_types(("a100",), known) == ["A100", "A100-80G"]
    nodes = [{"Alive": True, "Resources": {"CPU": 8, "GPU": 2}, "Labels": {"ray.io/accelerator-type": "H100"}},
             {"Alive": False, "Resources": {"CPU": 8, "GPU": 8}, "Labels": {"ray.io/accelerator-type": "H100"}},
             {"Alive": True, "Resources": {"CPU": 8, "GPU": 4}, "Labels": {"ray.io/accelerator-type": "A100"}}]
    assert capacity(ray_options(entry(device="cuda", match="H100"), known), nodes) == (2, "")
    assert capacity(ray_options(entry(device="cuda"), known), nodes) == (6, "")
    n, why = capacity(ray_options(entry(device="cuda", match="MI300X"), known), nodes)
    assert n == 0 and "in(AMD-Instinct-MI300X-OAM)" in why and "2 alive node(s)" in why

    with pytest.raises(ConfigError) as err:
        config(tmp_path, ray=5, backends=["torch"], shapes=[[2, 8]],
               devices=[{"name": "e", "device": "cpu", "resources": {"GPU": 1, "NPU": -1, "x": True}},
                        {"name": "f", "device": "cpu", "labels": ["zone"]}])
    text = str(err.value)
    for part in ("ray.yaml: ray: expected 'auto'", "devices[0].resources.GPU: 'GPU' is set by the entry's `device`",
                 "devices[0].resources.NPU: an amount must be a positive number, got -1",
                 "devices[0].resources.x: an amount must be a positive number, got True",
                 "devices[1].labels: expected a mapping of node-label keys"):
        assert part in text, text
    assert config(tmp_path, ray="auto", backends=["torch"], shapes=[[2, 8]],
                  devices=[{"name": "e", "device": "cpu"}]).ray == "auto"
