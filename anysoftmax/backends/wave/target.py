"""Where a Wave kernel runs: the compile target (chip, wave size, IREE flags) and its detection.
AMD: `device="hip"`, the chip read from the GPU. NVIDIA, opt-in (``ANYSOFTMAX_WAVE_ON_CUDA=1``):
rewritten for CUDA (`cuda_mlir`) and compiled for sm_80, the newest CUDA target IREE 3.9 accepts;
the driver JIT-compiles that PTX on Hopper.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_ON_CUDA = "ANYSOFTMAX_WAVE_ON_CUDA"
CUDA_CHIP = "sm_80"

# Flags Wave itself passes to iree-compile (wave_lang/kernel/wave/utils/compile_utils.py).
_COMMON_FLAGS = (
    "--iree-vm-bytecode-module-strip-source-map=true",
    "--iree-opt-strip-assertions=true",
    "--iree-vm-target-truncate-unsupported-floats",
)


@dataclass(frozen=True)
class Target:
    """A compile target: `device` is IREE's HAL device and runtime driver ("hip" or "cuda")."""

    device: str
    chip: str

    @property
    def name(self) -> str:
        """'hip-gfx942', 'cuda-sm_80': the folder name in the disk cache."""
        return f"{self.device}-{self.chip}"

    @property
    def threads_per_wave(self) -> int:
        # CDNA (gfx9xx) runs 64-wide wavefronts; RDNA (gfx10-12) is compiled for wave32, as
        # Wave's own tests do (wave64 on RDNA4 emits permlane32.swap, which RDNA4 lacks).
        # NVIDIA warps are 32 wide.
        if self.device == "hip" and self.chip.startswith("gfx9"):
            return 64
        return 32

    def compile_flags(self) -> list[str]:
        """iree-compile flags for this target."""
        return [*_COMMON_FLAGS, f"--iree-hal-target-device={self.device}", f"--iree-{self.device}-target={self.chip}"]


def parse_target(text: str) -> Target:
    """'gfx942' / 'hip-gfx942' -> HIP target; 'sm_80' / 'cuda-sm_80' -> CUDA target."""
    chip = text.strip().removeprefix("hip-").removeprefix("cuda-").split(":")[0]
    if chip.startswith("gfx"):
        return Target("hip", chip)
    if chip.startswith("sm_"):
        if chip != CUDA_CHIP:
            raise ValueError(
                f"CUDA target {chip!r} is not supported: the Wave path compiles for {CUDA_CHIP} "
                f"(IREE 3.9 knows CUDA targets up to sm_86; newer GPUs run the sm_80 PTX)")
        return Target("cuda", chip)
    raise ValueError(f"unknown Wave target {text!r}; expected an AMD chip such as 'gfx942' or '{CUDA_CHIP}'")


def on_cuda_requested() -> bool:
    """True when the NVIDIA validation path is switched on (ANYSOFTMAX_WAVE_ON_CUDA=1)."""
    return os.environ.get(ENV_ON_CUDA, "").strip().lower() in ("1", "true", "yes", "on")


def detect_target(index: int | None = None) -> Target | str:
    """The target of torch GPU `index` (default: the current one), or the reason there is none."""
    import torch

    if not torch.cuda.is_available():
        return "no AMD GPU (torch sees no GPU)"
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip is not None:
        arch = getattr(props, "gcnArchName", "") or ""
        if not arch.startswith("gfx"):
            return f"could not read the AMD GPU architecture (gcnArchName={arch!r})"
        return Target("hip", arch.split(":")[0])
    if not on_cuda_requested():
        return (f"no AMD GPU and {ENV_ON_CUDA} is not set (running Wave kernels on NVIDIA "
                f"through IREE's CUDA path is an opt-in validation mode)")
    if (props.major, props.minor) < (8, 0):
        return f"{props.name} is sm_{props.major}{props.minor}; the Wave CUDA path needs sm_80 or newer"
    return Target("cuda", CUDA_CHIP)
