"""Property sets of GPUs the occupancy tests and the ahead-of-time compile targets model without
having them (values as Triton's driver.active.utils.get_device_properties and
torch.cuda.get_device_properties report them)."""

from anysoftmax.backends.triton.occupancy import CUDA_RESERVED_SHARED, DeviceProps

H100_SXM = DeviceProps("NVIDIA H100 80GB HBM3", 132, 65536, 232448, 32, 2048, shared_mem_per_sm=233472,
                       reserved_shared_per_program=CUDA_RESERVED_SHARED)
A100_SXM = DeviceProps("NVIDIA A100-SXM4-80GB", 108, 65536, 166912, 32, 2048, shared_mem_per_sm=167936,
                       reserved_shared_per_program=CUDA_RESERVED_SHARED)
MI300X = DeviceProps("AMD Instinct MI300X (gfx942)", 304, 65536, 65536, 64, 2048, is_hip=True, is_cdna=True,
                     shared_mem_per_sm=65536)
MI250X = DeviceProps("AMD Instinct MI250X (gfx90a, one GCD)", 110, 65536, 65536, 64, 2048, is_hip=True, is_cdna=True,
                     shared_mem_per_sm=65536)
