"""The `wave` backend on a CPU machine: planning, the fused family's index arithmetic, the CUDA
rewrite, the disk cache and AOT keys, availability messages, real compilation of every variant
(MLIR structure, gfx942 and sm_80 .vmfb files) and the runtime's asynchronous calls on a CPU
stand-in module. Execution of the real kernels: tests/backends/wave/test_wave_gpu.py.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys

import pytest
import torch

from helpers.wave import BY_NAME, CASES, spec_of

from anysoftmax.backends.wave import WaveBackend, diskcache, env, fusion, runtime
from anysoftmax.backends.wave.backend import f32_bits, flat, kernel_key
from anysoftmax.backends.wave.cuda_mlir import CudaRewriteError, to_cuda
from anysoftmax.backends.wave.kernel import max_row_length, max_waves, offset_expr, plan_row
from anysoftmax.backends.wave.target import ENV_ON_CUDA, parse_target
from anysoftmax.core import SoftmaxSpec
from anysoftmax.testing.compare import compare


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


needs_wave = pytest.mark.skipif(not _has("wave_lang"), reason="wave-lang not installed")
needs_iree = pytest.mark.skipif(not (_has("iree.compiler") and _has("iree.runtime")),
                                reason="iree-base-compiler / iree-base-runtime not installed")

GFX942, SM80 = parse_target("gfx942"), parse_target("sm_80")


def plain_key(n, din, dout, log, target, rows=2):
    """The kernel of a plain (rows, n) request."""
    x = torch.empty(rows, n, dtype=getattr(torch, din), device="meta")
    return kernel_key(SoftmaxSpec.from_tensor(x, -1, getattr(torch, dout), log=log), target)


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYSOFTMAX_CACHE_DIR", str(tmp_path))
    return tmp_path / "wave"


# --- planning and targets (pure) ---------------------------------------------------------


@pytest.mark.parametrize("tpw", [32, 64])
@pytest.mark.parametrize("n", [1, 2, 31, 33, 64, 128, 781, 1024, 4096, 65536, 100000, max_row_length(32)])
def test_plan_covers_the_row(n, tpw):
    plan = plan_row(n, tpw)
    assert plan.per_wave % tpw == 0  # Wave's cross-lane reduction needs whole waves
    assert plan.block_n >= n > plan.block_n - plan.waves * tpw  # covers the row, less than one column-step of padding
    assert 1 <= plan.waves <= max_waves(tpw) and plan.waves * tpw <= 1024


def test_plan_refuses_rows_longer_than_a_workgroup():
    with pytest.raises(ValueError, match="looped kernel"):
        plan_row(max_row_length(32) + 1, 32)


def test_targets():
    assert (GFX942.device, GFX942.threads_per_wave, GFX942.name) == ("hip", 64, "hip-gfx942")
    assert parse_target("gfx1100").threads_per_wave == 32
    assert parse_target("gfx90a:sramecc+:xnack-").chip == "gfx90a"
    assert (SM80.device, SM80.threads_per_wave) == ("cuda", 32)
    assert "--iree-cuda-target=sm_80" in SM80.compile_flags()
    assert "--iree-hip-target=gfx942" in GFX942.compile_flags()
    with pytest.raises(ValueError, match="sm_80"):
        parse_target("sm_90")
    with pytest.raises(ValueError, match="unknown"):
        parse_target("tpu")


# --- CUDA rewrite (pure) -------------------------------------------------------------------

_AMD_SNIPPET = """\
        %shuffleResult_4, %valid_5 = gpu.shuffle  xor %22, %c2_i32, %c32_i32 : vector<1xf32>
        %23 = arith.maximumf %22, %shuffleResult_4 : vector<1xf32>
        amdgpu.lds_barrier
