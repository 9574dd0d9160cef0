"""Selection tables on the CPU: reading them, the registry's automatic path through them (with
the torch and triton backends, on CUDA-typed requests the interpreter can plan), writing them
from benchmark results (`anysoftmax select`), and `anysoftmax backends --explain`."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from unittest import mock

import pytest
import torch

import anysoftmax
from anysoftmax import cli
from anysoftmax.bench import selection_table
from anysoftmax.core import SoftmaxSpec, registry, selection

GPU = "FAKE GPU 9000"


def _spec(shape, dim=-1, dtype=torch.float32, log=False):
    spec = SoftmaxSpec.from_tensor(torch.empty(shape, dtype=dtype, device="meta"), dim, log=log)
    return replace(spec, device=torch.device("cuda"))


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    """$ANYSOFTMAX_CONFIG_DIR with a selection/ folder, and CUDA requests named GPU."""
    (tmp_path / "selection").mkdir()
    monkeypatch.setenv(selection.ENV_CONFIG_DIR, str(tmp_path))
    monkeypatch.setattr(selection, "device_name", lambda device: GPU if device.type == "cuda" else "")
    return tmp_path / "selection"


def _write(folder, rules, device=GPU):
    import yaml

    (folder / f"{selection.device_key(device)}.yaml").write_text(yaml.safe_dump(dict(device=device, rules=rules)))


def _rule(backend, n, direction="fwd", dtype="float32", dim="last", rows=(1, None)):
    return dict(direction=direction, dtype=dtype, dim=dim, n=list(n), rows=list(rows), backend=backend)


@pytest.fixture
def triton_runs_here():
    if registry.unavailable_reason("triton") is not None:
        pytest.skip(f"triton unavailable here: {registry.unavailable_reason('triton')}")


def test_device_key():
    assert selection.device_key("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert selection.device_key("AMD Instinct MI300X (gfx942)") == "AMD_Instinct_MI300X_gfx942"


def test_table_rules_drive_the_automatic_choice(table_dir, triton_runs_here):
    _write(table_dir, [_rule("torch", (1, 1000)), _rule("triton", (1001, None)),
                       _rule("torch", (1, None), direction="bwd")])
    assert registry.select(_spec((8, 100))).name == "torch"  # the table beats triton's priority
    assert registry.select(_spec((8, 5000))).name == "triton"
    assert registry.select(_spec((8, 5000)), direction="bwd").name == "torch"
    assert registry.select(_spec((8, 100), dtype=torch.bfloat16)).name == "triton"  # no rule: priority
    assert registry.select(_spec((100, 8), dim=0)).name == "triton"  # non-last dim: no rule


def test_explicit_choices_ignore_the_table(table_dir, triton_runs_here):
    _write(table_dir, [_rule("torch", (1, None))])
    assert registry.select(_spec((8, 100)), backend="triton").name == "triton"
    with mock.patch.dict(os.environ, {registry.ENV_BACKEND: "triton"}):
        assert registry.select(_spec((8, 100))).name == "triton"


def test_unusable_rule_falls_back_to_priority_with_debug_log(table_dir, triton_runs_here, caplog):
    _write(table_dir, [_rule("cute", (1, None)), _rule("no-such-backend", (1, None), dtype="bfloat16")])
    with caplog.at_level(logging.DEBUG, logger="anysoftmax"):
        assert registry.select(_spec((8, 100))).name == "triton"
        assert registry.select(_spec((8, 100), dtype=torch.bfloat16)).name == "triton"
    assert "names 'cute'" in caplog.text and "passed over" in caplog.text
    assert "no-such-backend" in caplog.text


def test_broken_table_never_breaks_softmax(table_dir, caplog):
    (table_dir / f"{selection.device_key(GPU)}.yaml").write_text("rules: [{direction: sideways}]\n")
    with caplog.at_level(logging.WARNING, logger="anysoftmax"):
        assert registry.select(_spec((8, 100))).name in ("triton", "torch")
    assert "selection table unusable" in caplog.text


def test_parse_errors_name_the_file():
    with pytest.raises(selection.TableError, match="x.yaml: rule 0: missing"):
        selection.parse_table({"rules": [{"direction": "fwd"}]}, "x.yaml")
    with pytest.raises(selection.TableError, match="n must be"):
        selection.parse_table({"rules": [_rule("torch", (1, "many"))]}, "x.yaml")
    with pytest.raises(selection.TableError, match="direction must be"):
        selection.parse_table({"rules": [_rule("torch", (1, None), direction="up")]}, "x.yaml")


def test_request_class():
    assert selection.request_class(_spec((4, 6, 10))) == ("float32", "last", 10, 24)
    assert selection.request_class(_spec((4, 6, 10), dim=1)) == ("float32", "non-last", 6, 40)
    assert selection.request_class(_spec((4, 6, 1), dim=1)) == ("float32", "last", 6, 4)


# ---------------------------------------------------------------- writing tables

def _row(provider, dtype, m, n, us, status="ok", dim=-1, host_us=0.0):
    return dict(provider=provider, dtype=dtype, M=m, N=n, dim=dim, us=us if status == "ok" else 0.0, host_us=host_us,
                frac_of_copy=(2 * m * n * 4 / (us * 1e-6) / 1e9 / 3000) if status == "ok" else 0.0,
                gbps=0.0, max_err=0.0, status=status, detail="")


def _doc(direction, rows, device=GPU):
    return dict(device=device, copy_gbps=3000.0, torch="2.x", triton="3.x", direction=direction, results=rows)


def test_build_table_rules_and_ranges():
    fwd = _doc("fwd", [
        _row("anysoftmax:triton", "float32", 4096, 1024, 10.0), _row("anysoftmax:torch", "float32", 4096, 1024, 30.0),
        _row("anysoftmax:triton", "float32", 1024, 65536, 100.0), _row("anysoftmax:torch", "float32", 1024, 65536, 60.0),
        _row("anysoftmax:triton", "float32", 16, 131072, 10.0), _row("anysoftmax:torch", "float32", 16, 131072, 10.1),
        _row("anysoftmax:triton", "float32", 512, 131072, 100.0), _row("anysoftmax:torch", "float32", 512, 131072, 50.0),
        _row("anysoftmax:triton", "float32", 64, 8192, 1.0, dim=0), _row("anysoftmax:torch", "float32", 64, 8192, 9.0, dim=0),
        _row("anysoftmax", "float32", 4096, 1024, 1.0),  # the automatic choice: never a candidate
        _row("quack", "float32", 4096, 1024, 1.0),  # a peer: never a candidate
    ])
    table = selection_table.build_table([fwd], margin=0.02)
    parsed = selection.parse_table(table, "t.yaml")
    pick = lambda shape, dim="last": parsed.lookup("fwd", "float32", dim, shape[1], shape[0]).backend  # noqa: E731
    assert pick((4096, 1024)) == "triton"
    assert pick((1024, 65536)) == "torch"
    assert pick((16, 131072)) == "triton"  # 1% faster is noise: priority stands
    assert pick((512, 131072)) == "torch"
    assert pick((64, 8192), "non-last") == "triton"
    # Ranges cover every length: the ends extrapolate from the nearest shape; row counts reach
    # down to the square root of the fewest measured (latency-bound tensors: priority).
    assert pick((4096, 3)) == "triton" and pick((512, 10**7)) == "torch"
    assert parsed.lookup("fwd", "float32", "last", 1024, 63) is None  # fewer than sqrt(4096) rows
    assert pick((4096, 8191)) == "triton" and pick((4096, 8193)) == "torch"  # split at sqrt(1024 * 65536)
    assert table["candidates"] == ["torch", "triton"]
    assert all(r["measured"] for r in table["rules"])


def test_host_bound_calls_count_their_host_time():
    """A kernel that is faster on the device but costs more host time a call loses small shapes."""
    fwd = _doc("fwd", [
        _row("anysoftmax:triton", "float32", 8, 1024, 5.0, host_us=15.0),
        _row("anysoftmax:torch", "float32", 8, 1024, 3.0, host_us=21.0),
        _row("anysoftmax:triton", "float32", 1024, 65536, 100.0, host_us=100.0),
        _row("anysoftmax:torch", "float32", 1024, 65536, 60.0, host_us=61.0),
    ])
    parsed = selection.parse_table(selection_table.build_table([fwd]), "t.yaml")
    assert parsed.lookup("fwd", "float32", "last", 1024, 8).backend == "triton"
    assert parsed.lookup("fwd", "float32", "last", 65536, 1024).backend == "torch"


def test_crashed_cell_is_no_candidate_there():
    """A backend that crashed on a shape is never chosen for its class, even where it wins next door."""
    fwd = _doc("fwd", [
        _row("anysoftmax:triton", "float32", 512, 262144, 100.0), _row("anysoftmax:torch", "float32", 512, 262144, 50.0),
        _row("anysoftmax:triton", "float32", 64, 1048576, 40.0), _row("anysoftmax:torch", "float32", 64, 1048576, 0.0,
                                                                       status="failed"),
    ])
    table = selection_table.build_table([fwd])
    parsed = selection.parse_table(table, "t.yaml")
    assert parsed.lookup("fwd", "float32", "last", 262144, 512).backend == "torch"
    assert parsed.lookup("fwd", "float32", "last", 1048576, 64) is None  # priority decides there
    assert parsed.lookup("fwd", "float32", "last", 4 << 20, 64) is None
    assert "torch" not in table["excluded"] and table["failed"][0].startswith("torch: fwd float32 64x1048576")


def test_nonconforming_backend_is_never_chosen():
    """torch is fastest everywhere but gave a wrong result once: never a candidate."""
    fwd = _doc("fwd", [
        _row("anysoftmax:triton", "float32", 64, 1024, 50.0), _row("anysoftmax:torch", "float32", 64, 1024, 10.0),
        _row("anysoftmax:wave", "float32", 64, 1024, 40.0),
        _row("anysoftmax:torch", "bfloat16", 64, 1024, 10.0, status="wrong"),
        _row("anysoftmax:triton", "bfloat16", 64, 1024, 50.0), _row("anysoftmax:wave", "bfloat16", 64, 1024, 49.9),
    ])
    table = selection_table.build_table([fwd])
    assert "torch" in table["excluded"] and "wrong" in table["excluded"]["torch"]
    assert {(r["dtype"], r["backend"]) for r in table["rules"]} == {("float32", "wave"), ("bfloat16", "triton")}


def test_build_table_refuses_mixed_devices_and_empty_results():
    with pytest.raises(ValueError, match="2 devices"):
        selection_table.build_table([_doc("fwd", [], "A"), _doc("bwd", [], "B")])
    with pytest.raises(ValueError, match="nothing to choose from"):
        selection_table.build_table([_doc("fwd", [_row("quack", "float32", 4, 4, 1.0)])])
    with pytest.raises(ValueError, match="nothing to choose from"):  # one candidate compares nothing
        selection_table.build_table([_doc("fwd", [_row("anysoftmax:torch", "float32", 4, 4, 1.0)])])


def test_shapes_with_one_candidate_leave_a_gap():
    fwd = _doc("fwd", [
        _row("anysoftmax:triton", "float32", 64, 1024, 50.0), _row("anysoftmax:torch", "float32", 64, 1024, 10.0),
        _row("anysoftmax:torch", "float32", 64, 65536, 10.0),  # triton not measured here
        _row("anysoftmax:triton", "float32", 64, 1048576, 50.0), _row("anysoftmax:torch", "float32", 64, 1048576, 5.0,
                                                                        status="failed"),
        _row("anysoftmax:torch", "float16", 64, 1024, 10.0),  # a dtype only one candidate ran
    ])
    parsed = selection.parse_table(selection_table.build_table([fwd]), "t.yaml")
    assert parsed.lookup("fwd", "float32", "last", 1024, 64).backend == "torch"
    assert parsed.lookup("fwd", "float32", "last", 65536, 64) is None
    assert parsed.lookup("fwd", "float32", "last", 1048576, 64) is None  # triton alone ran there
    assert parsed.lookup("fwd", "float16", "last", 1024, 64) is None


def test_select_command_writes_a_table_the_registry_reads(tmp_path, table_dir, triton_runs_here, capsys):
    fwd = _doc("fwd", [_row("anysoftmax:triton", "float32", 64, 128, 50.0),
                       _row("anysoftmax:torch", "float32", 64, 128, 10.0)])
    bwd = _doc("bwd", [_row("anysoftmax:triton", "float32", 64, 128, 10.0),
                       _row("anysoftmax:torch", "float32", 64, 128, 50.0)])
    paths = []
    for doc in (fwd, bwd):
        paths.append(tmp_path / f"softmax_{doc['direction']}.json")
        paths[-1].write_text(json.dumps(doc))
    assert cli.main(["select", *map(str, paths), "--out", str(table_dir)]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "-> torch" in out
    assert registry.select(_spec((64, 128))).name == "torch"
    assert registry.select(_spec((64, 128)), direction="bwd").name == "triton"
    backend, why = registry.explain(_spec((64, 128)))
    assert backend == "torch" and "selection table" in why and "rule 0" in why


def test_logsumexp_reads_the_lse_rules(tmp_path, table_dir, triton_runs_here, capsys):
    """`anysoftmax select` over a pieces benchmark document (`direction: lse`) writes rules the
    automatic choice of logsumexp follows; softmax's own choice ignores them."""
    lse = _doc("lse", [_row("anysoftmax:triton", "float32", 64, 128, 50.0),
                       _row("anysoftmax:torch", "float32", 64, 128, 10.0),
                       _row("torch", "float32", 64, 128, 5.0)])  # a peer: never a candidate
    path = tmp_path / "pieces_logsumexp.json"
    path.write_text(json.dumps(lse))
    assert cli.main(["select", str(path), "--out", str(table_dir)]) == 0
    assert "-> torch" in capsys.readouterr().out
    spec = _spec((64, 128))
    assert registry.select_op("logsumexp", spec).name == "torch"
    assert registry.select(spec).name == "triton"  # no fwd rule: priority
    assert registry.select_op("logsumexp", _spec((64, 128), dtype=torch.bfloat16)).name == "triton"  # no rule
    assert registry.select_op("logsumexp", spec, backend="triton").name == "triton"  # explicit wins
    assert registry.runners(spec, "logsumexp")[:1] == ["triton"] and "torch" in registry.runners(spec, "logsumexp")


