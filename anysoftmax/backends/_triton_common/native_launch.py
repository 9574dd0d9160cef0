"""The native launcher: Triton-compiled CUDA kernels launched by one C++ call (`native_launch.cc` through TVM-FFI;
$ANYSOFTMAX_LAUNCHER in docs/environment.md). Where it cannot serve, the reason is kept (`unavailable()`, the bound
launcher's `state["native_reason"]`)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import struct
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path

from ... import config

ENV_LAUNCHER = "ANYSOFTMAX_LAUNCHER"
LAUNCHERS = ("triton", "native", "auto")
# What `auto` means: the launcher measured faster on an NVIDIA H100 host (docs/speed.md).
AUTO = "native"

# DLPack's device type of CUDA tensors (kDLCUDA).
DL_CUDA = 2
# Parameter kinds of `native_launch.cc`'s kernel description.
CONSTANT, POINTER, FLOAT32, FLOAT64, INT, UINT = 0, 1, 2, 3, 4, 5
# The two pointers Triton's CUDA launcher appends to every kernel's parameters (null: no scratch).
SCRATCH = (("global_scratch", "*i8"), ("profile_scratch", "*i8"))
# Triton's parameter types (its launcher's `ty_to_cpp`) -> struct formats; floats come per call
# (fp16/bf16 values would need their own packing: such kernels are refused).
INT_FORMATS = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H",
               "u32": "I", "u64": "Q"}
FLOAT_KINDS = {"fp32": (FLOAT32, "f"), "f32": (FLOAT32, "f"), "fp64": (FLOAT64, "d")}
# Shared memory above this needs a launch attribute Triton 3.9 sets and this launcher does not.
MAX_SHARED = 228 * 1024


class NativeUnavailable(RuntimeError):
    """The native launcher cannot be used here (the message says why)."""


def choose(value: str | None) -> str:
    """The launcher $ANYSOFTMAX_LAUNCHER names (unset or "auto": `AUTO`), else ValueError."""
    v = (value or "").strip().lower() or "auto"
    if v not in LAUNCHERS:
        raise ValueError(f"${ENV_LAUNCHER}={value!r}: expected one of {', '.join(LAUNCHERS)}")
    return AUTO if v == "auto" else v


# Read at import, like ANYSOFTMAX_FAST_LAUNCH, by launchers when bound.
LAUNCHER = choose(os.environ.get(ENV_LAUNCHER))
# The user named `native` (a failure to provide it is then warned about, not only recorded).
EXPLICIT = os.environ.get(ENV_LAUNCHER, "").strip().lower() == "native"

_lock = threading.Lock()
_loaded: dict = {}


def module():
    """The extension, built and loaded once per process, or NativeUnavailable (the same reason each call)."""
    with _lock:
        if not _loaded:
            try:
                _loaded["module"] = _load()
            except Exception as exc:  # reported as the reason, never raised from a launch
                _loaded["reason"] = f"{type(exc).__name__}: {exc}"
    if "reason" in _loaded:
        raise NativeUnavailable(_loaded["reason"])
    return _loaded["module"]


def unavailable() -> str | None:
    """None when the extension builds and loads here, else why not."""
    try:
        module()
    except NativeUnavailable as exc:
        return str(exc)
    return None


def build_command(source: Path, output: Path) -> list[str]:
    """The command building `source` into the library `output` against TVM-FFI."""
    try:
        import tvm_ffi  # noqa: F401
        from tvm_ffi import libinfo
    except ImportError as exc:
        raise NativeUnavailable(f"apache-tvm-ffi does not import ({exc}; {config.install_hint('cute')})") from None
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise NativeUnavailable("no C++ compiler ($CXX, c++, g++ or clang++)")
    # cuda.h as Triton ships it for its own launchers (no CUDA toolkit needed).
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        raise NativeUnavailable("triton is not installed")
    cuda = Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia" / "include"
    if not (cuda / "cuda.h").is_file():
        raise NativeUnavailable(f"no cuda.h in {cuda}")
    lib = Path(libinfo.find_libtvm_ffi()).parent
    includes = [libinfo.find_include_path(), libinfo.find_dlpack_include_path(), str(cuda)]
    return [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", *(f"-I{i}" for i in includes), str(source),
            f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}", "-ldl", "-o", str(output)]


def _load():
    source = Path(str(resources.files(__package__) / "native_launch.cc"))
    probe = build_command(source, Path("OUT"))  # (says what is missing: TVM-FFI, a compiler)
    import tvm_ffi

    # Keyed by the source and the whole command (compiler, TVM-FFI's version and paths).
    key = hashlib.sha256(source.read_bytes() + "\0".join([*probe, tvm_ffi.__version__]).encode()).hexdigest()[:16]
    folder = config.cache_dir("native")
    path = folder / f"native_launch_{key}.so"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        # Built beside its final name, then renamed: processes building at once never load a
        # half-written library.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        try:
            proc = subprocess.run(build_command(source, Path(tmp)), capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise NativeUnavailable(f"building {source.name} failed:\n{proc.stderr[-3000:]}")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return tvm_ffi.load_module(str(path))


def kernel_params(compiled) -> list[tuple[str, str]]:
    """(name, Triton type) of the compiled kernel binary's parameters: the signature's but "constexpr"
    (constexprs and integers specialised to a constant are compiled in), then Triton's scratch."""
    return [(n, t) for n, t in compiled.src.signature.items() if t != "constexpr"] + list(SCRATCH)