"""


def test_cuda_rewrite_scalarises_shuffles_and_barriers():
    out = to_cuda(_AMD_SNIPPET)
    assert all(line.endswith(": f32") for line in out.splitlines() if "gpu.shuffle" in line)
    assert "%cuda_shuffle1_in = vector.extract %22[0] : f32 from vector<1xf32>" in out
    assert "%cuda_shuffle1_out, %valid_5 = gpu.shuffle xor %cuda_shuffle1_in, %c2_i32, %c32_i32 : f32" in out
    assert "%shuffleResult_4 = vector.broadcast %cuda_shuffle1_out : f32 to vector<1xf32>" in out
    assert "gpu.barrier" in out and "amdgpu" not in out


@pytest.mark.parametrize("line", [
    "%a, %b = gpu.shuffle xor %v, %c1, %c32 : vector<2xf32>",
    "amdgpu.sched_barrier allow = <none>",
    "%r = rocdl.readfirstlane %v : f32",
])
def test_cuda_rewrite_refuses_what_it_cannot_translate(line):
    with pytest.raises(CudaRewriteError):
        to_cuda(line)


# --- the fused family's index arithmetic (pure) ----------------------------------------------


def test_canonical_form_is_the_kernel_identity():
    x = torch.empty(2, 8, 256, 256, device="meta")
    mask = torch.empty(2, 1, 256, 256, dtype=torch.bool, device="meta")
    one, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=0.125, mask=mask, causal=True))
    two, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=-3.0, mask=mask, causal=True))
    c = fusion.canonical(one)
    assert c.shape == (fusion.DYNAMIC, 8, 256, 256) and c.device == fusion.META  # batch size is dynamic
    assert kernel_key(one, SM80) == kernel_key(two, SM80)  # a new temperature never recompiles
    assert kernel_key(one, SM80) != kernel_key(one, GFX942)
    other_layout, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=0.1, mask=mask.transpose(-1, -2),
                                                                 causal=True))
    assert kernel_key(other_layout, SM80) != kernel_key(one, SM80)
    # The plain softmax folds every row dim into the dynamic M; dim not last is moved last.
    plain = fusion.canonical(SoftmaxSpec.from_tensor(torch.empty(3, 781, 5, device="meta"), 1))
    assert (plain.shape, plain.dim) == ((fusion.DYNAMIC, 781), 1)
    # Causal rows of a 2-D input: the query count is the row count, compiled in.
    causal2d, _ = SoftmaxSpec.from_request(torch.empty(300, 781, device="meta"), -1, fused=dict(causal=True))
    assert fusion.canonical(causal2d).shape == (300, 781)


@pytest.mark.parametrize("trial", range(12))
def test_operand_offsets_match_torch_broadcasting(trial, gen):
    # Every element an operand contributes to row r, column j is at offset_expr(terms, r) +
    # j * col from its first element: checked against torch's own broadcast views of random
    # shapes, broadcast patterns and storage orders (the storage holds each element's offset).
    ndim = 2 + trial % 3
    shape = tuple(int(torch.randint(1, 5, (1,), generator=gen)) for _ in range(ndim))
    dim = int(torch.randint(0, ndim, (1,), generator=gen))
    keep = torch.rand(ndim, generator=gen) < 0.6
    op_shape = tuple(n if k else 1 for n, k in zip(shape, keep))[int(torch.randint(0, 2, (1,), generator=gen)):]
    order = torch.randperm(len(op_shape), generator=gen).tolist()
    storage = torch.arange(math.prod(op_shape), dtype=torch.float32)
    op = storage.view([op_shape[i] for i in order]).permute(*[order.index(i) for i in range(len(order))])
    x = torch.empty(shape)
    spec, _ = SoftmaxSpec.from_request(x, dim, fused=dict(mask=op))
    f = fusion.fusion_of(fusion.canonical(spec))
    expected = op.expand(shape).movedim(dim, -1).reshape(-1, shape[dim])  # offsets, row by row
    rows, n = expected.shape
    r = torch.arange(rows).unsqueeze(1)
    j = torch.arange(n).unsqueeze(0)
    if f.mask_col == 1 and not f.mask_terms:  # read as an [N] Memory
        got = j.expand(rows, n)
    else:
        got = torch.tensor([offset_expr(f.mask_terms, int(i)) for i in range(rows)]).unsqueeze(1) + j * f.mask_col
    assert torch.equal(got.float(), expected), (shape, dim, op_shape, op.stride(), f)
    assert flat(op).numel() > int(expected.max())  # the flat view reaches every element


def test_row_terms_merge_and_drop():
    # [B, H, Sq] rows of a mask [B, 1, Sq, Sk]: the head dim (stride 0) drops out, the batch
    # dim needs no modulo (outermost), the query dim is (r % Sq) * Sk.
    terms = fusion.row_terms((fusion.DYNAMIC, 8, 256), (65536, 0, 256))
    assert terms == (fusion.Term(2048, None, 65536), fusion.Term(1, 256, 256))
    assert fusion.row_terms((fusion.DYNAMIC, 8, 256), (2048, 256, 1)) == (fusion.Term(1, None, 1),)  # contiguous: one term
    assert fusion.row_terms((fusion.DYNAMIC, 1, 4), (4, 99, 1)) == (fusion.Term(1, None, 1),)  # size-1 dims ignored


def test_f32_bits_round_trip():
    import struct

    for v in (0.125, -3.7, 1e-30, 3.0e38):
        assert struct.unpack("<f", struct.pack("<i", f32_bits(v)))[0] == struct.unpack("<f", struct.pack("<f", v))[0]
    assert struct.unpack("<f", struct.pack("<i", f32_bits(1e39)))[0] == math.inf


# --- disk cache and versions (pure) ---------------------------------------------------------


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("ANYSOFTMAX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_dir() == tmp_path / "xdg" / "anysoftmax" / "wave"
    monkeypatch.setenv("ANYSOFTMAX_CACHE_DIR", str(tmp_path / "mine"))
    assert env.cache_dir() == tmp_path / "mine" / "wave"


def test_cache_roundtrip_and_key(cache_root):
    key = plain_key(781, "float16", "float32", True, SM80)
    path = diskcache.vmfb_path(key)
    assert path.name == "log_softmax_n781_float16-float32.vmfb" and path.parent.name == "cuda-sm_80"
    assert path.parent.parent.name == f"{env.toolchain_tag()}-k{diskcache.kernel_digest()}"
    assert diskcache.load(key) is None and not diskcache.has_kernels("cuda-sm_80")
    diskcache.store(key, b"vmfb-bytes")
    assert diskcache.load(key) == b"vmfb-bytes" and diskcache.has_kernels("cuda-sm_80")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    assert diskcache.load(plain_key(781, "float16", "float16", True, SM80)) is None
    assert diskcache.vmfb_path(plain_key(781, "float16", "float32", True, SM80, rows=77)) == path  # M is dynamic


def test_cache_names_carry_the_variant(cache_root):
    x = torch.empty(4, 64, 32, device="meta")
    mask = torch.empty(64, 32, dtype=torch.bool, device="meta")
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=2.0, mask=mask, causal="bottom_right"))
    name = diskcache.vmfb_path(kernel_key(spec, SM80)).name
    assert name.startswith("softmax_n32_float32-float32_scale-maskbool-causal-emptyzero-r") and name.endswith(".vmfb")
    again, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=0.5, mask=mask, causal="bottom_right"))
    assert diskcache.vmfb_path(kernel_key(again, SM80)).name == name  # scale is a runtime value
    moved, _ = SoftmaxSpec.from_request(x, -1, fused=dict(scale=2.0, mask=mask.t().contiguous().t(),
                                                          causal="bottom_right"))
    assert diskcache.vmfb_path(kernel_key(moved, SM80)).name != name  # another mask layout


def test_toolchain_tag_without_wave(monkeypatch, request):
    monkeypatch.setattr(env, "installed_version", lambda dist: "3.9.0" if dist == "iree-base-runtime" else None)
    env.toolchain_tag.cache_clear()  # read once per process; this test changes what it reads
    request.addfinalizer(env.toolchain_tag.cache_clear)
    assert env.toolchain_tag() == "wave3.9.1-iree3.9.0"  # runtime-only: the pinned Wave version


# --- availability and errors (pure) --------------------------------------------------------


def test_import_is_lazy():
    code = ("import sys, anysoftmax.backends.wave as w; w.WaveBackend(); "
            "bad = [m for m in sys.modules if m.startswith(('wave_lang', 'iree'))]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_packages_are_named_with_the_install_command(monkeypatch):
    monkeypatch.setattr(env, "_importable", lambda module: False)
    assert env.runtime_missing() == ("iree-base-runtime is not installed (needed to run Wave kernels): "
                                     "pip install 'anysoftmax[wave]'")
    assert env.compiler_missing().startswith("wave-lang is not installed")
    assert WaveBackend().is_available() == env.runtime_missing()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given without a GPU")
def test_unavailable_without_gpu_and_refuses_cpu_float64(monkeypatch):
    monkeypatch.setattr(env, "_importable", lambda module: True)
    monkeypatch.delenv(ENV_ON_CUDA, raising=False)
    assert "no AMD GPU" in WaveBackend().is_available()
    x = torch.randn(4, 8, dtype=torch.float64)
    assert "device type 'cpu'" in WaveBackend().supports(SoftmaxSpec.from_tensor(x, -1))


def test_float64_and_overlong_rows_are_refused(monkeypatch):
    import anysoftmax.backends.wave.backend as b

    monkeypatch.setattr(b, "detect_target", lambda index=None: SM80)
    cuda = torch.device("cuda", 0)
    spec = SoftmaxSpec((4, 8), (8, 1), torch.float64, 1, torch.float64, False, cuda)
    assert "float64 is not supported" in WaveBackend().supports(spec)
    n = max_row_length(32) + 1
    spec = SoftmaxSpec((2, n), (n, 1), torch.float32, 1, torch.float32, False, cuda)
    assert "longest row" in WaveBackend().supports(spec)


def test_fused_requests_reach_the_backend_and_float64_operands_are_refused(monkeypatch):
    import anysoftmax.backends.wave.backend as b
    from anysoftmax.core.registry import refusal

    monkeypatch.setattr(b, "detect_target", lambda index=None: SM80)
    monkeypatch.setattr(b, "compiler_missing", lambda: None)
    cuda = torch.device("cuda", 0)
    backend = WaveBackend()
    for case in CASES:
        spec = spec_of(case, (2, 8, 256, 256)).with_variant(spec_of(case, (2, 8, 256, 256)).variant)
        spec = SoftmaxSpec(spec.shape, spec.strides, spec.in_dtype, spec.dim, spec.out_dtype, spec.log, cuda,
                           spec.variant)
        assert refusal(backend, spec) is None, case.name  # every variant is compiled, none refused
    x = torch.empty(4, 8, device="meta")
    spec, _ = SoftmaxSpec.from_request(x, -1, fused=dict(sinks=torch.empty(4, 1, dtype=torch.float64, device="meta")))
    spec = SoftmaxSpec(spec.shape, spec.strides, spec.in_dtype, spec.dim, spec.out_dtype, spec.log, cuda, spec.variant)
    assert "sinks of dtype float64" in backend.supports(spec)


def test_nvidia_needs_the_opt_in(monkeypatch):
    from types import SimpleNamespace

    import anysoftmax.backends.wave.target as t

    props = SimpleNamespace(name="NVIDIA H100", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv(ENV_ON_CUDA, raising=False)
    assert "ANYSOFTMAX_WAVE_ON_CUDA is not set" in t.detect_target()
    monkeypatch.setenv(ENV_ON_CUDA, "1")
    assert t.detect_target() == SM80


def test_compare_can_fail():
    # The conformance check used by the GPU tests rejects an output 0.1% off.
    x = torch.randn(8, 781)
    spec = SoftmaxSpec.from_tensor(x, -1)
    good = torch.softmax(x, -1)
    assert compare(good, x, spec).ok
    assert not compare(good * (1 + 1e-3), x, spec).ok


# --- real compilation (wave-lang) -----------------------------------------------------------

_MLIR_CASES = [(128, "float32", "float32", False), (781, "float16", "float16", False),
               (1024, "bfloat16", "bfloat16", True), (65536, "float32", "float32", True),
               (33, "float16", "float32", False)]


@needs_wave
@pytest.mark.parametrize("n, din, dout, log", _MLIR_CASES)
def test_mlir_structure(n, din, dout, log):
    from anysoftmax.backends.wave.compiler import kernel_mlir, target_mlir

    mlir = kernel_mlir(plain_key(n, din, dout, log, GFX942))
    plan = plan_row(n, 64)
    masked = plan.block_n != n
    assert ("vector.maskedload" if masked else "vector.load") in mlir  # reads
    assert ("vector.maskedstore" if masked else "vector.store") in mlir  # writes
    assert mlir.count("gpu.shuffle  xor") == 2 * 6  # max and sum: log2(64) butterfly steps each
    assert "arith.maximumf" in mlir and "arith.addf" in mlir and "math.exp" in mlir
    assert ("math.log" in mlir) == log and ("arith.divf" in mlir) == (not log)
    assert ("arith.extf" in mlir) == (din != "float32") and ("arith.truncf" in mlir) == (dout != "float32")
    assert "0xFF800000" in mlir  # padded lanes are -inf before the max
    assert f"tensor<?x{n}x" in mlir  # M is dynamic
    assert "@isolated_benchmark$async" in mlir and "!hal.fence" in mlir  # the asynchronous entry point
    if plan.waves > 1:
        assert "memref.alloc()" in mlir and "amdgpu.lds_barrier" in mlir  # the exchange between waves
    cuda = target_mlir(plain_key(n, din, dout, log, SM80))
    shuffles = [line for line in cuda.splitlines() if "gpu.shuffle" in line]
    assert len(shuffles) == 2 * 5 and all(line.endswith(": f32") for line in shuffles)  # log2(32) steps
    assert "amdgpu" not in cuda and "subgroup_size = 32" in cuda


def _kernel_body(mlir: str) -> str:
    """The device function's text (the executable), without the host entry point."""
    return mlir[mlir.index("func.func @softmax"):mlir.index("func.func @isolated_benchmark")]