def test_select_command_usage_errors(tmp_path, capsys):
    assert cli.main(["select"]) == cli.EXIT_USAGE
    assert "--run" in capsys.readouterr().err
    assert cli.main(["select", str(tmp_path / "missing.json")]) == cli.EXIT_USAGE


def test_backends_explain(table_dir, triton_runs_here, capsys):
    _write(table_dir, [_rule("torch", (1, 4096))])
    assert cli.main(["backends", "--explain", "8x100", "--explain", "8x100000:bf16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("8x100 fwd on cuda: torch <- selection table") and "rule 0" in lines[0]
    assert lines[1].startswith("8x100000:bf16 fwd on cuda: triton <- priority")
    assert cli.main(["backends", "--explain", "8y100"]) == cli.EXIT_USAGE


def test_shipped_tables_parse():
    """Every table shipped in the package reads, names registered backends, and justifies each
    rule with measurements."""
    from importlib import resources
    from pathlib import Path

    folder = Path(str(resources.files("anysoftmax") / "configs" / "selection"))
    known = {b.name for b in anysoftmax.list_backends()}
    for path in folder.glob("*.yaml"):
        table = selection.load_table(path.stem)
        assert table.rules, path
        for rule in table.rules:
            assert rule.backend in known and rule.measured, (path, rule)


def test_explain_names_the_shipped_h100_rule(capsys):
    assert selection.table_path("NVIDIA H100 80GB HBM3") is not None, "the H100 table ships with the package"
    assert cli.main(["backends", "--explain", "1024x131072", "--gpu-name", "NVIDIA H100 80GB HBM3"]) == 0
    line = capsys.readouterr().out
    assert "NVIDIA_H100_80GB_HBM3.yaml rule" in line
