"""Matrix YAML validation: every error names the file, the key path and what is allowed."""

import pytest

from anysoftmax.config import matrix_names, matrix_path
from anysoftmax.matrix import ConfigError, expand, load_config
from helpers import config_errors, write_matrix

SHIPPED = matrix_names()  # the matrices inside the package (importlib.resources)

BASE = {"backends": ["torch"], "shapes": [[2, 8]], "devices": [{"name": "cpu", "device": "cpu"}]}


def errors_of(tmp_path, **changes) -> list[str]:
    return config_errors(tmp_path, {**BASE, **changes})


def one_error(tmp_path, **changes) -> str:
    errs = errors_of(tmp_path, **changes)
    assert len(errs) == 1, errs
    return errs[0]


def test_minimal_config_expands_to_its_cells(tmp_path):
    cfg = load_config(write_matrix(tmp_path, BASE, "m.yaml"))
    assert cfg.name == "m"
    cells = expand(cfg)
    assert [(c.backend, c.shape, c.dim, c.dtype, c.op, c.direction) for c in cells] == [
        ("torch", (2, 8), -1, "float32", "softmax", "forward")]


def test_unknown_backend_names_the_allowed_ones(tmp_path):
    err = one_error(tmp_path, backends=["torch", "trition"])
    assert "backends[1]" in err and "'trition'" in err and "allowed: " in err and "triton" in err


def test_unknown_dtype_names_the_allowed_ones(tmp_path):
    err = one_error(tmp_path, dtypes=["float32", "fp8"])
    assert "dtypes[1]" in err and "'fp8'" in err and "bfloat16" in err


def test_negative_size(tmp_path):
    err = one_error(tmp_path, shapes=[[2, -8]])
    assert "shapes[0][1]" in err and "non-negative" in err and "-8" in err


def test_sweep_with_step_zero(tmp_path):
    err = one_error(tmp_path, shapes=[{"M": 4, "N": {"start": 256, "stop": 1024, "step": 0}}])
    assert "shapes[0].N.step" in err and "positive" in err


def test_typo_in_a_key_is_an_error_not_a_smaller_matrix(tmp_path):
    err = one_error(tmp_path, dtype=["float16"])
    assert "dtype" in err and "unknown key" in err and "dtypes" in err


def test_typo_in_a_device_entry_key(tmp_path):
    err = one_error(tmp_path, devices=[{"name": "cpu", "device": "cpu", "shape": [[4, 4]]}])
    assert "devices[0].shape" in err and "allowed:" in err and "shapes" in err


def test_unknown_device_type(tmp_path):
    err = one_error(tmp_path, devices=[{"name": "g", "device": "gpu:0"}])
    assert "devices[0].device" in err and "cpu, cuda, npu" in err


def test_dim_out_of_range_for_a_shape(tmp_path):
    err = one_error(tmp_path, dims=[-1, 2])
    assert "dims" in err and "dim 2" in err and "[2, 8]" in err and "-2..1" in err


def test_all_errors_are_reported_together(tmp_path):
    errs = errors_of(tmp_path, backends=["nope"], dtypes=["fp8"], ops=["softmin"], directions=["sideways"])
    assert len(errs) == 4
    assert any("'softmin'" in e and "log_softmax" in e for e in errs)
    assert any("'sideways'" in e and "backward" in e for e in errs)


def test_duplicates_and_missing_keys(tmp_path):
    errs = errors_of(tmp_path, dtypes=["fp32", "float32"],
                     devices=[{"name": "a", "device": "cpu"}, {"name": "a"}])
    text = "\n".join(errs)
    assert "listed twice" in text and "duplicate entry name 'a'" in text and "missing `device`" in text


def test_benchmark_without_conformance_is_refused(tmp_path):
    err = one_error(tmp_path, checks=["benchmark"])
    assert "checks" in err and "conformance" in err


def test_bad_range_and_benchmark_settings(tmp_path):
    errs = errors_of(tmp_path, shapes=[{"M": 1, "N": {"start": 64, "stop": 8}}],
                     benchmark={"rep_ms": -5, "repeat": 3})
    text = "\n".join(errs)
    assert "exactly one of `step`" in text
    assert "benchmark.rep_ms" in text and "benchmark.repeat" in text


def test_not_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write_matrix(tmp_path, "devices: [unclosed"))
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_sweeps_are_inclusive_and_entries_override_the_top_level(tmp_path):
    cfg = load_config(write_matrix(tmp_path, {
        **BASE,
        "shapes": [{"M": [1, 2], "N": {"start": 256, "stop": 12672, "step": 128}}],
        "devices": [
            {"name": "a", "device": "cpu"},
            {"name": "b", "device": "cpu", "dtypes": ["bf16"], "ops": ["log_softmax"],
             "shapes": [{"M": 3, "N": {"start": 128, "stop": 1024, "mul": 2}},
                        {"shape": [2, 3, 5], "dims": [0, 2]}]},
        ],
    }))
    a, b = cfg.devices
    ns = sorted({case.shape[1] for case in a.shapes})
    assert ns == [128 * i for i in range(2, 100)]  # the Triton tutorial's sweep, stop included
    assert len(a.shapes) == 2 * 98 and a.dtypes == ("float32",)
    assert [(c.shape, c.dims) for c in b.shapes] == [
        ((3, 128), (-1,)), ((3, 256), (-1,)), ((3, 512), (-1,)), ((3, 1024), (-1,)), ((2, 3, 5), (0, 2))]
    assert b.dtypes == ("bfloat16",) and b.ops == ("log_softmax",)
    cells = expand(cfg, ["b"])
    assert len(cells) == 6 and {c.entry for c in cells} == {"b"}
    assert len({c.seed for c in cells}) == 6  # every cell draws its own data


def test_every_shipped_matrix_is_found():
    assert {"default", "ci", "h100", "mi300x", "ascend-910b"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_validate(name):
    # Every backend a shipped config names is registered: a config never silently skips cells.
    cfg = load_config(matrix_path(name))
    assert expand(cfg), f"{name} has no cells"


def test_the_default_matrix_checks_and_times_on_the_cpu():
    """`bash run.sh matrix` on a CPU machine checks and times, as the README says: every
    backend, op and direction it checks on the CPU is also timed there (wall clock), on one shape."""
    cells = [c for c in expand(load_config(matrix_path("default"))) if c.device == "cpu"]
    kinds = {(c.backend, c.op, c.direction) for c in cells}
    timed = {(c.backend, c.op, c.direction) for c in cells if c.benchmark and c.bench_cpu}
    assert kinds and timed == kinds, sorted(kinds - timed)