def refusal(compiled) -> str | None:
    """Why `compiled` must keep Triton's launcher (scratch, clusters, ...), or None."""
    md = compiled.metadata
    if md.global_scratch_size or md.profile_scratch_size:
        return f"{md.name} needs global/profile scratch"
    if getattr(md, "num_ctas", 1) != 1:
        return f"{md.name} launches clusters (num_ctas {md.num_ctas})"
    if md.shared > MAX_SHARED:
        return f"{md.name} uses {md.shared} bytes of shared memory"
    if getattr(md, "instrumentation_mode", "") not in ("", None):
        return f"{md.name} is instrumented ({md.instrumentation_mode})"
    odd = [f"{n}: {t}" for n, t in compiled.src.signature.items()
           if not isinstance(t, str) or t.startswith(("tensordesc", "nvTmaDesc"))]
    return f"{md.name} takes {', '.join(odd)}" if odd else None


def _bits(fmt: str, value) -> int:
    # The value as the kernel reads it, in the low bytes of a little-endian 64-bit slot.
    return int.from_bytes(struct.pack("<" + fmt, value).ljust(8, b"\0"), "little", signed=True)


def describe(params: list, pointers: dict, ints: dict, floats: dict,
             per_call: tuple = ()) -> list[tuple[int, int, int]]:
    """(kind, index, bits) of each parameter (`kernel_params`), found by name: `pointers` name ->
    tensor argument index, `per_call` the integers each call passes (in order), `ints` name ->
    value of the others, `floats` name -> (float argument index, default). NativeUnavailable for a
    parameter found nowhere or of a type not handled, or a per-call integer compiled in."""
    taken = {name for name, _ in params}
    fixed = [name for name in per_call if name not in taken]
    if fixed:
        raise NativeUnavailable(f"per-call integer {', '.join(fixed)} is compiled into the kernel as a constant")
    out = []
    for name, ty in params:
        if (name, ty) in SCRATCH:
            out.append((CONSTANT, 0, 0))
        elif ty.startswith("*") and name in pointers:
            out.append((POINTER, pointers[name], 0))
        elif ty in INT_FORMATS and name in per_call:
            # (the call's value packed in C++ into this many bytes, as Triton's launcher does)
            out.append((UINT if ty.startswith("u") else INT, per_call.index(name),
                        struct.calcsize(INT_FORMATS[ty])))
        elif ty in INT_FORMATS and name in ints:
            out.append((CONSTANT, 0, _bits(INT_FORMATS[ty], ints[name])))
        elif ty in FLOAT_KINDS and name in floats:
            kind, fmt = FLOAT_KINDS[ty]
            index, default = floats[name]
            out.append((kind, index, _bits(fmt, default)))
        else:
            raise NativeUnavailable(f"parameter {name} ({ty}) is not passed as a pointer, integer or fp32/fp64 value")
    return out


def make(compiled_kernels: list, grid: int, device: int, pointers: dict, ints: dict, floats: dict,
         used: list, run: bool = True, device_type: int = DL_CUDA, per_call: tuple = ()):
    """The native launcher of one bound request, launching `compiled_kernels` in turn on `grid`
    programs: `f(*tensors)`, `f(*tensors, *floats)`, or with `per_call` integer names
    `f(*tensors, *floats, *ints)` (each fitting the type compiled for); `used[i]`: tensor argument
    i is read. `run=False` returns the packed parameters without launching (tests, no GPU).
    NativeUnavailable when the extension or a kernel cannot be used."""
    mod = module()
    spec = []
    for k in compiled_kernels:
        reason = refusal(k)
        if reason is not None:
            raise NativeUnavailable(reason)
        described = describe(kernel_params(k), pointers, ints, floats, tuple(per_call))
        md = k.metadata
        # (Triton launches 32 * num_warps threads per program: warps of 32 on NVIDIA GPUs)
        spec += [int(k.function) if run else 0, grid, 32 * md.num_warps, md.shared,
                 int(bool(md.launch_cooperative_grid)), int(bool(md.launch_pdl)), len(described)]
        spec += [v for triple in described for v in triple]
    return mod.make_launcher(device_type, device, [int(bool(u)) for u in used], len(floats), len(per_call), spec,
                             run)


_stream_checked: dict = {}


def follows_torch_stream(tensor) -> bool:
    """Whether the extension sees torch's current stream (checked once per device type)."""
    import torch

    dev = tensor.device
    if dev.type not in _stream_checked:
        try:
            side = torch.cuda.Stream(dev)
            with torch.cuda.stream(side):
                _stream_checked[dev.type] = module().env_stream(tensor) == side.cuda_stream
        except Exception:
            _stream_checked[dev.type] = False
    return _stream_checked[dev.type]
