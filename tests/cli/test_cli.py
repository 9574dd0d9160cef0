"""The `anysoftmax` command line: matrix (exit status, errors, filters), backends, bench, merge."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anysoftmax
from anysoftmax.cli import main
from helpers import StubBackend, write_matrix

REPO = Path(__file__).resolve().parents[2]




def write(tmp_path, name="tiny", **data) -> str:
    """A small CPU matrix (torch on [2, 8] unless `data` says otherwise), as a path string."""
    base = {"name": name, "backends": ["torch"], "shapes": [[2, 8]], "devices": [{"name": "cpu", "device": "cpu"}]}
    return str(write_matrix(tmp_path, base | data, f"{name}.yaml"))


def matrix(tmp_path, config, *extra):
    out = tmp_path / "out"
    return main(["matrix", config, "--out", str(out), "--no-progress", *extra]), out


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"anysoftmax {anysoftmax.__version__}"


def test_matrix_passes_with_exit_status_0_and_writes_every_report(tmp_path, capsys):
    rc, out = matrix(tmp_path, write(tmp_path, backends=["torch", "triton"], ops=["softmax", "log_softmax"]))
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "4 passed, 0 failed, 0 skipped" in text
    for name in ("report.json", "report.csv", "report.md", "status.png"):
        assert (out / name).exists(), name


@pytest.mark.usefixtures("broken")
def test_a_failing_backend_sets_the_exit_status(tmp_path, capsys):
    rc, out = matrix(tmp_path, write(tmp_path, backends=["broken_wrong", "torch"]))
    text = capsys.readouterr().out
    assert rc == 1
    assert "1 passed, 1 failed, 0 skipped" in text and "failed" in text
    cells = {c["backend"]: c for c in json.loads((out / "report.json").read_text())["cells"]}
    assert cells["broken_wrong"]["status"] == "failed" and cells["torch"]["status"] == "passed"


@pytest.mark.usefixtures("broken")
def test_skips_pass_unless_strict(tmp_path):
    config = write(tmp_path, backends=["broken_absent", "torch"])
    assert matrix(tmp_path, config)[0] == 0
    assert matrix(tmp_path, config, "--strict")[0] == 1


def test_bad_yaml_exits_2_with_named_errors(tmp_path, capsys):
    config = write(tmp_path, backends=["torhc"], shapes=[{"M": 4, "N": {"start": 8, "stop": 64, "step": 0}}])
    rc, out = matrix(tmp_path, config)
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert f"{config}: backends[0]: unknown value 'torhc'; allowed: " in err
    assert f"{config}: shapes[0].N.step: step must be a positive integer, got 0" in err


def test_device_filter_dry_run_and_list_devices(tmp_path, capsys):
    config = write(tmp_path, devices=[{"name": "cpu", "device": "cpu"}, {"name": "far", "device": "cuda:64"}])
    assert main(["matrix", config, "--list-devices"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"entry": "cpu", "device": "cpu"},
                                                   {"entry": "far", "device": "cuda:64"}]
    assert main(["matrix", config, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "cpu (cpu): 1 cells, runs on cpu" in text and "far (cuda:64): 1 cells, skipped" in text
    assert main(["matrix", config, "--device", "gpu"]) == 2
    assert "no device entry named 'gpu'; allowed: 'cpu', 'far'" in capsys.readouterr().err
    rc, out = matrix(tmp_path, config, "--device", "far")
    assert rc == 0
    data = json.loads((out / "report.json").read_text())
    assert [c["status"] for c in data["cells"]] == ["skipped"] and list(data["devices"]) == ["far"]
    assert matrix(tmp_path, config, "--device", "far", "--require-device")[0] == 1
    assert matrix(tmp_path, config, "--device", "cpu", "--require-device")[0] == 0


def test_merge_reports_of_separate_jobs(tmp_path, capsys):
    config = write(tmp_path, devices=[{"name": "a", "device": "cpu"}, {"name": "b", "device": "cpu"}])
    for entry in ("a", "b"):
        assert main(["matrix", config, "--device", entry, "--out", str(tmp_path / entry), "--no-progress"]) == 0
    merged = tmp_path / "merged"
    assert main(["merge", str(tmp_path / "a" / "report.json"), str(tmp_path / "b" / "report.json"),
                 "--out", str(merged)]) == 0
    data = json.loads((merged / "report.json").read_text())
    assert list(data["devices"]) == ["a", "b"] and data["counts"]["passed"] == 2
    assert main(["merge", str(tmp_path / "a" / "report.json"), str(tmp_path / "a" / "report.json"),
                 "--out", str(merged)]) == 2
    assert "appears in more than one report" in capsys.readouterr().err


def test_backends_lists_availability_and_reasons(capsys):
    assert main(["backends"]) == 0
    text = capsys.readouterr().out
    assert "torch" in text and "triton" in text and "cuda:" in text


def test_bench_hands_its_arguments_to_the_benchmark_suite(monkeypatch):
    from anysoftmax.bench import softmax as bench

    seen = []
    monkeypatch.setattr(bench, "main", lambda argv, prog: seen.append((argv, prog)) or 3)
    assert main(["bench", "--quick", "--dtypes", "float32"]) == 3
    assert seen == [(["--quick", "--dtypes", "float32"], "anysoftmax bench")]


def test_backends_json_is_list_backends(capsys):
    from dataclasses import asdict

    import anysoftmax

    assert main(["backends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backends"] == json.loads(json.dumps([asdict(b) for b in anysoftmax.list_backends()]))


def test_explain_with_a_gpu_name_answers_for_that_gpu_and_for_this_machine(capsys):
    """--gpu-name H100 names what the H100's table takes there; this machine's own choice (what
    `select` does here) is its own line, unless the GPU named is the one here."""
    from anysoftmax import cli
    from anysoftmax.core import registry, selection

    name = selection.resolve_name("H100")
    spec = cli.parse_request("64x131072", "cuda")
    assert main(["backends", "--explain", "64x131072", "--direction", "both", "--gpu-name", "H100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    here = selection.device_name(spec.device) == name
    assert len(lines) == (2 if here else 4), lines
    for direction, group in zip(("fwd", "bwd"), (lines[:len(lines) // 2], lines[len(lines) // 2:])):
        rule, _ = selection.lookup(spec, direction, name)
        assert group[0].startswith(f"64x131072 {direction} on {name}: {rule.backend} <- selection table: "), group[0]
        if not here:
            chosen = registry.select(spec, direction=direction).name
            assert group[1].startswith(f"64x131072 {direction} on cuda here: {chosen} <- "), group[1]


def test_backends_escapes_markup(monkeypatch, capsys):
    from anysoftmax.core import registry
    class _Missing(StubBackend):
        name = "missing_extra"

        def is_available(self):
            return "pip install 'anysoftmax[wave]' first"

    registry.register(_Missing())
    try:
        assert main(["backends"]) == 0
    finally:
        registry.unregister("missing_extra")
    assert "pip install 'anysoftmax[wave]' first" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["directory", "missing", "not-yaml"])
@pytest.mark.parametrize("command", ["matrix", "merge"])
def test_bad_paths_exit_2_naming_the_file(tmp_path, capsys, kind, command):
    path = {"directory": tmp_path, "missing": tmp_path / "nope.yaml", "not-yaml": tmp_path / "notes.txt"}[kind]
    if kind == "not-yaml":
        path.write_text("hello")
    args = ["matrix", str(path)] if command == "matrix" else ["merge", str(path), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(path) in err and ("directory" in err or "not found" in err or "not a YAML" in err), err


def test_python_m_anysoftmax_chooses_the_interpreter_itself(tmp_path):
    """A fresh process without TRITON_INTERPRET: on a machine without a GPU the command sets it
    before the kernels are imported, so the triton cells run (and pass) on the CPU."""
    config = write(tmp_path, backends=["triton"], dtypes=["float32", "float16"])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "anysoftmax", "matrix", config, "--out", str(tmp_path / "o"),
                           "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed, 0 failed, 0 skipped" in proc.stdout
    if not torch.cuda.is_available():
        assert "Triton interpreter" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout
