"""The test suite's own rules, checked on its source: laid out like the package, one shared
helpers package that test modules import (never each other), no backend registered when a test
module is imported, one matrix-YAML writer, unique module names (pytest imports them by name)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "anysoftmax"
TEST_MODULES = sorted(p for p in TESTS.rglob("test_*.py") if "ascend_frontend" not in p.parts)


def _imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found


def test_no_test_module_imports_another():
    bad = {str(p.relative_to(TESTS)): sorted(m for m in _imports(ast.parse(p.read_text())) if m.startswith("test_"))
           for p in TEST_MODULES}
    assert {k: v for k, v in bad.items() if v} == {}, "shared code belongs in tests/helpers"


def test_module_names_are_unique():
    names = [p.name for p in TEST_MODULES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_no_backend_is_registered_at_import():
    """Registering at import would change every later test's registry (the fixtures and the
    kit's `registered()` register for one test only)."""
    bad = []
    for p in TEST_MODULES + [TESTS / "conftest.py", *(TESTS / "helpers").glob("*.py")]:
        for node in ast.parse(p.read_text()).body:  # module-level statements only
            for call in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
                if isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", "")) in (
                        "register", "register_all"):
                    bad.append(f"{p.relative_to(TESTS)}:{call.lineno}")
    assert bad == []


def test_one_matrix_yaml_writer():
    dumps = ("yaml." + "safe_dump(", "yaml." + "dump(")  # (spelled apart: this file is scanned too)
    writers = [str(p.relative_to(TESTS)) for p in TEST_MODULES if any(d in p.read_text() for d in dumps)]
    # (the selection test writes selection tables, another file format)
    assert writers == ["core/test_selection.py"], writers


def test_backend_folders_are_backends():
    backends = {p.name for p in (PACKAGE / "backends").iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in (TESTS / "backends").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= backends, folders - backends
    assert {"triton", "triton_ascend", "wave", "cute"} <= folders
    suites = {p.name for p in (TESTS / "backends" / "triton_ascend").glob("test_*.py")}
    assert suites == {"test_ascend_interpreter.py", "test_ascend_cuda_crosscheck.py", "test_ascend_host.py",
                      "test_ascend_npu.py"}