def _global_reads(body: str) -> list[str]:
    """Loads from global memory (not the workgroup exchange of the block reductions)."""
    return [line for line in body.splitlines()
            if re.search(r"(vector\.(masked)?load|memref\.load) %reinterpret_cast", line) and "workgroup" not in line]


def _wave_mlir(case_name: str, target, shape=(2, 8, 256, 256), dtype=torch.float32, log=False):
    from anysoftmax.backends.wave.compiler import target_mlir

    return target_mlir(kernel_key(spec_of(BY_NAME[case_name], shape, dtype, log), target))


def _has_constant(body: str, value: float) -> bool:
    """Whether the MLIR holds a float constant equal to `value` in float32."""
    found = re.findall(r"(?:dense<|arith\.constant )(-?\d[\d.]*(?:e[-+]\d+)?)[>\s]", body)
    return any(math.isclose(float(v), value, rel_tol=1e-6) for v in found)


# One compile test per step of the fused family and target (CI runs them with the `wave`
# extra): the MLIR must show the step, and IREE must build the module for the target.
_TARGETS = pytest.mark.parametrize("target", [GFX942, SM80], ids=["gfx942", "sm_80"])


def _builds(case_name, target, shape=(2, 8, 256, 256), dtype=torch.float32, log=False):
    from anysoftmax.backends.wave.compiler import compile_vmfb

    data = compile_vmfb(kernel_key(spec_of(BY_NAME[case_name], shape, dtype, log), target))
    assert b"isolated_benchmark$async" in data and (b"cuda" if target is SM80 else b"rocm") in data.lower()


