"""Test setup: the Triton interpreter on machines without a GPU, poisoned outputs, fresh seeds."""

import os
import random
import sys
import zlib
from pathlib import Path

import torch

HAS_CUDA = torch.cuda.is_available()
# Backend plugins the tests name (`--plugin`, a matrix's `plugins:`, the kit's wrong backends):
# importable by module name here and, through PYTHONPATH, in the processes tests start.
PLUGINS = Path(__file__).resolve().parent / "plugins"
sys.path.insert(0, str(PLUGINS))
# Every output a kernel writes starts as NaN: an element it forgets to write fails the test.
# (Read when anysoftmax is imported, so set first.)
os.environ["ANYSOFTMAX_POISON_OUTPUTS"] = "1"

# Without a GPU or NPU the backends say the Triton kernels can only run interpreted: then they
# run through the interpreter on CPU tensors (decided before any kernel is defined).
from anysoftmax import plugins  # noqa: E402

plugins.use_interpreter_if_needed()

import pytest  # noqa: E402

SEED = int(os.environ.get("ANYSOFTMAX_TEST_SEED", random.SystemRandom().randrange(2**31)))
# pytest-xdist's workers start after this module is imported in the controller: they inherit the
# seed through the environment, so the whole run uses the one seed the header prints.
os.environ["ANYSOFTMAX_TEST_SEED"] = str(SEED)


def _seed_lines() -> list[str]:
    return [f"anysoftmax: random seed {SEED} (set ANYSOFTMAX_TEST_SEED to replay); "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')!r}; CUDA: {HAS_CUDA}",
            f"anysoftmax: fuzzer replay seed {SEED} (tests/testing/test_fuzz.py; replay: ANYSOFTMAX_TEST_SEED={SEED}, "
            f"or fuzz_backend(NAME, calls=N, seed={SEED}))"]


def pytest_configure(config):
    # Below -q pytest prints no "N passed" line: every run ends with its counts and its seed
    # (`bash run.sh test -qq` included), so -qq and quieter read as -q.
    if config.option.verbose < -1 and not config.option.collectonly:
        config.option.verbose = -1


def pytest_report_header(config):
    return _seed_lines()


def pytest_sessionstart(session):
    # `-q` (run.sh test) hides the header: the seed still comes first, so a run that is killed
    # before its summary can be replayed.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and session.config.get_verbosity() < 0:
        for line in _seed_lines():
            reporter.write_line(line)


def pytest_terminal_summary(terminalreporter):
    # Again at the end, where a failure is read.
    for line in _seed_lines():
        terminalreporter.write_line(line)


# The files that take longest on CI's CPU (seconds of test time, 2 cores), collected first: with
# `--dist loadfile --no-loadscope-reorder` (run.sh) files are handed out in this order and each
# runs whole on one worker; one of these started last would keep that worker busy long after the
# other has finished (longest first evens the two out).
LONGEST_FILES = (
    "backends/cute/test_cute_compile.py",  # 315
    "backends/triton/test_sampler_compiles.py",  # 285
    "testing/test_conformance.py",  # 260
    "backends/triton_ascend/test_ascend_interpreter.py",  # 230
    "backends/wave/test_wave.py",  # 210
    "test_wheel.py",  # 190
    "backends/triton/test_sampling_runs.py",  # 180
    "backends/triton/test_lse_rows.py",  # 170
    "distributed/test_distributed_gloo.py",  # 155
    "backends/triton/test_triton_fused_paths.py",  # 125
    "bench/test_bench_cli.py",  # 115
    "backends/triton/test_sampling_kernels.py",  # 80
    "backends/triton/test_compile_targets.py",  # 75
    "api/test_row_scale.py",  # 75
    "api/test_properties.py",  # 70
    "backends/triton/test_sampling_general_path.py",  # 65
    "test_layers.py",  # 50
)


def _longest_first(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    tests = Path(__file__).resolve().parent

    def key(item):
        try:
            name = item.path.resolve().relative_to(tests).as_posix()
        except ValueError:
            name = ""
        return rank.get(name, len(LONGEST_FILES))

    items.sort(key=key)  # (stable: the order within a file and among the rest is pytest's)


def pytest_collection_modifyitems(config, items):
    _longest_first(items)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible: torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen(request):
    """A generator seeded from the session seed and the test's id: fresh data every session,
    reproducible with ANYSOFTMAX_TEST_SEED."""
    g = torch.Generator()
    g.manual_seed((SEED + zlib.crc32(request.node.nodeid.encode())) % 2**63)
    return g


@pytest.fixture
def seed(request) -> int:
    """An int seed from the session seed and the test's id (for the kit's checks, which make
    their own generators)."""
    return (SEED + zlib.crc32(request.node.nodeid.encode())) % 2**31


@pytest.fixture
def broken():
    """The deliberately broken backends (tests/plugins/broken_backends.py), registered for one
    test and removed after it, unless a matrix run imported `broken_plugin` meanwhile: importing
    it registers them for the rest of the process (a module is imported once), and a later test
    in the same process (pytest-xdist runs several files in one) names that plugin again."""
    import broken_backends

    broken_backends.register_all()
    yield
    if "broken_plugin" not in sys.modules:
        broken_backends.unregister_all()
