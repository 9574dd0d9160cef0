"""logsumexp on the triton backend from the softmax row kernels' plans (`_triton_common/lse_rows.py`):
every row plan kind (tile, online, split; forced on small rows by lowered tuning thresholds, as
the long-row tests do) against the float64 reference, plain and fused, every dtype, special
values, strided inputs; that those plans really take the row kernels (`lse_kernel` is made to
fail); that column plans keep `lse_kernel`; and that the STATES_ONLY kernels compile for sm_90
without spills."""

from __future__ import annotations

import math

import pytest
import torch

import anysoftmax
from anysoftmax.backends.triton import heuristics
from anysoftmax.testing.compare import compare_logsumexp
from anysoftmax.core.lse_merge import logsumexp_request
from helpers import LONG_ROW_PATHS, runnable_backends

pytestmark = pytest.mark.skipif("triton" not in runnable_backends("cpu"),
                                reason="triton does not run on CPU here: TRITON_INTERPRET is not set")

PATHS = {"tile": {}, **LONG_ROW_PATHS}
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.fixture
def rows_only(monkeypatch):
    """Fails a call that falls back to `lse_kernel`; records the plan kinds the row path ran."""
    from anysoftmax.backends._triton_common import logsumexp, lse_rows

    kinds = []
    real = lse_rows.launcher

    def launcher(plan, *args):
        kinds.append(plan.kind)
        return real(plan, *args)

    def refuse(*args, **kwargs):
        raise AssertionError("logsumexp fell back to lse_kernel")

    monkeypatch.setattr(lse_rows, "launcher", launcher)
    monkeypatch.setattr(logsumexp, "launcher", refuse)
    return kinds


def _check(x, dim, **kw):
    out = anysoftmax.logsumexp(x, dim, keepdim=True, backend="triton", **kw)
    spec, _ = logsumexp_request(x, dim, **kw)
    c = compare_logsumexp(out, x, spec, kw.get("mask"), kw.get("sinks"))
    assert c.ok, c.detail
    assert out.dtype == (torch.float64 if x.dtype == torch.float64 else torch.float32)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", list(PATHS))
def test_plain_rows(path, dtype, gen, rows_only):
    with heuristics.override(**PATHS[path]):
        for shape in ((7, 37), (3, 200), (2, 3, 130), (1, 1), (5, 1)):
            _check((torch.randn(shape, generator=gen) * 4).to(dtype), -1)
    want = "tile" if path == "tile" else path
    assert want in rows_only, rows_only