@needs_wave
@_TARGETS
def test_compile_scale(target):
    body = _kernel_body(_wave_mlir("scale", target))
    # The scale is an i32 argument (a float32's bits) bitcast and multiplied before the max.
    assert re.search(r"func\.func @softmax\(.*: i32", body)
    assert "vector.bitcast" in body and "to vector<" in body and "arith.mulf" in body
    assert body.index("arith.mulf") < body.index("arith.maximumf")
    _builds("scale", target)


@needs_wave
@_TARGETS
def test_compile_softcap(target):
    body = _kernel_body(_wave_mlir("scale_softcap", target, dtype=torch.bfloat16))
    assert body.count("vector.bitcast") == 2  # scale and softcap: two runtime values
    assert "math.tanh" in body and "arith.divf" in body  # cap * tanh(z / cap)
    assert body.index("math.tanh") < body.index("arith.maximumf")  # elementwise, before the reduction
    _builds("scale_softcap", target, dtype=torch.bfloat16)


@needs_wave
@_TARGETS
@pytest.mark.parametrize("case", ["mask_bool", "mask_bool_broadcast", "mask_bool_transposed"])
def test_compile_mask_bool(case, target):
    body = _kernel_body(_wave_mlir(case, target))
    reads = _global_reads(body)
    assert any("xf32" in r for r in reads) and any("xi8" in r for r in reads)  # x, and the mask: a second read
    assert "arith.trunci" in body and "0xFF800000" in body and "arith.select" in body  # True: excluded (-inf)
    if case == "mask_bool_transposed":  # a column stride of 256: one element per read
        assert sum(("memref.load" in r or "vector<1xi8>" in r) and "xi8" in r for r in reads) > 1
    _builds(case, target)


@needs_wave
@_TARGETS
@pytest.mark.parametrize("case, dtype", [("mask_additive_float16", "f16"), ("mask_additive_bfloat16_broadcast", "bf16"),
                                         ("mask_additive_float32_rows", "f32")])
def test_compile_mask_additive(case, dtype, target):
    body = _kernel_body(_wave_mlir(case, target))
    reads = _global_reads(body)
    assert len(reads) >= 2 and any(f"x{dtype}" in r for r in reads if "?x256xf32" not in r)
    assert body.index("arith.addf") < body.index("arith.maximumf")  # added before the max
    if case.endswith("rows"):  # one value per row: a scalar read, broadcast along the row
        assert any("memref.load" in r or "vector<1xf32>" in r for r in reads if "?x256" not in r)
    _builds(case, target)


