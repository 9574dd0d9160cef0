"""Running a compiled kernel (.vmfb) on torch tensors with `iree.runtime` alone (docs/wave.md): one HAL device
per torch GPU, one module per (kernel, device); the driver "local-sync" with CPU tensors serves the tests."""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from ...core.cache import OnceCache
from . import hiplib
from .kernel import ENTRY_POINT, MAX_ROWS_PER_LAUNCH

ENV_TRANSFER = "ANYSOFTMAX_WAVE_TRANSFER"
# How long a call polls its fence before blocking on it ($ANYSOFTMAX_WAVE_SPIN_US; 0 blocks at once):
# a thread blocked on IREE's fence wakes some microseconds late, which a small kernel feels.
SPIN_S = float(os.environ.get("ANYSOFTMAX_WAVE_SPIN_US", "200")) * 1e-6
TRANSFERS = ("dlpack", "host")
# Byte alignment IREE requires of an imported buffer (buffer_heap.c: "must be aligned to 64").
ALIGNMENT = 64
# DLPack device type codes (dlpack.h): kDLCPU, kDLCUDA, kDLROCM.
_DLPACK_CODE = {"local-sync": 1, "cuda": 2, "hip": 10}


def transfer_mode() -> str:
    """'dlpack' or 'host' from $ANYSOFTMAX_WAVE_TRANSFER (default 'dlpack')."""
    mode = os.environ.get(ENV_TRANSFER, "").strip().lower() or "dlpack"
    if mode not in TRANSFERS:
        raise ValueError(f"${ENV_TRANSFER}={mode!r}; expected one of {', '.join(TRANSFERS)}")
    return mode


@dataclass
class _Device:
    driver: str
    torch_device: torch.device
    instance: object  # iree.runtime.VmInstance
    hal: object  # iree.runtime.HalDevice
    timeline: object  # iree.runtime.HalSemaphore: one value per call, signalled when it is done
    value: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # one call at a time per device


@dataclass
class LoadedKernel:
    """A .vmfb loaded on one device; `in_place`: whether IREE writes the outputs where they were
    passed (None until the first DLPack call)."""

    device: _Device
    context: object  # iree.runtime.VmContext
    function: object  # iree.runtime.VmFunction
    in_place: bool | None = None


_devices: OnceCache[_Device] = OnceCache(maxsize=64)
_modules: OnceCache[LoadedKernel] = OnceCache(maxsize=512)


def _create_device(driver_name: str, torch_device: torch.device) -> _Device:
    import iree.runtime as rt

    if driver_name == "hip":
        hiplib.configure()  # before the driver loads libamdhip64.so from the system path
    driver = rt.get_driver(driver_name)
    infos = driver.query_available_devices()
    if not infos:
        raise RuntimeError(f"IREE's {driver_name!r} driver sees no device")
    info = infos[0]
    if torch_device.type == "cuda":
        # Matched by UUID (IREE's path is 'GPU-<uuid>'), else by ordinal.
        index = torch_device.index if torch_device.index is not None else torch.cuda.current_device()
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        by_uuid = {str(i.get("path", "")).removeprefix("GPU-"): i for i in infos}
        info = by_uuid.get(uuid)
        if info is None:
            info = infos[min(index, len(infos) - 1)]
            warnings.warn(
                f"wave: torch GPU {index} (UUID {uuid}) matches no {driver_name!r} device by UUID "
                f"(IREE reports {sorted(by_uuid) or 'none'}); using IREE device {info.get('path', '?')!r} "
                f"by ordinal {min(index, len(infos) - 1)}", stacklevel=2)
    hal = driver.create_device(info)
    return _Device(driver_name, torch_device, rt.VmInstance(), hal, hal.create_semaphore(0))


def _device(driver_name: str, torch_device: torch.device) -> _Device:
    if torch_device.type == "cuda" and torch_device.index is None:
        torch_device = torch.device("cuda", torch.cuda.current_device())
    return _devices.get((driver_name, str(torch_device)), lambda: _create_device(driver_name, torch_device))