@pytest.mark.parametrize("path", list(PATHS))
def test_special_values(path, gen, rows_only):
    x = torch.randn(7, 150, generator=gen)
    x[0] = -math.inf
    x[1, 3] = math.inf
    x[2, 5] = math.nan
    x[3, :140] = -math.inf
    x[4, 1] = math.inf
    x[4, 120] = math.nan
    x[5, 100] = math.inf  # +inf in a later sub-block / chunk than the row's finite values
    x[6, :] = 1e30  # large finite values: no overflow of the sum
    with heuristics.override(**PATHS[path]):
        out = _check(x, -1)
    assert torch.isneginf(out[0]).all() and torch.isposinf(out[1]).all() and torch.isnan(out[2]).all()
    assert torch.isnan(out[4]).all() and torch.isposinf(out[5]).all()
    torch.testing.assert_close(out[6, 0].double(), torch.tensor(1e30 + math.log(150), dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("path", list(PATHS))
def test_fused(path, dtype, gen, rows_only):
    x = (torch.randn(2, 3, 6, 90, generator=gen) * 3).to(dtype)
    bool_mask = torch.rand(2, 1, 6, 90, generator=gen) < 0.3
    bool_mask[0, 0, 1] = True  # a row with nothing kept
    add_mask = torch.randn(6, 90, generator=gen).to(dtype)
    add_mask[2, :7] = -math.inf
    sinks = torch.randn(3, 1, 1, generator=gen)
    with heuristics.override(**PATHS[path]):
        for kw in (dict(scale=0.3), dict(softcap=2.5, scale=1.7), dict(mask=bool_mask), dict(mask=add_mask),
                   dict(causal=True), dict(causal="bottom_right", sinks=sinks), dict(sinks=sinks, mask=bool_mask),
                   dict(scale=0.5, softcap=4.0, mask=add_mask, sinks=sinks, causal=True)):
            out = _check(x, -1, **kw)
            if kw.get("mask") is bool_mask and "sinks" not in kw:
                assert torch.isneginf(out[0, :, 1]).all()  # nothing kept, no sink: -inf
            if kw.get("mask") is bool_mask and "sinks" in kw:
                assert torch.equal(out[0, :, 1, 0], sinks.reshape(3).float())  # only the sink: lse = s
        # causal with more queries than keys (top left): leading rows keep nothing
        wide = (torch.randn(2, 80, 70, generator=gen) * 3).to(dtype)
        out = _check(wide, -1, causal="bottom_right", sinks=torch.randn(2, 1, 1, generator=gen))
        assert torch.isfinite(out).all()
        out = _check(wide, -1, causal="bottom_right")
        assert torch.isneginf(out[:, :10]).all() and torch.isfinite(out[:, 10:]).all()
    assert set(rows_only) == {"tile" if path == "tile" else path}, rows_only


@pytest.mark.parametrize("path", list(PATHS))
def test_strided_inputs(path, gen, rows_only):
    base = torch.randn(8, 150, 6, generator=gen)
    with heuristics.override(**PATHS[path]):
        _check(base[::2, :, 1], -1)  # strided rows and columns
        _check(base.transpose(1, 2)[:, ::2], -1)  # columns of stride 6
        _check(base.transpose(0, 1).expand(3, 150, 8, 6)[1:, ::3], 1)  # expanded, broadcast rows
        _check(base[:, :, :2], 1)  # dim not last, inner dim too short for the column kernels
        _check(torch.randn(4, 5, 130, generator=gen).bfloat16().permute(1, 0, 2), -1)  # rows not chaining


def test_split_combine(gen, rows_only):
    """The split plan's combine (the row's last chunk to finish, in the kernel): special values
    confined to single chunks, sinks (the only value kept, +inf, NaN), masks emptying whole
    chunks, results with dim not last and rows reordered (heads fastest); the row counters are
    left zero."""
    from anysoftmax.backends._triton_common import launcher

    inf, nan = math.inf, math.nan
    x = torch.randn(10, 150, generator=gen) * 3  # fp32 under these overrides: 5 chunks of 32, the last short
    x[0, 70] = inf  # +inf in chunk 2 only
    x[1, 140] = nan  # NaN in the short last chunk only
    x[2, :32] = -inf  # chunk 0 empty: weighs 0
    x[3, :128] = -inf  # only the last chunk holds values
    x[4] = -inf  # nothing kept
    x[5, 40], x[5, 100] = inf, nan  # NaN wins over +inf
    x[6, 33], x[6, 140] = inf, inf
    x[7, 64:96] = 80.0  # one dominant chunk
    sinks = torch.randn(10, 1, generator=gen)
    sinks[4], sinks[8], sinks[9] = 2.5, inf, nan
    mask = torch.zeros(10, 150, dtype=torch.bool)
    mask[:, 32:96] = True  # chunks 1 and 2 excluded
    with heuristics.override(**LONG_ROW_PATHS["split"]):
        out = _check(x, -1)
        assert torch.isposinf(out[[0, 6]]).all() and torch.isnan(out[[1, 5]]).all() and torch.isneginf(out[4]).all()
        out = _check(x, -1, sinks=sinks)
        assert out[4].item() == 2.5 and torch.isposinf(out[[0, 8]]).all() and torch.isnan(out[[1, 9]]).all()
        out = _check(x, -1, mask=mask, sinks=sinks)
        assert torch.isfinite(out[0]).all() and out[4].item() == 2.5  # (the +inf was masked out)
        d = x.reshape(2, 5, 150).permute(0, 2, 1)  # dim 1 of [2, 150, 5]: result [2, 1, 5]
        _check(d, 1)
        _check(d, 1, sinks=sinks.reshape(2, 1, 5))
        heads = x.reshape(2, 5, 1, 150).expand(2, 5, 3, 150)  # a head-broadcast mask: heads vary fastest
        _check(heads, -1, mask=mask.reshape(2, 5, 1, 150)[:, :1], sinks=torch.randn(5, 1, 1, generator=gen))
    assert set(rows_only) == {"split"}, rows_only
    assert all(not c.any() for c in launcher._counters.values())


def test_split_path_host_ops(gen, rows_only):
    """A split logsumexp call combines the chunks in its kernel: no torch.logsumexp, cat or
    index-put on the host (the ops the interpreter itself dispatches to run a kernel are not
    counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    x, sinks = torch.randn(3, 2, 150, generator=gen), torch.randn(2, 1, generator=gen)
    with heuristics.override(**LONG_ROW_PATHS["split"]):
        for kw in ({}, dict(sinks=sinks)):
            anysoftmax.logsumexp(x, -1, backend="triton", **kw)  # (plans and binds)
            with Ops() as ops:
                anysoftmax.logsumexp(x, -1, backend="triton", **kw)
            host = [n for n in ops.names if any(w in n for w in ("logsumexp", "cat", "index", "arange", "_to_copy"))]
            assert not host, ops.names
    assert set(rows_only) == {"split"}, rows_only


def test_zero_dim_empty_one_element(gen):
    s = torch.tensor(-1.5)
    assert anysoftmax.logsumexp(s, 0, backend="triton").item() == -1.5
    for shape, dim in (((0, 5), 1), ((4, 0), 1), ((3, 0, 2), 1)):
        x = torch.randn(shape, generator=gen)
        torch.testing.assert_close(anysoftmax.logsumexp(x, dim, backend="triton"), torch.logsumexp(x, dim))
    one = torch.tensor([[0.25]], dtype=torch.bfloat16)
    assert anysoftmax.logsumexp(one, 1, backend="triton").item() == 0.25


def test_column_plans_keep_lse_kernel(gen, monkeypatch):
    """A reduction over a non-innermost dim with a long contiguous inner dim is planned as
    column tiles; those have no STATES_ONLY form, and the lse_kernel serves them."""
    from anysoftmax.backends._triton_common import lse_rows

    def refuse(*args, **kwargs):
        raise AssertionError("a column plan reached the row kernels")

    monkeypatch.setattr(lse_rows, "launcher", refuse)
    _check(torch.randn(40, 64, generator=gen), 0)


def test_the_check_can_fail(gen, monkeypatch):
    """A wrong lse is caught: the split path's combine given sinks off by 5."""
    from anysoftmax.backends._triton_common import lse_rows

    x = torch.randn(2, 3, 5, 200, generator=gen) * 3
    sinks = torch.full((3, 1, 1), 12.0)  # dominant: the lse without it is ~10
    real = lse_rows.sinks_operand
    monkeypatch.setattr(lse_rows, "sinks_operand", lambda s, spec: real(s, spec) - 5)
    with heuristics.override(**LONG_ROW_PATHS["split"]), pytest.raises(AssertionError):
        _check(x, -1, sinks=sinks)


COMPILE_SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from compile_targets import compile_launch
from anysoftmax.backends._triton_common.plan import Fusion, make_plan
from anysoftmax.core.layout import RowLayout

kind, dtype, n, warps, fused = sys.argv[2], getattr(torch, sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
rows = 64
ops = ((n, 1),) if fused.get("mask") else ()
ops += ((1, 0), (1, 0)) if fused.get("sinks") else ()  # sinks and their (unused) shares, one per row
layout = RowLayout.from_strides((rows, n), (n, 1), (1, 0), 1, ops)
f = Fusion(has_cap=bool(fused.get("softcap")), mask={"bool": 1, "additive": 2}.get(fused.get("mask"), 0),
           causal=bool(fused.get("causal")), has_sink=bool(fused.get("sinks")), sq=rows)
bn = {"tile": n, "split": 16384 // dtype.itemsize, "online": 4096}[kind]
bm = max(1, 2048 // n) if kind == "tile" else 1
plan = make_plan(kind, bm, bn, 1, chunks=-(-n // bn) if kind == "split" else 1, fusion=f,
                 options=dict(num_warps=warps), states_only=True)
x = torch.empty(16, dtype=dtype)
out = torch.empty(16, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
mask = torch.empty(16, dtype=torch.uint8 if f.mask == 1 else dtype) if f.mask else None
sinks = torch.empty(16) if f.has_sink else None
stats, counts = torch.empty(16), torch.empty(16, dtype=torch.int32)
calls = plan.calls(plan.tensors((x, out, mask, sinks, None, None)), layout, False, dtype, stats, counts)
assert len(calls) == 1
kernel, args, meta = calls[0]
assert meta["STATES_ONLY"] and meta.get("PHASE", 1) == 1
compiled, how = compile_launch(kernel, args, meta, "sm_90", dict(num_warps=warps))
result = dict(spills="st.local" in compiled.asm["ptx"])
try:  # registers and stack from the cubin, where this machine has cuobjdump
    from compile_targets import cuda_resources
    res = cuda_resources(compiled)
    result.update(n_regs=res["n_regs"], spills=result["spills"] or bool(res["stack"]) or bool(res["local"]))
except (OSError, RuntimeError):
    pass
print(json.dumps(result))
"""


# (plan kind, dtype, row length, warps the planner gives the softmax of those rows, fused steps)
COMPILED = [
    ("tile", "bfloat16", 1024, 4, {}), ("tile", "float32", 16384, 8, {}), ("tile", "bfloat16", 32768, 16, {}),
    ("tile", "float64", 4096, 4, {}),
    ("tile", "bfloat16", 4096, 8, dict(mask="bool", softcap=True, sinks=True, causal=True)),
    ("split", "bfloat16", 65536, 4, {}), ("split", "float32", 65536, 4, dict(mask="additive", sinks=True)),
    ("online", "float32", 65536, 8, {}),
]


@pytest.mark.parametrize("kind,dtype,n,warps,fused", COMPILED, ids=[f"{c[0]}-{c[1]}-{c[2]}-{len(c[4])}" for c in COMPILED])
def test_states_only_compiles_for_sm90_without_spills(kind, dtype, n, warps, fused):
    """The STATES_ONLY forms compile for the GPU target (sm_90, from this CPU machine) without
    spilling to local memory. Compiled in a subprocess: this suite sets TRITON_INTERPRET=1."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip(f"Triton {triton.__version__} has no nvidia backend: cannot compile for sm_90")
    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, str(Path(__file__).parent), kind, dtype, str(n),
                           str(warps), json.dumps(fused)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["spills"], result


def test_kit_logsumexp_cases():
    """The conformance kit's logsumexp cases (`anysoftmax.testing.kit`) on the triton backend."""
    from anysoftmax.testing.kit import conformance_checks, run_checks

    checks = [c for c in conformance_checks("triton", device="cpu") if c.kind == "logsumexp"]
    assert checks
    report = run_checks(checks, "triton", "cpu", 1234)
    assert report.ok, report.text()