@needs_wave
@_TARGETS
@pytest.mark.parametrize("case, shape", [("causal_top_left", (2, 8, 256, 256)),
                                         ("causal_bottom_right_empty_uniform", (2, 4, 96, 64)),
                                         ("causal_bottom_right", (1823, 781))])
def test_compile_causal(case, shape, target):
    body = _kernel_body(_wave_mlir(case, target, shape))
    # Query index from the row (workgroup id + first row) modulo Sq, compared with the column.
    assert "arith.remsi" in body and "arith.cmpi sle" in body and "arith.andi" in body
    assert len(_global_reads(body)) == 1  # no mask tensor: causal comes from indices
    if "empty" in case:  # rows with q < Sq - Sk are empty: filled with 1/Sk
        assert "arith.cmpi slt" in body and _has_constant(body, 1 / shape[-1])
    # Wave marks index arithmetic overflow<nsw, nuw>: a negative index constant (bottom_right's
    # offset Sk - Sq < 0) made every row's mask poison on the H100; none may appear.
    assert not re.search(r"(arith\.constant |dense<)-\d+>? : (vector<\d+x)?index", body)
    _builds(case, target, shape)


@needs_wave
@_TARGETS
@pytest.mark.parametrize("case", ["sink_rows", "sink_one"])
def test_compile_sink(case, target):
    body = _kernel_body(_wave_mlir(case, target, dtype=torch.float16))
    reads = _global_reads(body)
    sink_reads = [r for r in reads if "?x256" not in r]
    assert len(sink_reads) == 1 and ("vector<1xf32>" in sink_reads[0] or "memref.load" in sink_reads[0])
    assert body.count("math.exp") >= 2  # exp(z - m) and the sink's exp(s - m)
    stores = [line for line in body.splitlines() if "store" in line and "workgroup" not in line]
    assert any("memref<?xf32" in line for line in stores)  # the sink shares: a second output
    _builds(case, target, dtype=torch.float16)


@needs_wave
@_TARGETS
@pytest.mark.parametrize("case, log", [("mask_bool_empty_nan", False), ("mask_bool_empty_uniform_sink", True)])
def test_compile_mask_empty_rows(case, log, target):
    body = _kernel_body(_wave_mlir(case, target, log=log))
    tpw = target.threads_per_wave
    shuffles = sum("gpu.shuffle" in line for line in body.splitlines())
    assert shuffles == 3 * int(math.log2(tpw))  # max, sum, and the count of kept columns
    # the policy's value for empty rows: NaN, or (log form) -log N
    assert "0x7FC00000" in body if case.endswith("nan") else _has_constant(body, -math.log(256))
    _builds(case, target, log=log)


@needs_wave
@_TARGETS
def test_compile_all_steps_with_sink(target):
    body = _kernel_body(_wave_mlir("all_scale_softcap_mask_causal_sink", target, dtype=torch.bfloat16, log=True))
    for op in ("vector.bitcast", "math.tanh", "arith.trunci", "arith.remsi", "math.log2", "arith.maximumf"):
        assert op in body, op
    assert len(_global_reads(body)) >= 3  # x, mask, sinks
    # The entry point takes what the runtime pushes, in its order (kernel.argument_names):
    # five buffers, three i32 values (scale bits, softcap bits, first row), two fences; it
    # gives back the two outputs, tied to the y and p_sink buffers passed in.
    from anysoftmax.backends.wave.kernel import argument_names

    key = kernel_key(spec_of(BY_NAME["all_scale_softcap_mask_causal_sink"], (2, 8, 256, 256)), target)
    assert argument_names(key.fusion) == ("x", "mask", "sinks", "y", "p_sink", "scale", "softcap", "row0")
    mlir = _wave_mlir("all_scale_softcap_mask_causal_sink", target, dtype=torch.bfloat16, log=True)
    entry = next(line for line in mlir.splitlines() if "func.func @isolated_benchmark$async" in line)
    params = re.findall(r"%arg\d+: ([^,)]+)", entry)
    assert params == ["!hal.buffer_view"] * 5 + ["i32"] * 3 + ["!hal.fence"] * 2, entry
    assert entry.endswith("-> (!hal.buffer_view, !hal.buffer_view) {")
    dispatch = next(line for line in mlir.splitlines() if "flow.dispatch" in line)
    assert re.search(r"-> \(%\w+\{%\w+\}, %\w+\{%\w+\}\)$", dispatch)  # results tied to y and p_sink
    _builds("all_scale_softcap_mask_causal_sink", target, dtype=torch.bfloat16, log=True)


@needs_wave
@pytest.mark.parametrize("target", [GFX942, SM80], ids=["gfx942", "sm_80"])
def test_vmfb_builds(target):
    from anysoftmax.backends.wave.compiler import compile_vmfb

    data = compile_vmfb(plain_key(781, "float16", "float16", False, target))
    assert len(data) > 1000 and b"isolated_benchmark$async" in data
    assert (b"cuda" if target is SM80 else b"rocm") in data.lower()


# --- ahead of time (aot.py) -------------------------------------------------------------------


@needs_wave
def test_aot_fills_the_cache_for_runtime_only_use(cache_root, capsys):
    from anysoftmax.backends.wave import aot

    assert aot.main(["--shapes", "2x128,3x128", "--dtypes", "fp32", "--ops", "softmax", "--target", "sm_80"]) == 0
    assert diskcache.load(plain_key(128, "float32", "float32", False, SM80)) is not None
    assert diskcache.has_kernels("cuda-sm_80")
    assert capsys.readouterr().out.count("compiled") == 1  # M is dynamic: one kernel for both shapes
    aot.main(["--shapes", "128", "--dtypes", "fp32", "--ops", "softmax", "--target", "sm_80"])
    assert "cached" in capsys.readouterr().out


