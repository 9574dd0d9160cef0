"""Test setup: the Triton interpreter on machines without a GPU, poisoned outputs, fresh seeds."""

import importlib.util
import os
import random
import zlib

import torch

# Without a GPU, Triton kernels run through the interpreter on CPU tensors. The flag is read
# when kernels are decorated, so it must be set before anysoftmax is imported.
HAS_CUDA = torch.cuda.is_available()
# Not on an Ascend machine either: there the kernels compile for the NPU.
if not HAS_CUDA and importlib.util.find_spec("torch_npu") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Every output a kernel writes starts as NaN: an element it forgets to write fails the test.
os.environ["ANYSOFTMAX_POISON_OUTPUTS"] = "1"

import pytest  # noqa: E402

SEED = int(os.environ.get("ANYSOFTMAX_TEST_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return [f"anysoftmax: random seed {SEED} (set ANYSOFTMAX_TEST_SEED to replay); "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')!r}; CUDA: {HAS_CUDA}"]


def pytest_collection_modifyitems(config, items):
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
