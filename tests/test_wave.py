"""The `wave` backend on a CPU machine: planning, the CUDA rewrite, the disk cache, availability
messages, real compilation (MLIR structure, gfx942 and sm_80 .vmfb files) and the runtime's
plumbing on a CPU stand-in module. Execution of the real kernels: tests/test_wave_gpu.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from anysoftmax.backends.wave import WaveBackend, diskcache, env, runtime
from anysoftmax.backends.wave.cuda_mlir import CudaRewriteError, to_cuda
from anysoftmax.backends.wave.kernel import KernelKey, max_row_length, max_waves, plan_row
from anysoftmax.backends.wave.target import ENV_ON_CUDA, parse_target
from anysoftmax.core import SoftmaxSpec, compare


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


needs_wave = pytest.mark.skipif(not _has("wave_lang"), reason="wave-lang not installed")
needs_iree = pytest.mark.skipif(not (_has("iree.compiler") and _has("iree.runtime")),
                                reason="iree-base-compiler / iree-base-runtime not installed")

GFX942, SM80 = parse_target("gfx942"), parse_target("sm_80")


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


# --- disk cache and versions (pure) ---------------------------------------------------------


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("ANYSOFTMAX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert diskcache.cache_dir() == tmp_path / "xdg" / "anysoftmax" / "wave"
    monkeypatch.setenv("ANYSOFTMAX_CACHE_DIR", str(tmp_path / "mine"))
    assert diskcache.cache_dir() == tmp_path / "mine" / "wave"


def test_cache_roundtrip_and_key(cache_root):
    key = KernelKey(781, "float16", "float32", True, SM80)
    path = diskcache.vmfb_path(key)
    assert path.name == "log_softmax_n781_float16-float32.vmfb" and path.parent.name == "cuda-sm_80"
    assert path.parent.parent.name == f"{env.toolchain_tag()}-k{diskcache.kernel_digest()}"
    assert diskcache.load(key) is None and not diskcache.has_kernels("cuda-sm_80")
    diskcache.store(key, b"vmfb-bytes")
    assert diskcache.load(key) == b"vmfb-bytes" and diskcache.has_kernels("cuda-sm_80")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    assert diskcache.load(KernelKey(781, "float16", "float16", True, SM80)) is None


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
    from anysoftmax.backends.wave.compiler import target_mlir
    from anysoftmax.backends.wave.kernel import kernel_mlir

    key = KernelKey(n, din, dout, log, GFX942)
    mlir = kernel_mlir(key)
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
    if plan.waves > 1:
        assert "memref.alloc()" in mlir and "amdgpu.lds_barrier" in mlir  # the exchange between waves
    cuda = target_mlir(KernelKey(n, din, dout, log, SM80))
    shuffles = [line for line in cuda.splitlines() if "gpu.shuffle" in line]
    assert len(shuffles) == 2 * 5 and all(line.endswith(": f32") for line in shuffles)  # log2(32) steps
    assert "amdgpu" not in cuda and "subgroup_size = 32" in cuda


@needs_wave
@pytest.mark.parametrize("target", [GFX942, SM80], ids=["gfx942", "sm_80"])
def test_vmfb_builds(target):
    from anysoftmax.backends.wave.compiler import compile_vmfb

    data = compile_vmfb(KernelKey(781, "float16", "float16", False, target))
    assert len(data) > 1000 and b"isolated_benchmark" in data
    assert (b"cuda" if target is SM80 else b"rocm") in data.lower()


@needs_wave
def test_aot_fills_the_cache_for_runtime_only_use(cache_root, capsys):
    from anysoftmax.backends.wave import aot

    assert aot.main(["--shapes", "2x128,3x128", "--dtypes", "fp32", "--ops", "softmax", "--target", "sm_80"]) == 0
    key = KernelKey(128, "float32", "float32", False, SM80)
    assert diskcache.load(key) is not None and diskcache.has_kernels("cuda-sm_80")
    assert capsys.readouterr().out.count("compiled") == 1  # M is dynamic: one kernel for both shapes
    aot.main(["--shapes", "128", "--dtypes", "fp32", "--ops", "softmax", "--target", "sm_80"])
    assert "cached" in capsys.readouterr().out


def test_aot_rejects_float64():
    from anysoftmax.backends.wave import aot

    with pytest.raises(SystemExit):
        aot.main(["--shapes", "128", "--dtypes", "float64", "--target", "sm_80"])


# --- runtime plumbing on a CPU stand-in module (iree) ----------------------------------------

_STANDIN = """
func.func @isolated_benchmark(%x: tensor<?x8x{t}>, %y: tensor<?x8x{t}>) -> tensor<?x8x{t}> {{
  %0 = arith.negf %x : tensor<?x8x{t}>
  return %0 : tensor<?x8x{t}>
}}"""


@needs_iree
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("transfer", runtime.TRANSFERS)
def test_runtime_moves_tensors_both_ways(dtype, transfer, monkeypatch):
    # Same ABI as the Wave kernels (x, y) -> y, compiled for the CPU: checks the dtype mapping
    # (bf16 through int16), the transfers and the row chunking, not the softmax.
    from iree.compiler import compile_str

    t = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    vmfb = compile_str(_STANDIN.format(t=t), extra_args=[
        "--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=generic"])
    kernel = runtime.load(("standin", t), vmfb, "local-sync", torch.device("cpu"))
    monkeypatch.setattr(runtime, "MAX_ROWS_PER_LAUNCH", 3)  # 7 rows of 8: launches of 2 rows (64-byte aligned)
    x = torch.randn(7, 8).to(dtype)
    y = torch.full_like(x, float("nan"))
    runtime.launch(kernel, x, y, transfer)
    assert torch.equal(y, -x)
    x = torch.randn(8, 8).to(dtype)[1:]  # a view 16 or 32 bytes into its buffer: IREE needs 64
    y = torch.full((8, 8), float("nan"), dtype=dtype)[1:]
    runtime.launch(kernel, x, y, transfer)
    assert torch.equal(y, -x)


@pytest.mark.parametrize("n, sizes", [(781, (4, 4)), (781, (2, 4)), (128, (2, 2)), (1, (2, 2)), (65536, (4, 4))])
def test_rows_per_launch_keeps_chunks_aligned(n, sizes):
    rows = runtime.rows_per_launch(n, sizes)
    assert 0 < rows <= runtime.MAX_ROWS_PER_LAUNCH
    assert all(rows * n * size % runtime.ALIGNMENT == 0 for size in sizes)


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
            return ("device", info["path"])

    monkeypatch.setattr(rt, "get_driver", lambda name: FakeDriver())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="cccc"))
    with pytest.warns(UserWarning, match=r"UUID cccc.*aaaa.*bbbb.*'GPU-bbbb' by ordinal 1"):
        dev = runtime._create_device("cuda", torch.device("cuda", 1))
    assert dev.hal == ("device", "GPU-bbbb")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="aaaa"))
    import warnings as w

    with w.catch_warnings():
        w.simplefilter("error")
        assert runtime._create_device("cuda", torch.device("cuda", 1)).hal == ("device", "GPU-aaaa")


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