def test_aot_variants_name_the_kernels_the_backend_looks_for():
    # The command the backend prints when a kernel is missing compiles exactly that kernel.
    from anysoftmax.backends.wave import aot

    for case in CASES:
        spec = spec_of(case, (2, 8, 256, 256), torch.float16, log=True)
        command = aot.command_for(spec, SM80).split()
        args = dict(zip(command[3::2], command[4::2]))
        ops = {"softmax": [False], "log_softmax": [True]}[args["--ops"]]
        keys = aot.keys_for(aot._shapes(args["--shapes"]), [args["--dtypes"]], [args["--out-dtypes"]], ops,
                            aot._variants(args["--variants"]), parse_target(args["--target"]), int(args["--dim"]))
        assert keys == [kernel_key(spec, SM80)], (case.name, args["--variants"])


def test_aot_rejects_float64_and_unknown_steps():
    from anysoftmax.backends.wave import aot

    with pytest.raises(SystemExit):
        aot.main(["--shapes", "128", "--dtypes", "float64", "--target", "sm_80"])
    with pytest.raises(SystemExit):
        aot.main(["--shapes", "4x128", "--variants", "temperature", "--target", "sm_80"])


def test_aot_help_states_the_variant_grammar(capsys):
    # `--variants` says "see above": --help must print the grammar it refers to.
    from anysoftmax.backends.wave import aot

    with pytest.raises(SystemExit):
        aot.main(["--help"])
    out = capsys.readouterr().out
    assert "mask=bool|float16|bfloat16|float32[:SHAPE[/STRIDES]]" in out and "iree-base-runtime" in out


# --- runtime: the asynchronous entry point on a CPU stand-in module (iree) ----------------------

# The ABI of a fused Wave kernel with a scale: (x, y, scale as i32 bits, first row, wait fence,
# signal fence) -> y; this one computes y = x * scale + row, compiled for the CPU: checks the
# fences, the float bits, the row chunking, the dtype mapping and the copies, not the softmax.
_STANDIN = """
func.func @isolated_benchmark$async(%x: !hal.buffer_view, %y: !hal.buffer_view, %s: i32, %r: i32,
                                    %w: !hal.fence, %sig: !hal.fence) -> !hal.buffer_view {
  %d = hal.buffer_view.dim<%x : !hal.buffer_view>[0] : index
  %xt = hal.tensor.import wait(%w) => %x : !hal.buffer_view -> tensor<?x8xf32>{%d}
  %sf = arith.bitcast %s : i32 to f32
  %rf = arith.sitofp %r : i32 to f32
  %e = tensor.empty(%d) : tensor<?x8xf32>
  %o = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]} ins(%xt : tensor<?x8xf32>) outs(%e : tensor<?x8xf32>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %sf : f32
    %n = arith.addf %m, %rf : f32
    linalg.yield %n : f32
  } -> tensor<?x8xf32>
  %b = hal.tensor.barrier join(%o : tensor<?x8xf32>) => %sig : !hal.fence
  %v = hal.tensor.export %b : tensor<?x8xf32>{%d} -> !hal.buffer_view
  return %v : !hal.buffer_view
}"""


@needs_iree
@pytest.mark.parametrize("transfer", runtime.TRANSFERS)
def test_runtime_async_calls(transfer, monkeypatch):
    from iree.compiler import compile_str

    vmfb = compile_str(_STANDIN, extra_args=[
        "--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=generic"])
    kernel = runtime.load("standin", vmfb, "local-sync", torch.device("cpu"))
    monkeypatch.setattr(runtime, "MAX_ROWS_PER_LAUNCH", 3)  # 7 rows of 8 floats: launches of 2 rows (64-byte aligned)
    x = torch.randn(7, 8)
    y = torch.full_like(x, float("nan"))
    first_rows = torch.tensor([0, 0, 2, 2, 4, 4, 6.0]).unsqueeze(1)
    how = runtime.launch(kernel, x, y, values=(f32_bits(-2.5),), with_row=True, transfer=transfer)
    assert torch.equal(y, x * -2.5 + first_rows)
    assert how == ("host" if transfer == "host" else "copied")  # the stand-in returns a new buffer
    before = kernel.device.value
    x = torch.randn(8, 8)[1:]  # a view 32 bytes into its buffer: IREE needs 64
    y = torch.full((8, 8), float("nan"))[1:]
    runtime.launch(kernel, x, y, values=(f32_bits(0.5),), with_row=True, transfer=transfer)
    assert torch.equal(y, x * 0.5 + first_rows)
    assert kernel.device.value == before + 4  # one timeline value per call (4 chunks)


@pytest.mark.parametrize("row_bytes", [(3124, 3124), (3124, 1562), (512, 512), (4, 4), (262144, 262144),
                                       (3124, 3124, 4)])
def test_rows_per_launch_keeps_chunks_aligned(row_bytes):
    rows = runtime.rows_per_launch(row_bytes)
    assert 0 < rows <= runtime.MAX_ROWS_PER_LAUNCH
    assert all(rows * size % runtime.ALIGNMENT == 0 for size in row_bytes)


@pytest.mark.parametrize("make, dim", [(lambda: torch.randn(3, 5, 8), -1), (lambda: torch.randn(3, 5, 8), 1),
                                       (lambda: torch.randn(8, 5).t(), -1), (lambda: torch.randn(()), 0)])
