"""GPU accelerators: ``cuda`` (NVIDIA CUDA, and AMD ROCm through torch.cuda) and
Apple ``mps``. Both answer to the alias ``gpu``, which picks whichever is available.

Probing never initialises CUDA: the CUDA runtime's device query (``cuInit``) poisons
``fork()``, so a process that merely listed accelerators could no longer start
CUDA data-loader workers. Device counts come from NVML (AMD SMI on ROCm) instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.markers import hookimpl
from accel.plugins._gpu_training import CudaTrainingHooks, MpsTrainingHooks
from accel.types import AcceleratorSpec, Availability

if TYPE_CHECKING:
    import torch


def cuda_device_count_without_init() -> int | None:
    """Visible CUDA/ROCm devices, without initialising CUDA; ``None`` when unknown.

    Unknown means torch has CUDA support but the management library (NVML or AMD
    SMI) cannot be loaded, which in practice means there is no driver.
    """
    import torch

    if not _cuda_built():
        return 0
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return torch.cuda.device_count()  # already initialised: asking is free
    if torch.version.hip:
        counter = getattr(torch.cuda, "_device_count_amdsmi", None)
    else:
        counter = getattr(torch.cuda, "_device_count_nvml", None)
    if counter is None:
        return None
    count = counter()
    return None if count < 0 else int(count)


def _cuda_built() -> bool:
    import torch

    return bool(torch.backends.cuda.is_built()) or bool(torch.version.hip)  # type: ignore[no-untyped-call]


class CudaPlugin(CudaTrainingHooks):
    """NVIDIA GPUs through CUDA, AMD GPUs through ROCm (both via ``torch.cuda``)."""

    @hookimpl
    def register_accelerators(self) -> list[AcceleratorSpec]:
        return [
            AcceleratorSpec(
                "cuda", aliases=("gpu",), priority=100, description="NVIDIA CUDA / AMD ROCm GPUs"
            )
        ]

    @hookimpl
    def is_available(self) -> Availability:
        import torch

        if not _cuda_built():
            return Availability(
                False,
                reason=f"this torch build ({torch.__version__}) has no CUDA or ROCm support",
                remedy="install a CUDA or ROCm build of torch (see pytorch.org)",
            )
        count = cuda_device_count_without_init()
        if count is None:
            return Availability(
                False,
                reason="no GPU driver found (NVML / AMD SMI could not be loaded)",
                remedy="install the NVIDIA or AMD GPU driver",
            )
        if count == 0:
            return Availability(
                False,
                reason="no visible GPU (none found, or CUDA_VISIBLE_DEVICES hides them)",
                remedy="check nvidia-smi / rocm-smi and CUDA_VISIBLE_DEVICES",
            )
        return Availability(True)

    @hookimpl
    def device_count(self) -> int:
        return cuda_device_count_without_init() or 0

    @hookimpl
    def get_device(self, index: int | None) -> torch.device:
        import torch

        return torch.device("cuda", 0 if index is None else index)

    @hookimpl
    def distributed_backend(self) -> str:
        return "nccl"  # RCCL answers to the same name on ROCm


class MpsPlugin(MpsTrainingHooks):
    """Apple-silicon GPUs through Metal Performance Shaders."""

    @hookimpl
    def register_accelerators(self) -> list[AcceleratorSpec]:
        return [
            AcceleratorSpec("mps", aliases=("gpu",), priority=50, description="Apple Metal GPUs")
        ]

    @hookimpl
    def is_available(self) -> Availability:
        import torch

        if not torch.backends.mps.is_built():
            return Availability(
                False,
                reason="this torch build has no MPS support (MPS exists only on macOS)",
                remedy="use torch on macOS 12.3+ with Apple silicon",
            )
        if not torch.backends.mps.is_available():
            return Availability(
                False,
                reason="MPS is built but this Mac has no usable Metal device",
                remedy="use macOS 12.3+ on Apple silicon",
            )
        return Availability(True)

    @hookimpl
    def device_count(self) -> int:
        return 1

    @hookimpl
    def get_device(self) -> torch.device:
        import torch

        return torch.device("mps", 0)

    @hookimpl
    def distributed_backend(self) -> str:
        return "gloo"
