"""The native launcher (`_triton_common/native_launch.py` + `.cc`) on a machine without a GPU:
the C++ builds through TVM-FFI here, the parameter list it derives from a kernel compiled for
sm_90 is Triton's (constexprs and integers specialised to 1 dropped, scratch pointers
appended), and for every plan shape it packs, parameter by parameter, the value Triton's
launcher is given on the fast path (its packing runs without launching). $ANYSOFTMAX_LAUNCHER
is parsed strictly, and a missing toolchain leaves Triton's launcher in place with the reason
recorded. On a GPU, native launches give Triton's results bit for bit."""

from __future__ import annotations

import inspect
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from anysoftmax.backends._triton_common import launcher, native_launch
from anysoftmax.backends._triton_common.launcher import bind
from anysoftmax.backends._triton_common.plan import PLAIN_SCALARS, VALUE_NAMES, Fusion, make_plan, runtime_params
from anysoftmax.backends._triton_common.softmax_launchers import backward_layout, forward_layout
from anysoftmax.core.spec import SoftmaxSpec
from helpers import runnable_backends
from helpers.distributed import one_rank_sharded_launcher

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DL_CPU = 1


def _toolchain_missing() -> str | None:
    # What building the extension would lack (apache-tvm-ffi, a C++ compiler, Triton's cuda.h),
    # asked of the build's own command, which names it.
    try:
        native_launch.build_command(Path("native_launch.cc"), Path("out.so"))
    except native_launch.NativeUnavailable as exc:
        return str(exc)
    return None


