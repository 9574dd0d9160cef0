"""One direction through the code: api -> dispatch -> registry -> backend (plans) -> launcher ->
kernel. Checked on the source (the import graph) and in fresh interpreters (what importing a
module really pulls in), so a shortcut back up a layer or an import circle fails here."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import anysoftmax
from anysoftmax import dispatch

PKG = Path(anysoftmax.__file__).resolve().parent
ROOT = PKG.parent


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = sorted(module_name(p) for p in PKG.rglob("*.py") if p.name != "__main__.py")


def imports_of(name: str, top_level_only: bool) -> set[str]:
    """anysoftmax modules `name` imports (relative imports resolved); with `top_level_only`,
    only those run at import time (not inside functions)."""
    path = ROOT / (name.replace(".", "/") + ("/__init__.py" if (ROOT / name.replace(".", "/")).is_dir() else ".py"))
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("anysoftmax"):
                found.add(mod)
                for alias in node.names:  # `from . import ops` imports a module
                    if f"{mod}.{alias.name}" in MODULES:
                        found.add(f"{mod}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("anysoftmax")}
    return {m for m in found if m in MODULES and m != name}


@pytest.mark.parametrize("top_level_only", [True, False], ids=["import-time", "with-function-level-imports"])
def test_no_import_circle(top_level_only):
    """No circle among module imports, neither at import time nor through imports inside
    functions (a function-level import that closes a circle is a layer pointing back up,
    merely deferred)."""
    graph = {m: imports_of(m, top_level_only=top_level_only) for m in MODULES}

    def parents(m):  # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = m.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))} & set(MODULES)

    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m] - parents(m)):
            if state.get(n) == "open":
                cycle = stack[stack.index(n):] + [n]
                if not all(c == n or c in parents(n) or n in parents(c) for c in cycle):
                    pytest.fail("import circle: " + " -> ".join(cycle))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in MODULES:
        if m not in state:
            visit(m)


# (importer prefix, imported prefix) pairs that would point a layer back up.
FORBIDDEN = [
    ("anysoftmax.core", "anysoftmax.backends"), ("anysoftmax.core", "anysoftmax.dispatch"),
    ("anysoftmax.core", "anysoftmax.torchop.api"), ("anysoftmax.core", "anysoftmax.matrix"),
    ("anysoftmax.backends._triton_common", "anysoftmax.backends.triton."),
    ("anysoftmax.backends._triton_common", "anysoftmax.backends.triton_ascend"),
    ("anysoftmax.backends", "anysoftmax.dispatch"), ("anysoftmax.backends", "anysoftmax.torchop.api"),
    ("anysoftmax.backends", "anysoftmax.torchop.ops"), ("anysoftmax.backends", "anysoftmax.cli"),
    ("anysoftmax.backends", "anysoftmax.matrix"), ("anysoftmax.backends", "anysoftmax.torchop.override"),
    ("anysoftmax.dispatch", "anysoftmax.torchop.api"), ("anysoftmax.dispatch", "anysoftmax.torchop.ops"),
    ("anysoftmax.cli", "anysoftmax.backends"), ("anysoftmax.core", "anysoftmax.plugins"),
    ("anysoftmax.backends", "anysoftmax.plugins"), ("anysoftmax.plugins", "anysoftmax.dispatch"),
]


def test_layers_point_one_way():
    bad = []
    for m in MODULES:
        for n in imports_of(m, top_level_only=False):
            for importer, imported in FORBIDDEN:
                if m.startswith(importer) and (n + ".").startswith(imported.rstrip(".") + (
                        "." if imported.endswith(".") else "")) and not n.startswith(importer):
                    bad.append(f"{m} imports {n}")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(set(bad)))


def private_reads(name: str) -> list[str]:
    """`from m import _x` and `m._x` in module `name` that reach into another anysoftmax
    module's private names (`m` a module it imported), and any read of a `._data` attribute."""
    path = ROOT / (name.replace(".", "/") + ("/__init__.py" if (ROOT / name.replace(".", "/")).is_dir() else ".py"))
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if not mod.startswith("anysoftmax"):
                continue
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.lineno}: from {mod} import {alias.name}")
                modules[alias.asname or alias.name] = full if full in MODULES else mod
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("anysoftmax") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = modules.get(node.value.id) if isinstance(node.value, ast.Name) else None
            if owner in MODULES and owner != name:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
            elif node.attr == "_data" and name != "anysoftmax.core.cache":
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return [f"{name}:{where}" for where in found]


def test_no_module_reads_another_modules_private_names():
    """Every package module is reached through public names only, and reaches no other module
    through private ones: `BoundedDict.get`, not `._data`."""
    bad = [line for m in MODULES for line in private_reads(m)]
    assert not bad, "private names read across modules:\n" + "\n".join(bad)


