"""The README says what the code does: its first lines are the two commands, its YAML reference
is the schema's, and the paths it names exist."""

from __future__ import annotations

import re
from pathlib import Path

from anysoftmax.matrix import keys

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_first_lines_are_the_two_commands():
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block is not None and block.start() < 40, "the README must open (after its title) with the commands"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["bash run.sh matrix", "bash run.sh test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash run.sh test" in ci, "CI must run the README's test command"


def test_yaml_reference_is_the_schema():
    assert keys.accepted() == keys.described(), "every key the schema accepts is described, and no other"
    assert keys.reference_markdown() in README, \
        "README's matrix YAML reference is stale: paste `python -m anysoftmax.matrix.keys`"


def test_named_paths_exist():
    # Backticked repository paths (anysoftmax/..., benchmarks/..., tests/...) must exist.
    named = set(re.findall(r"`((?:anysoftmax|benchmarks|tests)/[\w./-]+?)`", README))
    missing = sorted(p for p in named if "<" not in p and "*" not in p and not (ROOT / p).exists())
    assert not missing, f"README names paths that do not exist: {missing}"


def test_example_backend_runs():
    code = re.search(r"### Add a backend in five steps\n\n```python\n(.*?)```", README, re.S).group(1)
    import torch

    import anysoftmax
    from anysoftmax.core import SoftmaxSpec, compare

    namespace: dict = {}
    exec(compile(code, "README example", "exec"), namespace)
    anysoftmax.register(namespace["MyBackend"]())
    try:
        x = torch.randn(5, 40) * 3
        y = anysoftmax.softmax(x, 1, backend="mine")
        assert compare(y, x, SoftmaxSpec.from_tensor(x, 1)).ok
        assert "mine" in [s.name for s in anysoftmax.list_backends()]
    finally:
        anysoftmax.unregister("mine")