needs_toolchain = pytest.mark.skipif(_toolchain_missing() is not None, reason=str(_toolchain_missing()))


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """The extension built into a scratch cache: nothing is left in the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANYSOFTMAX_CACHE_DIR", str(tmp_path_factory.mktemp("anysoftmax_cache")))
        mp.setattr(native_launch, "_loaded", {})
        yield


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The extension forgotten and its cache empty: this test builds (or fails to build) it."""
    monkeypatch.setenv("ANYSOFTMAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native_launch, "_loaded", {})


@needs_toolchain
def test_extension_builds_and_caches(fresh, tmp_path):
    assert native_launch.unavailable() is None
    (built,) = (tmp_path / "cache" / "native").glob("native_launch_*.so")
    mod = native_launch.module()
    assert hasattr(mod, "make_launcher") and hasattr(mod, "env_stream")
    native_launch._loaded.clear()  # a second process: loads the cached library, builds nothing
    stamp = built.stat().st_mtime_ns
    assert native_launch.unavailable() is None and built.stat().st_mtime_ns == stamp


@pytest.mark.parametrize("value,chosen", [(None, native_launch.AUTO), ("", native_launch.AUTO), ("triton", "triton"),
                                          ("native", "native"), (" Native ", "native"),
                                          ("auto", native_launch.AUTO)])
def test_launcher_knob(value, chosen):
    assert native_launch.choose(value) == chosen


def test_launcher_knob_refuses_other_values():
    with pytest.raises(ValueError, match=r"ANYSOFTMAX_LAUNCHER='cuda'.*triton, native, auto"):
        native_launch.choose("cuda")


def test_missing_tvm_ffi_is_a_reason(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)  # (import tvm_ffi raises ImportError)
    reason = native_launch.unavailable()
    assert reason is not None and "apache-tvm-ffi does not import" in reason
    assert native_launch.unavailable() == reason  # asked once: the same answer


@needs_toolchain
def test_failed_build_is_a_reason_and_triton_launches(fresh, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    reason = native_launch.unavailable()
    assert reason is not None and "building native_launch.cc failed" in reason
    # A bound launcher asked for the native one keeps Triton's, says why, and warns when the
    # user named `native`.
    monkeypatch.setattr(native_launch, "EXPLICIT", True)
    monkeypatch.setattr(native_launch, "LAUNCHER", "native")
    monkeypatch.setattr(launcher, "_native_warned", set())
    plan, layout, given, _ = _case("tile", False, False)
    launch = bind(plan, layout, False, torch.float32)
    with pytest.warns(RuntimeWarning, match="building native_launch.cc failed"):
        launch.prime(_stand_ins(plan, layout, given), given, stream_of=lambda index: 7)
    assert launch.state["native_reason"] == reason and launch.state["fast"].native is None


# --- the parameter list of a kernel compiled for sm_90 ---------------------------------------

COMPILE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from compile_targets import DEVICES, case_layout, compile_launch, launches, plan_for
from anysoftmax.backends._triton_common import native_launch

shape, dtype = (8, 1024), torch.float32
_, layout = case_layout(shape, 1, dtype, False, None)
plan = plan_for(layout, dtype.itemsize, DEVICES["sm_90"], False, {})
(kernel, args, constexprs, opts), = launches(plan, shape, 1, dtype, False, False)
compiled, how = compile_launch(kernel, args, constexprs, "sm_90", opts)
names = [p.name for p in kernel.params if not p.is_constexpr]
print(json.dumps(dict(how=how, params=native_launch.kernel_params(compiled), refusal=native_launch.refusal(compiled),
                      args={n: (v if isinstance(v, (int, float)) else str(v.dtype)) for n, v in zip(names, args)},
                      constexprs=sorted(constexprs), signature=compiled.src.signature)))
"""


def test_parameter_types_of_a_compiled_kernel(tmp_path):
    pytest.importorskip("triton")
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip(f"this Triton has no 'nvidia' backend ({sorted(backends)}): cannot compile for sm_90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    proc = subprocess.run([sys.executable, "-c", COMPILE, str(HERE)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["how"] == "jit-binder" and doc["refusal"] is None
    params = [tuple(p) for p in doc["params"]]
    # Triton's launcher passes every signature entry but "constexpr" ones, then two pointers.
    assert params[-2:] == list(native_launch.SCRATCH)
    names = [n for n, _ in params[:-2]]
    args = doc["args"]
    # Dropped: every constexpr, and the integers equal to 1 (the JIT folds them in). Kept, in
    # the kernel's order: the rest.
    assert not set(names) & set(doc["constexprs"])
    ones = [n for n, v in args.items() if isinstance(v, int) and not isinstance(v, bool) and v == 1]
    assert {"S1", "xsn", "ysn"} <= set(ones), ones  # (8x1024 contiguous: one row block, unit columns)
    assert names == [n for n in args if n not in ones]
    assert all(doc["signature"][n] == "constexpr" for n in ones)
    want = {"torch.float32": "*fp32"}
    for name, ty in params[:-2]:
        v = args[name]
        assert ty == (want[v] if isinstance(v, str) else "fp32" if isinstance(v, float) else "i32"), (name, ty, v)


# --- what is packed: the values Triton's launcher is given -------------------------------------

CASES = [("tile", False, False), ("tile", False, True), ("tile", True, False), ("split", False, False),
         ("split", True, True)]


def _case(kind: str, backward: bool, fused: bool):
    """(plan, layout, given tensors, values) of a request of `kind` on CPU tensors: the split
    plans not cooperative (two launches forward, statistics then normalisation)."""
    x = torch.randn(2, 3, 16)
    if fused:
        kw = dict(scale=0.5, softcap=3.0, mask=torch.rand(x.shape) < 0.3, sinks=torch.randn(2, 3, 1))
        spec = SoftmaxSpec.from_request(x, -1, fused=kw)[0]
    else:
        spec = SoftmaxSpec.from_tensor(x, -1)
    layout = backward_layout(x, spec)[0] if backward else forward_layout(x, spec)[2]
    plan = make_plan(kind, 1, 16 if kind == "tile" else 8, 3, backward=backward, chunks=2, fusion=Fusion.of(spec))
    t = [torch.randn(2, 3, 16) for _ in range(4)]
    mask = (torch.rand(x.shape) < 0.3).view(torch.uint8) if fused else None
    p = torch.randn(2, 3, 1) if fused else None
    if backward:  # (y, dy, dx, x, mask, p_sink, dsinks)
        given = (t[0], t[1], t[2], t[3] if fused else None, mask, p, torch.empty(2, 3, 1) if fused else None)
    else:  # (x, y, mask, sinks, p_sink, row scale)
        given = (t[0], t[1], mask, torch.randn(2, 3, 1) if fused else None, p, None)
    return plan, layout, given, (0.5, -0.25, 3.0, 1e-3) if fused else PLAIN_SCALARS


class _Triton:
    """Stands in for Triton's CUDA launcher (named like it): records what it is given."""

    def __init__(self):
        self.seen = []
        self.launch = lambda *a: self.seen.append(a)
        self.launch_cooperative_grid = self.launch_pdl = False
        self.global_scratch_size = self.profile_scratch_size = 0
        self.num_ctas = 1

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # (Triton 3.6's signature)
        raise AssertionError("the fast path calls the extension (`launch`) directly")


CudaLauncher = type("CudaLauncher", (_Triton,), {})


def _stand_ins(plan, layout, given) -> list:
    """Compiled kernels of `plan`'s launches as Triton's JIT would type them: pointers,
    integers (those equal to 1 specialised to constants), fp32 floats, then the constexprs."""
    kernel = plan.kernel()
    named = plan.arguments(plan.head(plan.tensors(given), torch.empty(1), torch.empty(1)), layout)
    sig = {}
    for n in runtime_params(kernel):
        v = named[n]
        sig[n] = "*fp32" if isinstance(v, torch.Tensor) else "fp32" if isinstance(v, float) else \
            "constexpr" if v == 1 else "i32"
    sig.update({n: "constexpr" for n in inspect.signature(kernel.fn).parameters if n not in sig})
    md = SimpleNamespace(name=kernel.__name__, global_scratch_size=0, profile_scratch_size=0, num_ctas=1, shared=0,
                         num_warps=4, launch_cooperative_grid=False, launch_pdl=False)
    return [SimpleNamespace(run=CudaLauncher(), function=0, packed_metadata=(4, 1, 0),
                            src=SimpleNamespace(signature=sig), metadata=md) for _ in plan.phases()]


@needs_toolchain
@pytest.mark.parametrize("kind,backward,fused", CASES,
                         ids=[f"{k}-{'bwd' if b else 'fwd'}-{'fused' if f else 'plain'}" for k, b, f in CASES])
def test_native_packs_what_triton_launch_is_given(kind, backward, fused, monkeypatch):
    plan, layout, given, values = _case(kind, backward, fused)
    scratch = (torch.empty(64), torch.zeros(16, dtype=torch.int32))  # (one pair for both paths)
    monkeypatch.setattr(launcher, "scratch_maker", lambda *a: (lambda device: scratch))
    compiled = _stand_ins(plan, layout, given)
    assert len(compiled) == (2 if kind == "split" else 1)  # (statistics, then normalisation)
    monkeypatch.setattr(native_launch, "LAUNCHER", "triton")
    triton_launch = bind(plan, layout, False, torch.float32)
    triton_launch.prime(compiled, given, stream_of=lambda index: 7)
    triton_launch(given, values)  # Triton's launcher, as the fast path calls it
    seen = [c.run.seen[0] for c in compiled]

    # The native launcher, packing without launching (CPU tensors: DLPack device 1).
    monkeypatch.setattr(native_launch, "LAUNCHER", "native")
    monkeypatch.setattr(native_launch, "follows_torch_stream", lambda t: True)
    real_make = native_launch.make
    monkeypatch.setattr(native_launch, "make", lambda *a, **k: real_make(*a, **k, run=False, device_type=DL_CPU))
    launch = bind(plan, layout, False, torch.float32)
    launch.prime(compiled, given, stream_of=lambda index: 7)
    assert launch.state["native_reason"] is None, launch.state["native_reason"]
    names = runtime_params(plan.kernel())
    for vals in (values, PLAIN_SCALARS):
        packed = launch(given, vals)
        assert len(packed) == len(compiled)
        for c, got, args in zip(compiled, packed, seen):
            triton_args = dict(zip(names, args[13:]))  # (after grid, stream, function and flags)
            triton_args.update(zip(VALUE_NAMES, vals))
            params = native_launch.kernel_params(c)
            slots = struct.unpack(f"<{len(params)}Q", bytes(got))
            for (name, ty), slot in zip(params, slots):
                want = 0 if (name, ty) in native_launch.SCRATCH else triton_args[name]
                if ty == "fp32":
                    assert slot == struct.unpack("<I", struct.pack("<f", want))[0], name
                elif ty == "i32":
                    assert slot == struct.unpack("<I", struct.pack("<i", want))[0], name
                else:
                    assert slot == want, name
    # The request's operands are checked: a None where it has a tensor, or the reverse.
    absent = given.index(None) if None in given else None
    if absent is not None:
        with pytest.raises(ValueError, match=f"argument {absent} is a tensor"):
            launch(tuple(given[0] if i == absent else t for i, t in enumerate(given)))
    with pytest.raises(ValueError, match="argument 0 is None"):
        launch((None, *given[1:]))


def test_interpreted_launcher_says_why_it_is_not_native(monkeypatch):
    monkeypatch.setattr(native_launch, "LAUNCHER", "native")
    plan, layout, given, _ = _case("tile", False, False)
    launch = bind(plan, layout, False, torch.float32)
    x = given[0]
    y = torch.empty_like(x)
    launch((x, y, None, None, None, None))
    torch.testing.assert_close(y, torch.softmax(x, -1))
    assert launch.state["fast"] is None and launch.state["native_reason"].startswith("no fast path")


# --- on a GPU -------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_toolchain
@pytest.mark.parametrize("shape,dtype", [((8, 1024), torch.float32), ((4, 262144), torch.bfloat16)])
def test_native_results_equal_triton_results(shape, dtype, monkeypatch):
    import anysoftmax

    if native_launch.unavailable() is not None:
        pytest.fail(f"the native launcher does not build on this GPU host: {native_launch.unavailable()}")
    made = []
    real_make = native_launch.make
    monkeypatch.setattr(native_launch, "make", lambda *a, **k: made.append(real_make(*a, **k)) or made[-1])
    x = torch.randn(shape, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    got = {}
    for which in ("triton", "native"):
        monkeypatch.setattr(native_launch, "LAUNCHER", which)
        anysoftmax.refresh()
        for _ in range(3):  # (the first call compiles through Triton's JIT, the later ones are bound)
            y = anysoftmax.softmax(x, -1, backend="triton")
            got[which] = (y, anysoftmax.softmax_backward(y, g, -1, backend="triton"))
    torch.cuda.synchronize()
    assert len(made) >= 2, "the native launchers (forward, backward) were not made"
    for a, b in zip(got["triton"], got["native"]):
        assert torch.equal(a, b)


# --- merge_states: its bound launcher's native form ------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("k", [1, 3, 8])
def test_native_merge_packs_each_partial_and_lse(k, monkeypatch):
    from anysoftmax.backends._triton_common import merge_states
    from anysoftmax.core.lse_merge import MergeSpec

    # The kernel's runtime parameters: the partials, the lses and the two outputs, then the integers.
    names = runtime_params(merge_states.merge_kernel)
    pointers = merge_states.POINTERS
    outputs = [torch.randn(5, 4, 16) for _ in range(k)]
    lses = [torch.randn(5, 4) for _ in range(k)]
    out, lse_out = torch.empty(5, 4, 16), torch.empty(5, 4)
    static = (20, 16, 4, 64, 16, 1, 4, 1, 64, 16, 1, 4, 1)  # (rows (5, 4) of 16 columns, contiguous)
    assert tuple(merge_states._row_args(outputs, lses, out, lse_out, 2).values()) == static
    assert names[:len(pointers)] == pointers and len(names) == len(pointers) + len(static)
    ints = names[len(pointers):]
    sig = {n: "*fp32" for n in pointers}
    sig.update({n: "constexpr" if v == 1 else "i32" for n, v in zip(ints, static)})
    md = SimpleNamespace(name="merge_kernel", global_scratch_size=0, profile_scratch_size=0, num_ctas=1, shared=0,
                         num_warps=4, launch_cooperative_grid=False, launch_pdl=False)
    compiled = SimpleNamespace(run=CudaLauncher(), function=0, packed_metadata=(4, 1, 0),
                               src=SimpleNamespace(signature=sig), metadata=md)
    # Packing without launching, from CPU tensors (DLPack device 1).
    real_make = native_launch.make
    monkeypatch.setattr(native_launch, "make", lambda *a, **kw: real_make(*a, **kw, run=False, device_type=DL_CPU))
    monkeypatch.setattr(native_launch, "follows_torch_stream", lambda t: True)
    monkeypatch.setattr(native_launch, "LAUNCHER", "native")
    run = merge_states.merge_launcher(MergeSpec.from_tensors(outputs, lses), lambda *a: merge_states.MergePlan(4, 16, 3))
    run(outputs, lses, out, lse_out)  # (the first call binds: interpreted)
    launch = run.state["launch"]
    launch.prime([compiled], (*outputs, *lses, out, lse_out), stream_of=lambda index: 7)
    assert launch.state["native_reason"] is None, launch.state["native_reason"]
    (got,) = launch((*outputs, *lses, out, lse_out))
    params = native_launch.kernel_params(compiled)
    slots = dict(zip([n for n, _ in params], struct.unpack(f"<{len(params)}Q", bytes(got))))
    # Partial i and lse i where i < K; past K the first ones stand in (never read: K is a constexpr).
    for i in range(merge_states.MAX_K):
        assert slots[f"o{i}"] == outputs[i if i < k else 0].data_ptr(), i
        assert slots[f"l{i}"] == lses[i if i < k else 0].data_ptr(), i
    assert slots["out_ptr"] == out.data_ptr() and slots["lse_ptr"] == lse_out.data_ptr()
    for n, v in zip(ints, static):
        if v != 1:
            assert slots[n] == v, n
    assert slots["global_scratch"] == slots["profile_scratch"] == 0


def _merge_stand_in(k: int):
    """(outputs, lses, out, lse_out, compiled): a merge request of K partials and its kernel as
    Triton's JIT would type it (integers equal to 1 compiled in)."""
    from anysoftmax.backends._triton_common import merge_states

    outputs = [torch.randn(5, 4, 16) for _ in range(k)]
    lses = [torch.randn(5, 4) for _ in range(k)]
    out, lse_out = torch.empty(5, 4, 16), torch.empty(5, 4)
    ints = merge_states._row_args(outputs, lses, out, lse_out, 2)
    sig = {n: "*fp32" for n in merge_states.POINTERS}
    sig.update({n: "constexpr" if v == 1 else "i32" for n, v in ints.items()})
    md = SimpleNamespace(name="merge_kernel", global_scratch_size=0, profile_scratch_size=0, num_ctas=1, shared=0,
                         num_warps=4, launch_cooperative_grid=False, launch_pdl=False)
    compiled = SimpleNamespace(run=CudaLauncher(), function=0, packed_metadata=(4, 1, 0),
                               src=SimpleNamespace(signature=sig), metadata=md)
    return outputs, lses, out, lse_out, compiled


@needs_toolchain
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("which", ["triton", "native"])
def test_an_addressed_merge_launch_passes_what_a_tensor_launch_passes(k, which, monkeypatch):
    """A repeated merge's proof reads every partial's and lse's address; the launch takes them
    as read (`addressed`, `launch.at`) and passes the kernel the same pointers as a launch given
    the tensors, through Triton's launcher and the native one alike. The native launcher reads
    the stream through a tensor: given none, it refuses."""
    from anysoftmax.backends._triton_common import merge_states
    from anysoftmax.core.lse_merge import MergeSpec

    outputs, lses, out, lse_out, compiled = _merge_stand_in(k)
    monkeypatch.setattr(native_launch, "LAUNCHER", which)
    if which == "native":
        real_make = native_launch.make
        monkeypatch.setattr(native_launch, "make", lambda *a, **kw: real_make(*a, **kw, run=False, device_type=DL_CPU))
        monkeypatch.setattr(native_launch, "follows_torch_stream", lambda t: True)
    run = merge_states.merge_launcher(MergeSpec.from_tensors(outputs, lses), lambda *a: merge_states.MergePlan(4, 16, 3))
    run(outputs, lses, out, lse_out)  # (the first call binds: interpreted)
    launch = run.state["launch"]
    launch.prime([compiled], (*outputs, *lses, out, lse_out), stream_of=lambda index: 7)
    addresses = tuple(t.data_ptr() for t in (*outputs, *lses))
    if which == "native":
        native = launch.state["fast"].native
        assert native is not None, launch.state["native_reason"]
        assert bytes(native(*addresses, out, lse_out)[0]) == bytes(launch((*outputs, *lses, out, lse_out))[0])
        with pytest.raises(ValueError, match="no argument is a tensor"):
            native(*addresses, out.data_ptr(), lse_out.data_ptr())
        with pytest.raises(TypeError, match="neither a tensor, an address nor None"):
            native(*addresses[:-1], 1.5, out, lse_out)
        assert launch.at(addresses, (out, lse_out)) is True
    else:
        assert run.addressed(addresses, outputs, lses, out, lse_out) == (out, lse_out)
        launch((*outputs, *lses, out, lse_out))
        seen = compiled.run.seen
        assert len(seen) == 2 and seen[0] == seen[1] and seen[0][13:13 + 2 * merge_states.MAX_K + 2] == \
            tuple(t.data_ptr() for t in merge_states_pointers(outputs, lses, out, lse_out, k))
    # With a launch hook active, nothing launches through the addresses: the caller uses tensors.
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert launch.at(addresses, (out, lse_out)) is False


def merge_states_pointers(outputs, lses, out, lse_out, k):
    """merge_kernel's pointer arguments in order: partials and lses past K stand in as the first ones."""
    from anysoftmax.backends._triton_common.merge_states import MAX_K

    pad = MAX_K - k
    return (*outputs, *outputs[:1] * pad, *lses, *lses[:1] * pad, out, lse_out)


@pytest.mark.gpu
@needs_toolchain
@pytest.mark.parametrize("k", [2, 8])
def test_native_merge_equals_triton_merge(k, monkeypatch):
    if native_launch.unavailable() is not None:
        pytest.fail(f"the native launcher does not build on this GPU host: {native_launch.unavailable()}")
    outputs = [torch.randn(3, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(k)]
    lses = [torch.randn(3, 32, device="cuda") * 4 for _ in range(k)]
    lses[0][1] = float("-inf")  # (an empty segment in one row)
    from anysoftmax.core.lse_merge import MergeSpec
    from anysoftmax.core.registry import get_backend

    spec = MergeSpec.from_tensors(outputs, lses)
    got = {}
    for which in ("triton", "native"):
        monkeypatch.setattr(native_launch, "LAUNCHER", which)
        launch = get_backend("triton").merge_states_launcher(outputs, lses, spec)
        for _ in range(3):  # (the first call compiles; the later ones are bound)
            got[which] = launch(outputs, lses, None, None)
        engine = launch.state["launch"]
        assert (engine.state["fast"].native is not None) == (which == "native"), engine.state["native_reason"]
    torch.cuda.synchronize()
    for a, b in zip(got["triton"], got["native"]):
        assert torch.equal(a, b)
    torch.testing.assert_close(got["native"][1], torch.stack(lses).logsumexp(0))


def test_the_native_launcher_accepts_the_scratch_a_launch_appends():
    """Each call of a sampler launch appends the scratch stand-ins, which a kernel with no absent
    operand never reads: the native launcher must take them on every call, and still refuse a
    tensor where the bound request had none (an absent operand the kernel was built without)."""
    from anysoftmax.backends._triton_common.sampling import operand_pointers, stand_ins

    scratch = stand_ins(torch.device("cpu"))
    for names, args in ((("t_ptr", "s_ptr"), (torch.ones(4), torch.ones(4))),  # nothing absent
                        (("x_ptr", "lse_ptr", "s_ptr", "t_ptr", "ids_ptr", "out_ptr"),
                         (torch.ones(4), torch.ones(4), None, None, torch.ones(4, dtype=torch.int64), torch.ones(4)))):
        bound = (*args, *scratch)
        index = operand_pointers(names)(tuple(None if a is None else i for i, a in enumerate(bound)))
        accepted = launcher.accepted_tensors(bound, index)
        assert all(accepted[i] for i, a in enumerate(bound) if a is not None), (names, accepted)
        assert not any(accepted[i] for i, a in enumerate(bound) if a is None), (names, accepted)


# --- per-call integers: the sampler's scan and select, the sharded kernel ---------------------------

INT32_MAX, INT32_MIN = 2**31 - 1, -2**31


def _slot(ty: str, value) -> int:
    """The 64-bit slot Triton's launcher fills for a parameter of type `ty` given `value`: the
    value's bytes as the kernel reads them, the rest zero."""
    fmt = native_launch.INT_FORMATS.get(ty) or dict(fp32="f", f32="f", fp64="d").get(ty)
    if fmt is None:  # (a pointer: its address)
        return value
    return int.from_bytes(struct.pack("<" + fmt, value).ljust(8, b"\0"), "little")


def _capture(module, monkeypatch) -> list:
    """`module.bind_kernel` patched to record each binding, its keywords and its calls'
    (args, values, per_call): the request is bound again from them below, once per launcher."""
    made, real = [], launcher.bind_kernel  # (not module.bind_kernel: a second capture would wrap the first's spy)

    def bind(b, **kw):
        launch = real(b, **kw)
        entry = SimpleNamespace(binding=b, kw=dict(kw), calls=[], launch=launch)
        if kw.get("scratch") is not None:  # (the same scratch for every launcher bound again below)
            held, make = {}, kw["scratch"]
            entry.kw["scratch"] = lambda device: held.setdefault(device, make(device))
        made.append(entry)

        def spy(args, values=b.values, per_call=()):
            entry.calls.append((args, values, per_call))
            return launch(args, values, per_call)
        return spy
    monkeypatch.setattr(module, "bind_kernel", bind)
    return made


def _binding_stand_ins(b, types: dict) -> list:
    """Compiled kernels of binding `b`'s launches as Triton's JIT types them: pointers, its
    integers (per-call ones never specialised: `types` or i32; the others equal to 1 compiled in),
    fp32 floats, then the constexprs."""
    sig = {n: "*fp32" for n in b.pointer_names}
    sig.update({n: types.get(n, "i32") if n in b.per_call else "constexpr" if v == 1 else
                "i32" if INT32_MIN <= v <= INT32_MAX else "i64" for n, v in b.ints.items()})
    sig.update({n: "fp32" for n in b.floats})
    sig.update({n: "constexpr" for n in inspect.signature(b.kernel.fn).parameters if n not in sig})
    md = SimpleNamespace(name=b.kernel.__name__, global_scratch_size=0, profile_scratch_size=0, num_ctas=1, shared=0,
                         num_warps=4, launch_cooperative_grid=False, launch_pdl=False)
    return [SimpleNamespace(run=CudaLauncher(), function=0, packed_metadata=(4, 1, 0),
                            src=SimpleNamespace(signature=sig), metadata=md) for _ in b.metas]


def _native_packing(monkeypatch):
    """The native launcher chosen, packing without launching, from CPU tensors (DLPack device 1)."""
    monkeypatch.setattr(native_launch, "LAUNCHER", "native")
    monkeypatch.setattr(native_launch, "follows_torch_stream", lambda t: True)
    real_make = native_launch.make
    monkeypatch.setattr(native_launch, "make", lambda *a, **k: real_make(*a, **k, run=False, device_type=DL_CPU))


def _both_launchers(entry, monkeypatch, types: dict):
    """(Triton's bound launcher, the native one, the stand-ins) of a captured binding, both
    primed from its first call's arguments."""
    b = entry.binding
    compiled = _binding_stand_ins(b, types)
    args = entry.calls[0][0]
    monkeypatch.setattr(native_launch, "LAUNCHER", "triton")
    triton_launch = launcher.bind_kernel(b, **entry.kw)
    triton_launch.prime(compiled, args, stream_of=lambda index: 7)
    with monkeypatch.context() as mp:
        _native_packing(mp)
        native = launcher.bind_kernel(b, **entry.kw)
        native.prime(compiled, args, stream_of=lambda index: 7)
    assert native.state["native_reason"] is None, native.state["native_reason"]
    return triton_launch, native, compiled


def _assert_packs_as_triton(entry, monkeypatch, calls: list, types: dict = {}) -> None:
    """For each (values, per_call) of `calls` (values None: the binding's default, left out of
    the call), the native launcher's slots equal what Triton's launcher is given, parameter by
    parameter, on the captured binding's first call's tensors."""
    triton_launch, native, compiled = _both_launchers(entry, monkeypatch, types)
    b, args = entry.binding, entry.calls[0][0]
    names = runtime_params(b.kernel)
    for values, per_call in calls:
        kw = {} if values is None else dict(values=values)
        triton_launch(args, per_call=per_call, **kw)
        packed = native(args, per_call=per_call, **kw)
        assert len(packed) == len(compiled)
        for c, got in zip(compiled, packed):
            triton_args = dict(zip(names, c.run.seen[-1][13:]))  # (after grid, stream, function and flags)
            assert [triton_args[n] for n in b.per_call] == list(per_call or [b.ints[n] for n in b.per_call])
            params = native_launch.kernel_params(c)
            slots = struct.unpack(f"<{len(params)}Q", bytes(got))
            for (name, ty), slot in zip(params, slots):
                want = 0 if (name, ty) in native_launch.SCRATCH else _slot(ty, triton_args[name])
                assert slot == want, (b.kernel.__name__, name, ty, triton_args.get(name))


SAMPLER_PLAN = dict(chunk=128, slots=32, num_warps=4, tile=64)


def _sampler_bindings(monkeypatch, gen, fused=False):
    """The scan and select bindings of a small `sample` request (keywords as numbers: top_k,
    a seed and an offset beyond 32 bits, per-call words) and the calls it made (interpreted);
    `fused`: the one launch of both (`scan_select_kernel`)."""
    from anysoftmax.backends._triton_common import sampling as triton_sampling
    from anysoftmax.sampling.spec import SamplingSpec

    made = _capture(triton_sampling, monkeypatch)
    plan = triton_sampling.SamplingPlan(grid=5, fused=fused, **SAMPLER_PLAN)
    x = torch.randn(3, 300, generator=gen) * 3
    spec = SamplingSpec.from_request("sample", x, temperature=0.9, top_k=12, top_p=0.8, min_p=0.01,
                                     seed=2**40 + 12345, offset=2**33 + 7)
    triton_sampling.sample(spec, x, True, plan=plan)
    made = [e for e in made if e.calls]  # (a fused plan binds the scan too, for a pass one alone)
    assert [e.binding.kernel.__name__ for e in made] == (["scan_select_kernel"] if fused else
                                                        ["scan_kernel", "select_kernel"])
    return made


# Per-call integers a call may pass: negatives, int32's extremes, zero.
PER_CALL_SAMPLES = [(12, -5, INT32_MAX, INT32_MIN, 7, 0), (INT32_MAX, 0, -1, 1, INT32_MIN, 3), (0,) * 6]


@needs_toolchain
@pytest.mark.skipif("triton" not in runnable_backends("cpu"), reason="TRITON_INTERPRET is not set")
@pytest.mark.parametrize("fused", [False, True], ids=["two-launches", "fused"])
def test_native_packs_the_samplers_per_call_integers(monkeypatch, gen, fused):
    made = _sampler_bindings(monkeypatch, gen, fused)
    for entry in made:
        (args, values, per_call), = entry.calls
        assert per_call[1:5] != (0, 0, 0, 0)  # (the request's seed and offset words)
        calls = [(values, per_call), (None, per_call)]  # (the call's floats, then the default ones)
        calls += [(values, p) for p in PER_CALL_SAMPLES] + [(None, PER_CALL_SAMPLES[0]), ((0.5, 0.25, 0.125), ())]
        _assert_packs_as_triton(entry, monkeypatch, calls)


@needs_toolchain
@pytest.mark.skipif("triton" not in runnable_backends("cpu"), reason="TRITON_INTERPRET is not set")
def test_native_packs_a_sharded_select_without_logits(monkeypatch, gen):
    """`select_shards` launches with no logits operand (its first argument None): the native
    launcher is made from the bound device's other tensors."""
    import dataclasses

    from anysoftmax.backends._triton_common import sampling as triton_sampling
    from anysoftmax.sampling.spec import SamplingSpec

    plan = triton_sampling.SamplingPlan(grid=6, **SAMPLER_PLAN)
    x = torch.randn(3, 256, generator=gen)
    spec = SamplingSpec.from_request("sample", x[:, :128], temperature=0.9, top_k=12, seed=11, offset=4)
    parts = []
    for lo in (0, 128):
        shard = x[:, lo:lo + 128].contiguous()
        ws, space, _ = triton_sampling.scan_shard(spec, shard, lo, 256, plan=dataclasses.replace(plan))
        parts.append(ws[:space.shard_words])
    made = _capture(triton_sampling, monkeypatch)
    triton_sampling.select_shards(spec, torch.stack(parts), 2, 256, plan, return_logprobs=True)
    (entry,) = made
    assert entry.calls[0][0][0] is None
    _assert_packs_as_triton(entry, monkeypatch, [(entry.calls[0][1], entry.calls[0][2]),
                                                 (entry.calls[0][1], PER_CALL_SAMPLES[0])])


def _sharded_binding(monkeypatch, gen):
    """The sharded one-read kernel's captured binding and first call (one rank: its mailbox waits
    on no peer)."""
    from anysoftmax.backends.triton import sharded

    made = _capture(sharded, monkeypatch)
    x = torch.randn(3, 24, generator=gen)
    run = one_rank_sharded_launcher(x)
    run(x, None, None, 0.5, None, 1, 0)
    (entry,) = made
    assert entry.binding.per_call == ("epoch", "slot_base")
    return entry


@needs_toolchain
@pytest.mark.skipif("triton" not in runnable_backends("cpu"), reason="TRITON_INTERPRET is not set")
def test_native_packs_the_sharded_epoch(monkeypatch, gen):
    entry = _sharded_binding(monkeypatch, gen)
    values = entry.calls[0][1]
    _assert_packs_as_triton(entry, monkeypatch, [(values, (6, 8)), (None, (INT32_MAX, 0)), (values, ())])
    # Triton types an integer by the value it was compiled for: i64 and the unsigned types too.
    _assert_packs_as_triton(entry, monkeypatch, [(values, (2**40 + 3, 2**63 - 1)), (values, (-2**62, 5))],
                            types=dict(epoch="i64", slot_base="u64"))
    _assert_packs_as_triton(entry, monkeypatch, [(values, (-7, 2**32 - 1)), (None, (-128, 255))],
                            types=dict(epoch="i8", slot_base="u32"))


@needs_toolchain
@pytest.mark.skipif("triton" not in runnable_backends("cpu"), reason="TRITON_INTERPRET is not set")
def test_native_refuses_wrong_per_call_integers(monkeypatch, gen):
    entry = _sharded_binding(monkeypatch, gen)
    _, native, _ = _both_launchers(entry, monkeypatch, dict(slot_base="u32"))
    args, values, _ = entry.calls[0]
    with pytest.raises(TypeError, match=r"then 4 floats, then 2 integers; got"):
        native(args, values, (6,))
    with pytest.raises(TypeError, match=r"then 4 floats, then 2 integers; got"):
        native(args, values, (6, 8, 9))
    with pytest.raises(TypeError, match=r"argument \d+ \(per-call integer 0\) is not an integer"):
        native(args, values, (6.5, 8))
    with pytest.raises(TypeError, match=r"argument \d+ \(per-call integer 1\) is not an integer"):
        native(args, values, (6, "8"))
    with pytest.raises(ValueError, match=r"per-call integer 0 .* does not fit i32"):
        native(args, values, (INT32_MAX + 1, 8))
    with pytest.raises(ValueError, match=r"per-call integer 1 .* does not fit u32"):
        native(args, values, (6, -1))
    # The extension itself: a launcher with per-call integers takes every float before them.
    via, tensors = native.state["fast"].native, (*args, *entry.kw["scratch"](torch.device("cpu")))
    for short in (tensors, (*tensors, 6, 8), (*tensors, *values)):
        with pytest.raises(TypeError, match=r"then 4 floats, then 2 integers; got"):
            via(*short)


def test_a_per_call_integer_compiled_in_is_refused():
    """A per-call integer the kernel was specialised on (not a parameter of the binary) cannot
    change per call: the native launcher is refused, with the reason."""
    params = [("x_ptr", "*fp32"), ("n", "i32"), *native_launch.SCRATCH]
    with pytest.raises(native_launch.NativeUnavailable, match="per-call integer epoch"):
        native_launch.describe(params, {"x_ptr": 0}, {"n": 3, "epoch": 1}, {}, ("epoch",))


@pytest.mark.gpu
@needs_toolchain
def test_native_sampler_equals_triton_sampler(monkeypatch):
    """The scan and select launched natively (each call's top_k, seed and offset words as
    per-call integers) draw the ids and logprobs Triton's launcher draws, call after call."""
    import dataclasses

    from anysoftmax.backends._triton_common import sampling as triton_sampling
    from anysoftmax.sampling.spec import SamplingSpec

    if native_launch.unavailable() is not None:
        pytest.fail(f"the native launcher does not build on this GPU host: {native_launch.unavailable()}")
    x = torch.randn(4, 32000, device="cuda") * 3
    base = triton_sampling.plan_for(4, 32000, x.device)
    got = {}
    for grid, which in enumerate(("triton", "native")):
        monkeypatch.setattr(native_launch, "LAUNCHER", which)
        made = _capture(triton_sampling, monkeypatch)
        plan = dataclasses.replace(base, grid=base.grid - grid)  # (bound anew for each launcher)
        got[which] = [triton_sampling.sample(SamplingSpec.from_request("sample", x, temperature=0.8, top_k=k, top_p=0.9,
                                                                       seed=seed, offset=offset), x, True, plan=plan)
                      for k, seed, offset in ((50, 7, 0), (1, 2**40 + 3, 2**33), (0, 2**63 - 1, 5), (40, 7, 1))]
        for entry in made:
            if not entry.calls:  # (bound for a path this plan did not take)
                continue
            fast = entry.launch.state["fast"]
            assert fast is not None and (fast.native is not None) == (which == "native"), \
                entry.launch.state["native_reason"]
    torch.cuda.synchronize()
    for a, b in zip(got["triton"], got["native"]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
@needs_toolchain
def test_native_sharded_kernel_launches_natively(monkeypatch):
    """The one-read sharded kernel on one rank (no peer to wait on): each call's epoch and mailbox
    half passed natively, its results equal Triton-launched ones."""
    from anysoftmax.backends.triton import sharded

    if native_launch.unavailable() is not None:
        pytest.fail(f"the native launcher does not build on this GPU host: {native_launch.unavailable()}")
    x = torch.randn(64, 4096, device="cuda")
    got = {}
    for which in ("triton", "native"):
        monkeypatch.setattr(native_launch, "LAUNCHER", which)
        made = _capture(sharded, monkeypatch)
        run = one_rank_sharded_launcher(x, want_lse=True, slots=64)
        got[which] = [run(x, None, None, 0.5, None, epoch, (epoch & 1) * 64) for epoch in range(1, 5)]
        state = made[0].launch.state  # (the cooperative launch's; a refused one would bind its fallback)
        assert (state["fast"].native is not None) == (which == "native"), state["native_reason"]
    torch.cuda.synchronize()
    for (y0, l0), (y1, l1) in zip(got["triton"], got["native"]):
        assert torch.equal(y0, y1) and torch.equal(l0, l1)
    torch.testing.assert_close(got["native"][-1][0], torch.softmax(x.double() * 0.5, 1).float())