def _fresh(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_import_anysoftmax_loads_no_backend():
    res = _fresh("import sys, anysoftmax; "
                 "print(sorted(m for m in sys.modules if m.startswith(('anysoftmax.backends', 'triton'))))")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", f"import anysoftmax pulled in: {res.stdout}"


def test_loading_the_backends_defines_no_triton_kernel():
    """The registry loads every backend to ask whether Triton must run interpreted: none of
    them may import Triton for that (it would fix the choice before it is made)."""
    res = _fresh("import sys; from anysoftmax.core import registry; from anysoftmax import dispatch; "
                 "names = sorted(registry.registered()); "
                 "print(names, sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("[]"), f"loading the backends imported Triton: {res.stdout}"
    assert "'triton_ascend'" in res.stdout and "'wave'" in res.stdout


# Imports each module in a child forked from one interpreter that has imported torch (the
# dependency every module needs) and the package itself: importing any `anysoftmax.x` runs the
# package's __init__ first, so each child starts from the state that import leaves, whichever
# module it imports next; a fresh interpreter per module would spend most of its time importing
# torch and the package again. A child reports its traceback through a pipe.
_IMPORT_EACH = r"""
import os, sys, traceback
import torch
import anysoftmax
failed = []
for name in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__(name)
            message = ""
        except BaseException:
            message = traceback.format_exc()
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if message or status:
        failed.append((name, message.strip() or f"exit status {status}"))
print(repr(failed))
"""


def test_every_module_imports_alone():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *MODULES], capture_output=True, text=True,
                         env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    # A module whose optional dependency is missing must say which extra installs it.
    failed = [f"{m}: {trace.splitlines()[-1]}" for m, trace in ast.literal_eval(res.stdout.strip().splitlines()[-1])
              if "pip install 'anysoftmax[" not in trace]
    assert not failed, "modules that fail to import alone:\n" + "\n".join(failed)


def test_hit_path_does_no_validation_selection_or_env_read(monkeypatch):
    """A repeated request is a key, a lookup and the launch: measured, not counted by hand.
    During the repeated calls every read of the environment (`os.environ[...]`, `.get`, `in`,
    `os.getenv`, iteration) is recorded at the mapping itself, and so are validations
    (`SoftmaxSpec.from_tensor` / `from_request`) and selections (`registry.select`)."""
    import torch

    from anysoftmax.core import registry
    from anysoftmax.core.spec import SoftmaxSpec

    x = torch.randn(8, 33)
    mask = torch.rand(8, 33) < 0.2
    calls = [lambda: anysoftmax.softmax(x, 1), lambda: anysoftmax.log_softmax(x, 1),
             lambda: anysoftmax.softmax_backward(y, g, 1), lambda: anysoftmax.softmax(x, 1, scale=0.5, mask=mask),
             lambda: anysoftmax.logsumexp(x, 1), lambda: anysoftmax.logsumexp(x, 1, scale=0.5, mask=mask),
             lambda: anysoftmax.merge_states([y, g], [x[:, 0], x[:, 1]])]
    y = anysoftmax.softmax(x, 1)
    g = torch.randn_like(y)
    for call in calls:
        call()  # first calls: validated, selected, memoised
    seen = {"environment": [], "validated": 0, "selected": 0}
    environ = type(os.environ)
    real_getitem, real_iter = environ.__getitem__, environ.__iter__

    def getitem(self, key):
        seen["environment"].append(key)
        return real_getitem(self, key)

    def iterate(self):
        seen["environment"].append("<every variable>")
        return real_iter(self)

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            seen[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    hits = dispatch.stats["hits"]
    monkeypatch.setattr(environ, "__getitem__", getitem)  # get, in and os.getenv go through it
    monkeypatch.setattr(environ, "__iter__", iterate)
    monkeypatch.setattr(SoftmaxSpec, "from_tensor", counted("validated", SoftmaxSpec.from_tensor))
    monkeypatch.setattr(SoftmaxSpec, "from_request", counted("validated", SoftmaxSpec.from_request))
    monkeypatch.setattr(registry, "select", counted("selected", registry.select))
    assert os.getenv("ANYSOFTMAX_BACKEND", "") is not None and seen["environment"], "the probe must see reads"
    seen["environment"].clear()
    for _ in range(50):
        for call in calls:
            call()
    monkeypatch.undo()
    assert seen["environment"] == [], f"the hit path read the environment: {sorted(set(seen['environment']))}"
    assert seen["validated"] == 0, "the hit path validated a request again"
    assert seen["selected"] == 0, "the hit path selected a backend again"
    assert dispatch.stats["hits"] - hits == 50 * len(calls)