def test_rows_round_trip(make, dim):
    from anysoftmax.backends.wave.backend import as_rows, from_rows

    x = make()
    spec = SoftmaxSpec.from_tensor(x, dim)
    rows = as_rows(x, spec)
    assert rows.is_contiguous() and rows.shape == (spec.n_rows if x.dim() else 1, spec.n_cols)
    no_copy = x.dim() == 0 or (spec.dim == x.dim() - 1 and x.is_contiguous())
    assert (rows.data_ptr() == x.data_ptr()) == no_copy  # the one copy, only where rows are not dense
    assert torch.equal(rows, x.movedim(spec.dim, -1).reshape(rows.shape) if x.dim() else x.reshape(1, 1))
    back = from_rows(rows.clone(), x, spec)
    assert torch.equal(back, x) and back.is_contiguous()


# --- the backend's host side with the kernel emulated in torch (pure) -----------------------------


def _emulated_call(kernel, inputs, outputs, values):
    """What a compiled kernel computes on one launch, written in torch from its `Fusion`: read
    the operands through the flat buffers and offsets the backend hands over, the first row
    from the last value. Stands in for `runtime._call_dlpack` to test everything around it."""
    import struct

    f, key = kernel.fusion, kernel
    x, *ops = inputs
    mask = ops.pop(0) if f.mask != "none" else None
    sinks = ops.pop(0) if f.sink_dtype else None
    vals = [struct.unpack("<f", struct.pack("<i", v))[0] for v in values]
    row0 = int(values[-1]) if f.needs_row else 0
    rows = torch.arange(x.shape[0]) + row0
    n = x.shape[1]
    cols = torch.arange(n)
    offsets = lambda terms: torch.tensor([offset_expr(terms, int(r)) for r in rows], dtype=torch.long)  # noqa: E731
    z = x.float()
    if f.scale:
        z = z * vals.pop(0)
    if f.softcap:
        cap = vals.pop(0)
        z = cap * torch.tanh(z / cap)
    live = torch.ones(z.shape, dtype=torch.bool)
    if f.causal_sq:
        live = cols.unsqueeze(0) <= (rows % f.causal_sq + f.causal_offset).unsqueeze(1)
    excluded = torch.zeros(z.shape, dtype=torch.bool)
    if mask is not None:
        if f.mask_col == 1 and not f.mask_terms:
            mv = mask[cols].unsqueeze(0).expand(z.shape)
        else:
            mv = mask[offsets(f.mask_terms).unsqueeze(1) + cols.unsqueeze(0) * f.mask_col]
        if f.mask == "bool":
            excluded = mv != 0
        else:
            z = z + mv.float()
    z = z.masked_fill(~live | excluded, -math.inf)
    m = z.amax(1, keepdim=True)
    if sinks is not None:
        s = sinks[offsets(f.sink_terms)].float().unsqueeze(1)
        m = torch.maximum(m, s)
    e = torch.exp(z - m)
    total = e.sum(1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(s - m)
        p = torch.exp(s - m) / total
    out = (z - m) - torch.log(total) if key.log else e / total
    empty = ~(live & ~excluded).any(1, keepdim=True)
    if f.empty != "none":
        from anysoftmax.core.reference import empty_row_value

        out = torch.where(empty, torch.tensor(empty_row_value(f.empty_rows, n, key.log)), out)
        if sinks is not None:
            p = torch.where(empty, torch.zeros(()), p)
    outputs[0].copy_(out)
    if sinks is not None:
        outputs[1].copy_(p.view(-1))
    return "in-place"


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(37, 40), (2, 3, 12, 10), (3, 781)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_backend_hands_the_kernel_what_it_reads(case, shape, log, gen, monkeypatch):
    # The backend's side of a fused call, everything but the GPU: canonical key, flat operand
    # views, scale/softcap bits, p_sink, row chunks and their first rows (a launch of at most 4
    # rows here), the result moved back: with the kernel emulated from its Fusion, the result
    # must pass the reference check.
    import anysoftmax.backends.wave.backend as b

    monkeypatch.setattr(b, "detect_target", lambda index=None: SM80)
    monkeypatch.setattr(b, "vmfb_for", lambda key, spec=None: b"")
    monkeypatch.setattr(runtime, "load", lambda key, vmfb, driver, device: key)
    monkeypatch.setattr(runtime, "_call_dlpack", _emulated_call)
    monkeypatch.setattr(runtime, "MAX_ROWS_PER_LAUNCH", 4)
    b._loaded.clear()
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).float()
    kw = case.kwargs(gen, shape)
    spec, ops = SoftmaxSpec.from_request(x, -1, log=log, fused=kw)
    from anysoftmax.core.variant import Operands

    y, p = WaveBackend().launcher(x, spec)(x, Operands(kw.get("mask"), kw.get("sinks"), *spec.variant.values()))
    result = compare(y, x, spec, mask=kw.get("mask"), sinks=kw.get("sinks"))
    assert result.ok, result.detail
    if kw.get("sinks") is not None:
        from anysoftmax.core.reference import fused_forward

        _, p_ref = fused_forward(x.double(), spec.variant, spec.dim, log, kw.get("mask"), kw["sinks"], torch.float64)
        assert p.shape == p_ref.shape and torch.allclose(p.double(), p_ref, rtol=1e-4, atol=1e-6)
    else:
        assert p is None


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, dim", [((37, 40), 1), ((2, 3, 12, 10), 1), ((9, 781), 0)], ids=str)
def test_plain_launcher_returns_the_result_alone(shape, dim, log, gen, monkeypatch):
    # A plain request runs the one launch path with no fused step: f(x) -> y, nothing else
    # handed to the kernel (no operand, no value, no first row), rows moved back to `dim`.
    import anysoftmax.backends.wave.backend as b

    monkeypatch.setattr(b, "detect_target", lambda index=None: SM80)
    monkeypatch.setattr(b, "vmfb_for", lambda key, spec=None: b"")
    monkeypatch.setattr(runtime, "load", lambda key, vmfb, driver, device: key)
    handed = []
    monkeypatch.setattr(runtime, "_call_dlpack", lambda k, i, o, v: handed.append((len(i), len(o), tuple(v))) or
                        _emulated_call(k, i, o, v))
    monkeypatch.setattr(runtime, "MAX_ROWS_PER_LAUNCH", 4)
    b._loaded.clear()
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).float()
    spec = SoftmaxSpec.from_tensor(x, dim, log=log)
    y = WaveBackend().launcher(x, spec)(x)
    assert isinstance(y, torch.Tensor) and set(handed) == {(1, 1, ())}
    result = compare(y, x, spec)
    assert result.ok, result.detail