def load(cache_key, vmfb: bytes, driver_name: str, torch_device: torch.device) -> LoadedKernel:
    """Load `vmfb` on the IREE device for `torch_device` (once per `cache_key` and device)."""
    import iree.runtime as rt

    dev = _device(driver_name, torch_device)

    def build() -> LoadedKernel:
        module = rt.VmModule.copy_buffer(dev.instance, vmfb)
        context = rt.VmContext(dev.instance, [rt.create_hal_module(dev.instance, dev.hal), module])
        function = module.lookup_function(ENTRY_POINT)
        if function is None:
            raise RuntimeError(f"compiled Wave module has no function {ENTRY_POINT!r}")
        return LoadedKernel(dev, context, function)

    return _modules.get((cache_key, driver_name, str(dev.torch_device)), build)


# ---- one call of the entry point -------------------------------------------------------------

def _upload(dev: _Device, t: torch.Tensor):
    import iree.runtime as rt

    # numpy has no bfloat16: hand IREE the raw 16-bit pattern (the element type says bf16).
    host = t.detach().to("cpu").contiguous()
    element_type = {torch.float32: rt.HalElementType.FLOAT_32, torch.float16: rt.HalElementType.FLOAT_16,
                    torch.bfloat16: rt.HalElementType.BFLOAT_16, torch.uint8: rt.HalElementType.UINT_8}[t.dtype]
    return dev.hal.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=dev.hal,
        buffer=(host.view(torch.int16) if host.dtype == torch.bfloat16 else host).numpy(), element_type=element_type)


def _download(dev: _Device, view, like: torch.Tensor) -> torch.Tensor:
    """Copy a device buffer view into a new CPU tensor shaped and typed like `like`."""
    import iree.runtime as rt

    src = view.get_buffer()
    staging = dev.hal.allocator.allocate_buffer(
        memory_type=rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE,
        allowed_usage=rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED,
        allocation_size=src.byte_length())
    sem = dev.hal.create_semaphore(0)
    dev.hal.queue_copy(src, staging, wait_semaphores=rt.HalFence.create_at(sem, 0),
                       signal_semaphores=rt.HalFence.create_at(sem, 1))
    rt.HalFence.create_at(sem, 1).wait()
    raw = torch.int16 if like.dtype == torch.bfloat16 else like.dtype
    np_dtype = torch.empty(0, dtype=raw).numpy().dtype
    arr = staging.map().asarray(tuple(like.shape), np_dtype).copy()
    return torch.from_numpy(arr).view(like.dtype)


def _import(dev: _Device, t: torch.Tensor):
    return dev.hal.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(t))


def _export(dev: _Device, view, like: torch.Tensor) -> torch.Tensor:
    index = like.device.index if like.device.type == "cuda" else 0
    return torch.from_dlpack(dev.hal.create_dlpack_capsule(view, _DLPACK_CODE[dev.driver], index))


