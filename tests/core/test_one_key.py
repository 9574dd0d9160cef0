"""One key function: every memo of the package is keyed through `core.request` (the request's
key, or a backend's `plan_key` derived from it), or is listed here with the reason it is not a
request memo. Read from the source, so a memo keyed by a hand-built tuple fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import anysoftmax

PACKAGE = Path(anysoftmax.__file__).resolve().parent
KEY_FUNCTIONS = {"request_key", "forward_key", "plan_key"}  # (`forward_key` is request_key's plain-forward form,
# tests/api/test_request_key.py checks they agree)
MEMO_TYPES = {"BoundedDict", "OnceCache", "Halvings", "WeakKeyDictionary"}

# Memos keyed through core.request: their every lookup and store must take such a key.
REQUEST_MEMOS = {
    "dispatch.py:_memo",
    "backends/triton/backend.py:_plans",
    "backends/cute/backend.py:_plans",
    "backends/wave/backend.py:_loaded",
    "distributed/calls.py:memo",
}
# Caches that are not per request, and why.
OTHER_CACHES = {
    "backends/triton/backend.py:_occupancy": "compiled kernel per specialisation (a plan's constexprs, options and "
                                             "dtypes, derived from a request's plan): many requests share one",
    "backends/cute/compiler.py:_compiled": "compiled kernel per KernelKey, the plan object `_plans` derives",
    "backends/wave/backend.py:_vmfbs": "kernel binary per wave KernelKey (the canonical spec's kernel_key)",
    "backends/wave/runtime.py:_modules": "loaded module per kernel binary and device",
    "backends/wave/runtime.py:_devices": "runtime device per GPU",
    "distributed/collective.py:_ranks": "per process group: this rank's index and the group's size, fixed for the "
                                        "group's life",
    "backends/triton_ascend/backend.py:_halvings": "learned state: the NPU compiler's accepted budget per shape "
                                                   "class, shared by every request of the class",
    "backends/triton/sharded.py:_occupancy": "compiled sharded kernel per specialisation (constexprs, warps, dtypes, "
                                             "device): many requests share one",
    "backends/_triton_common/sampling.py:_bound": "bound sampler launch per sampling request (op, rows, vocabulary, "
                                                  "dtype, row stride, device, plan, alignment): a SamplingSpec, which "
                                                  "core.request's softmax keys do not describe; never keyword values",
    "backends/_triton_common/sampling_one_read.py:_bound": "bound one-read sampler launches (the row-scale softmax "
                                                           "or logsumexp and their small kernels) per sampling "
                                                           "request (backend, op, rows, vocabulary, dtype, row "
                                                           "stride, device, which temperature form, ids, alignment): "
                                                           "a SamplingSpec; never keyword values",
    "sampling/api.py:_requests": "checked form and implementation per sampling request form (op, backend, top_n, "
                                 "the automatic choice, the registry's generation, spec.form_key: the logits' and "
                                 "keywords' dtypes, shapes and devices, which keywords are numbers): a SamplingSpec "
                                 "form, which core.request's softmax keys do not describe; never keyword values",
    "distributed/sampling.py:_kernel_runs": "per process group: the shard kernels' runner per sampling request form "
                                            "(backend, the registry's generation, spec.form_key: the logits' and "
                                            "keywords' dtypes, shapes and devices), with its SpecForm and the shard's "
                                            "ranks and sizes; never keyword values",
    "distributed/collective.py:_shard_sizes": "per process group: every rank's shard size, all-gathered once per local "
                                              "size (the sharded sampler's uneven vocabularies)",
    "distributed/mailbox.py:_boxes": "per process group and device: the symmetric-memory mailbox (its launchers are "
                                     "keyed by core.request's key, one_read.sharded_softmax)",
}


def _memos():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            target, value = None, None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Call):
                f = value.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in MEMO_TYPES:
                    found[f"{path.relative_to(PACKAGE).as_posix()}:{target.id}"] = (path, tree, target.id)
    return found


def test_every_memo_is_classified():
    found = set(_memos())
    unknown = found - REQUEST_MEMOS - set(OTHER_CACHES)
    assert not unknown, f"memos keyed by neither core.request nor a listed reason: {sorted(unknown)}"
    assert REQUEST_MEMOS <= found, f"request memos gone: {sorted(REQUEST_MEMOS - found)}"


def _called(node) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _from_key_function(arg, assigned: dict) -> bool:
    """`arg` is a call of a key function, or a name (or `name.key`) assigned from one."""
    if isinstance(arg, ast.Call):
        return _called(arg) in KEY_FUNCTIONS
    if isinstance(arg, ast.IfExp):  # `request_key(...) if eager else None`: no key, no lookup
        return all(_from_key_function(b, assigned) or (isinstance(b, ast.Constant) and b.value is None)
                   for b in (arg.body, arg.orelse))
    if isinstance(arg, ast.Attribute) and arg.attr == "key":
        arg = arg.value
    if isinstance(arg, ast.Name) and arg.id in assigned:
        return all(_from_key_function(v, {}) for v in assigned[arg.id])
    return False


def test_request_memos_take_keys_from_core_request():
    bad = []
    for where, (path, tree, name) in _memos().items():
        if where not in REQUEST_MEMOS:
            continue
        aliases = {name}
        for node in ast.walk(tree):  # `_lookup = _memo.get`
            if isinstance(node, ast.Assign) and name in ast.unparse(node.value) and isinstance(node.targets[0], ast.Name):
                aliases.add(node.targets[0].id)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            assigned: dict = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    assigned.setdefault(node.targets[0].id, []).append(node.value)
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                f = node.func
                on_memo = (isinstance(f, ast.Attribute) and f.attr in ("get", "put")
                           and isinstance(f.value, ast.Name) and f.value.id in aliases) \
                    or (isinstance(f, ast.Name) and f.id in aliases)
                if on_memo and not _from_key_function(node.args[0], assigned):
                    bad.append(f"{where}: {ast.unparse(node)}")
    assert not bad, "memo keys built by hand:\n" + "\n".join(bad)


def test_no_alignment_or_kernel_key_read_outside_core_request():
    """Only `core.request` turns addresses into key parts; only it (and the Wave kernel's
    identity, which is the canonical spec's kernel_key) reads `kernel_key()`."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if "data_ptr() &" in code and rel != "core/request.py":
                bad.append(f"{rel}:{i}: {line.strip()}")
            if ".kernel_key()" in code and rel not in ("core/request.py", "backends/wave/kernel.py") \
                    and not code.strip().startswith(('"', "`")):
                bad.append(f"{rel}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_a_miss_computes_its_key_once(monkeypatch):
    """Every op's call computes its request's key once, a miss too (validated, selected and bound
    under the key the lookup used), and the next identical call is a hit."""
    import torch

    from anysoftmax import dispatch

    x = torch.randn(3, 21)
    y, g = torch.softmax(x, -1), torch.randn(3, 21)
    mask = torch.rand(3, 21) < 0.3
    a = dispatch.FusedArgs(scale=0.5, mask=mask, softcap=4.0)
    p = torch.rand(3, 1)
    calls = {
        "forward": lambda: dispatch.forward(x, -1, None, "torch", False),
        "backward": lambda: dispatch.backward(y, g, -1, False, "torch"),
        "forward_fused": lambda: dispatch.forward_fused(x, -1, None, "torch", False, a),
        "backward_fused": lambda: dispatch.backward_fused(g, y, x, -1, False, a, None, "torch"),
        "logsumexp": lambda: dispatch.logsumexp(x, -1, "torch", scale=0.5, mask=mask),
        "merge_states": lambda: dispatch.merge_states([x, y], [x[:, 0], y[:, 0]], "torch"),
    }
    dispatch.forward(x, 0, None, None, False)  # (the backends are loaded)
    counted = [0]
    for name in ("request_key", "forward_key"):
        real = getattr(dispatch, name)

        def counting(*args, _real=real, **kwargs):
            counted[0] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(dispatch, name, counting)
    for op, call in calls.items():
        dispatch.refresh()
        counted[0] = 0
        hits = dispatch.stats["hits"]
        call()
        assert counted[0] == 1, f"{op}: a miss computed its key {counted[0]} times"
        call()
        assert counted[0] == 2 and dispatch.stats["hits"] == hits + 1, op