# --- libamdhip64.so for IREE's hip driver (hiplib.py) ----------------------------------------------

from anysoftmax.backends.wave import hiplib, limits  # noqa: E402


def test_hip_dylib_search_order_and_hit(tmp_path):
    rocm, torch_lib = tmp_path / "rocm", tmp_path / "torch_lib"
    (rocm / "lib").mkdir(parents=True)
    torch_lib.mkdir()
    dirs = hiplib.search_dirs({"ROCM_PATH": str(rocm)}, str(torch_lib))
    assert dirs == [rocm / "lib", hiplib.Path("/opt/rocm/lib"), torch_lib]
    (torch_lib / "libamdhip64.so.6").write_bytes(b"")
    found = hiplib.find_hip_dylib([rocm / "lib", torch_lib])
    assert found == torch_lib / "libamdhip64.so.6"  # ROCm's lib lacks it: torch's bundled copy
    (rocm / "lib" / "libamdhip64.so").write_bytes(b"")
    assert hiplib.find_hip_dylib([rocm / "lib", torch_lib]) == rocm / "lib" / "libamdhip64.so"


def test_hip_dylib_missing_names_every_folder(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(FileNotFoundError, match="libamdhip64.so not found") as err:
        hiplib.find_hip_dylib(dirs)
    assert str(dirs[0]) in str(err.value) and str(dirs[1]) in str(err.value) and "ROCM_PATH" in str(err.value)


@pytest.mark.skipif(not _has("iree.runtime"), reason="iree-base-runtime is not installed")
def test_hip_dylib_flag_is_known_to_iree():
    """IREE 3.9 accepts the flag name anysoftmax passes (an unknown flag raises)."""
    import iree.runtime as rt

    rt.flags.parse_flags(f"{hiplib.FLAG}=/nonexistent/libamdhip64.so")
    with pytest.raises(Exception, match="not recognized"):
        rt.flags.parse_flags(f"{hiplib.FLAG}x=/x")


# --- device matching by UUID, else by ordinal with a warning ---------------------------------------

@pytest.mark.skipif(not _has("iree.runtime"), reason="iree-base-runtime is not installed")
def test_unmatched_uuid_warns_and_names_both(monkeypatch):
    from types import SimpleNamespace

    import iree.runtime as rt

    class FakeDriver:
        def query_available_devices(self):
            return [{"path": "GPU-aaaa", "name": "d0"}, {"path": "GPU-bbbb", "name": "d1"}]

        def create_device(self, info):
            return SimpleNamespace(path=info["path"], create_semaphore=lambda value: ("semaphore", value))

    monkeypatch.setattr(rt, "get_driver", lambda name: FakeDriver())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="cccc"))
    with pytest.warns(UserWarning, match=r"UUID cccc.*aaaa.*bbbb.*'GPU-bbbb' by ordinal 1"):
        dev = runtime._create_device("cuda", torch.device("cuda", 1))
    assert dev.hal.path == "GPU-bbbb" and dev.timeline == ("semaphore", 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="aaaa"))
    import warnings as w

    with w.catch_warnings():
        w.simplefilter("error")
        assert runtime._create_device("cuda", torch.device("cuda", 1)).hal.path == "GPU-aaaa"


# --- the longest row per target (limits.py, backends/wave/tuning.yaml) -------------------------------

def test_max_row_length_per_target():
    gfx942, gfx90a = parse_target("gfx942"), parse_target("gfx90a")
    assert limits.max_row_length(gfx942) == 131072  # 151936 spills registers on gfx942
    assert limits.max_row_length(gfx90a) == max_row_length(64)
    assert limits.max_row_length(gfx942, {"max_row_length": {"default": 10**9}}) == max_row_length(64)
    with pytest.raises(ValueError, match=r"max_row_length\['gfx942'\]=-1 .*positive integer"):
        limits.max_row_length(gfx942, {"max_row_length": {"gfx942": -1}})


def test_gfx942_refuses_rows_that_spill_and_names_triton(monkeypatch):
    import anysoftmax.backends.wave.backend as b

    monkeypatch.setattr(b, "detect_target", lambda index=None: parse_target("gfx942"))
    monkeypatch.setattr(b, "compiler_missing", lambda: None)
    cuda = torch.device("cuda", 0)
    for n, refused in ((131072, False), (151936, True)):
        reason = WaveBackend().supports(SoftmaxSpec((2, n), (n, 1), torch.float16, 1, torch.float16, False, cuda))
        assert (reason is not None and "gfx942" in reason and "'triton'" in reason) == refused, reason