def _sync_torch(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        torch.cuda.current_stream(t.device).synchronize()


def wait(semaphore, value: int) -> None:
    """Return once `semaphore` has reached `value`: polled for up to `SPIN_S`, then blocked on."""
    if SPIN_S > 0:
        deadline = time.perf_counter() + SPIN_S
        while semaphore.query() < value:
            if time.perf_counter() > deadline:
                break
        else:
            return
    semaphore.wait(value)


def invoke(kernel: LoadedKernel, inputs: list, outputs: list[torch.Tensor], values: list) -> list:
    """One call of the async entry point on buffer views `inputs` + `outputs` and int32 `values`
    (in the kernel's argument order), waited for on the device's timeline; the result views."""
    import iree.runtime as rt

    dev = kernel.device
    args = rt.VmVariantList(len(inputs) + len(outputs) + len(values) + 2)
    for view in (*inputs, *outputs):
        args.push_ref(view)
    for value in values:
        args.push_int(value)
    rets = rt.VmVariantList(len(outputs))
    with dev.lock:
        dev.value += 1
        signal = rt.HalFence.create_at(dev.timeline, dev.value)
        args.push_ref(rt.HalFence(0))  # nothing to wait for: torch's stream was synchronised
        args.push_ref(signal)
        kernel.context.invoke(kernel.function, args, rets)
        wait(dev.timeline, dev.value)
    return [rets.get_variant(i).deref(rt.HalBufferView) for i in range(len(outputs))]


def _call_dlpack(kernel: LoadedKernel, inputs: list[torch.Tensor], outputs: list[torch.Tensor], values: list) -> str:
    dev = kernel.device
    results = invoke(kernel, [_import(dev, t) for t in inputs], [_import(dev, t) for t in outputs], values)
    if kernel.in_place is None:  # once per kernel: did IREE write where the outputs were passed?
        kernel.in_place = all(_export(dev, v, t).data_ptr() == t.data_ptr() for v, t in zip(results, outputs))
    if kernel.in_place:
        return "in-place"
    for view, t in zip(results, outputs):
        t.copy_(_export(dev, view, t).view(t.shape))
    _sync_torch(outputs[0])  # the copies must finish before IREE's buffers are released
    return "copied"


def _call_host(kernel: LoadedKernel, inputs: list[torch.Tensor], outputs: list[torch.Tensor], values: list) -> str:
    dev = kernel.device
    results = invoke(kernel, [_upload(dev, t) for t in inputs], [_upload(dev, t) for t in outputs], values)
    for view, t in zip(results, outputs):
        t.copy_(_download(dev, view, t))
    return "host"


# ---- a whole launch: row chunks --------------------------------------------------------------

@lru_cache(maxsize=256)
def rows_per_launch(row_bytes: tuple[int, ...]) -> int:
    """Rows per launch: at most `MAX_ROWS_PER_LAUNCH`, a multiple of what keeps every chunk's start
    `ALIGNMENT`-aligned for rows of each of `row_bytes` bytes."""
    step = 1
    for size in row_bytes:
        step = math.lcm(step, ALIGNMENT // math.gcd(ALIGNMENT, size))
    return max(step, MAX_ROWS_PER_LAUNCH // step * step)


def _aligned(t: torch.Tensor, transfer: str) -> torch.Tensor:
    # IREE imports only buffers aligned to ALIGNMENT bytes (torch's own allocations are);
    # a view into the middle of a tensor is copied once.
    return t.clone() if transfer == "dlpack" and t.data_ptr() % ALIGNMENT else t


def launch(kernel: LoadedKernel, x: torch.Tensor, y: torch.Tensor, *, operands: tuple = (),
           p_sink: torch.Tensor | None = None, values: tuple = (), with_row: bool = False,
           transfer: str | None = None) -> str:
    """Run the kernel on contiguous (M, N) `x` into contiguous `y` (and `p_sink` (M) with sinks);
    `operands`: the flat mask / sinks buffers, whole to every chunk; `values`: the scale / softcap
    bits; `with_row`: each chunk's first row appended. Returns 'in-place', 'copied' or 'host'."""
    transfer = transfer or transfer_mode()
    call = _call_dlpack if transfer == "dlpack" else _call_host
    outs = [y] + ([p_sink] if p_sink is not None else [])
    given = list(outs)
    x = _aligned(x, transfer)
    outs = [torch.empty_like(t) if transfer == "dlpack" and t.data_ptr() % ALIGNMENT else t for t in outs]
    operands = [_aligned(t, transfer) for t in operands]
    if transfer == "dlpack":
        _sync_torch(x)  # x written and the outputs allocated on torch's stream; IREE runs on its own
    row_bytes = (x.shape[1] * x.element_size(), y.shape[1] * y.element_size()) + ((4,) if p_sink is not None else ())
    chunk = rows_per_launch(row_bytes)
    if x.shape[0] <= chunk:  # one launch (the usual case): no row views to make
        how = call(kernel, [x, *operands], outs, [*values, *([0] if with_row else [])])
    else:
        for start in range(0, x.shape[0], chunk):
            stop = start + chunk
            how = call(kernel, [x[start:stop], *operands], [t[start:stop] for t in outs],
                       [*values, *([start] if with_row else [])])
    for dest, out in zip(given, outs):
        if dest is not out:
            dest.copy_(out)
    return how
