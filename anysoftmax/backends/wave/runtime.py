"""Running a compiled kernel (.vmfb) on torch tensors with `iree.runtime` alone.

Each torch GPU gets one IREE HAL device (driver "hip" on AMD, "cuda" on NVIDIA, found by the
GPU's UUID); each (kernel, device) pair one loaded module. The entry point is Wave's synchronous
`isolated_benchmark(x, y) -> y`, which returns once the kernel has finished.

Two ways to hand tensors to IREE (`ANYSOFTMAX_WAVE_TRANSFER`):

* ``dlpack`` (default): the torch buffers themselves are imported through DLPack, no copy.
  The torch stream is synchronised first (IREE runs on its own stream). IREE writes into `y`
  in place (seen on an H200 for every tested case); were it to return another buffer, that
  would be copied into `y` on the device.
* ``host``: copies through host memory (x and y up, the result down). About 100 times slower;
  kept as the fallback that needs nothing but IREE's buffer copies.

Rows are launched at most `MAX_ROWS_PER_LAUNCH` at a time (grid y is one workgroup per row),
in chunks whose starts stay 64-byte aligned.
The driver "local-sync" with CPU tensors exists for the runtime's own tests (a stand-in module).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from dataclasses import dataclass

import torch

from ...core.cache import OnceCache
from . import hiplib
from .kernel import MAX_ROWS_PER_LAUNCH

ENV_TRANSFER = "ANYSOFTMAX_WAVE_TRANSFER"
TRANSFERS = ("dlpack", "host")
ENTRY_POINT = "isolated_benchmark"
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


@dataclass
class LoadedKernel:
    """A .vmfb loaded on one device, ready to launch (thread-safe through `lock`)."""

    device: _Device
    context: object  # iree.runtime.VmContext
    function: object  # iree.runtime.VmFunction
    lock: threading.Lock


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
        # Match torch's device to IREE's by UUID (IREE's path is 'GPU-<uuid>'); fall back to
        # the ordinal when the UUIDs are not reported.
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
    return _Device(driver_name, torch_device, rt.VmInstance(), driver.create_device(info))


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
        return LoadedKernel(dev, context, function, threading.Lock())

    return _modules.get((cache_key, driver_name, str(dev.torch_device)), build)


def _element_type(dtype: torch.dtype):
    import iree.runtime as rt

    return {torch.float32: rt.HalElementType.FLOAT_32, torch.float16: rt.HalElementType.FLOAT_16,
            torch.bfloat16: rt.HalElementType.BFLOAT_16}[dtype]


def _host_array(t: torch.Tensor):
    # numpy has no bfloat16: hand IREE the raw 16-bit pattern (the element type says bf16).
    t = t.detach().to("cpu").contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def _upload(dev: _Device, t: torch.Tensor):
    import iree.runtime as rt

    return dev.hal.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
        device=dev.hal, buffer=_host_array(t), element_type=_element_type(t.dtype))


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


def _sync_torch(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        torch.cuda.current_stream(t.device).synchronize()


def _invoke(kernel: LoadedKernel, x_view, y_view):
    import iree.runtime as rt

    args = rt.VmVariantList(2)
    args.push_ref(x_view)
    args.push_ref(y_view)
    rets = rt.VmVariantList(1)
    with kernel.lock:
        kernel.context.invoke(kernel.function, args, rets)
    return rets.get_variant(0).deref(rt.HalBufferView)


def _launch_dlpack(kernel: LoadedKernel, x: torch.Tensor, y: torch.Tensor) -> str:
    dev = kernel.device
    _sync_torch(x)  # x written and y allocated on torch's stream; IREE runs on its own
    x_view = dev.hal.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(x))
    y_view = dev.hal.from_dlpack_capsule(torch.utils.dlpack.to_dlpack(y))
    result_view = _invoke(kernel, x_view, y_view)
    index = y.device.index if y.device.type == "cuda" else 0
    result = torch.from_dlpack(dev.hal.create_dlpack_capsule(result_view, _DLPACK_CODE[dev.driver], index))
    if result.data_ptr() == y.data_ptr():
        return "in-place"
    y.copy_(result)
    _sync_torch(y)  # the copy must finish before IREE's buffer is released with `result`
    return "copied"


def _launch_host(kernel: LoadedKernel, x: torch.Tensor, y: torch.Tensor) -> str:
    dev = kernel.device
    result_view = _invoke(kernel, _upload(dev, x), _upload(dev, y))
    y.copy_(_download(dev, result_view, y))
    return "host"


def rows_per_launch(n: int, itemsizes: tuple[int, ...]) -> int:
    """Rows per launch: at most `MAX_ROWS_PER_LAUNCH`, and a multiple of the row count that
    keeps every chunk's start on the `ALIGNMENT` IREE requires of imported buffers."""
    step = 1
    for size in itemsizes:
        step = math.lcm(step, ALIGNMENT // math.gcd(ALIGNMENT, n * size))
    return max(step, MAX_ROWS_PER_LAUNCH // step * step)


def launch(kernel: LoadedKernel, x: torch.Tensor, y: torch.Tensor, transfer: str | None = None) -> str:
    """Run the kernel on contiguous 2-D `x` (M, N), writing contiguous 2-D `y` (M, N).

    Returns how the result reached `y`: 'in-place', 'copied' (dlpack) or 'host'.
    """
    transfer = transfer or transfer_mode()
    run = _launch_dlpack if transfer == "dlpack" else _launch_host
    dest = y
    if transfer == "dlpack":
        # IREE imports only buffers aligned to ALIGNMENT bytes (torch's own allocations are);
        # a view into the middle of a tensor is copied once.
        if x.data_ptr() % ALIGNMENT:
            x = x.clone()
        if y.data_ptr() % ALIGNMENT:
            y = torch.empty_like(y)
    how = "in-place"
    chunk = rows_per_launch(x.shape[1], (x.element_size(), y.element_size()))
    for start in range(0, x.shape[0], chunk):
        how = run(kernel, x[start:start + chunk], y[start:start + chunk])
    if dest is not y:
        dest.copy_(y)
    return how
