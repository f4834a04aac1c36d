"""GPU accelerators: ``cuda`` (NVIDIA CUDA, and AMD ROCm through torch.cuda) and
Apple ``mps``. Both answer to the alias ``gpu``, which picks whichever is available.

Probing never initialises CUDA: the CUDA runtime's device query (``cuInit``) poisons
``fork()``, so a process that merely listed accelerators could no longer start
CUDA data-loader workers. Device counts come from NVML (AMD SMI on ROCm) instead,
and where those cannot count, from torch in a child process.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Final

import torch

from accel.markers import hookimpl
from accel.plugins._gpu_training import CudaTrainingHooks, MpsTrainingHooks
from accel.types import AcceleratorSpec, Availability

if TYPE_CHECKING:
    import torch

# CudaPlugin and MpsPlugin are public in accel.plugins; the device count without
# initialising CUDA is the plugin's own business.
__all__: list[str] = []


def cuda_device_count_without_init() -> int | None:
    """Visible CUDA/ROCm devices, without initialising CUDA; ``None`` when unknown.

    NVML (AMD SMI on ROCm) answers first, as in :func:`torch.cuda.device_count`.
    Where it cannot (MIG instances named in ``CUDA_VISIBLE_DEVICES``, ROCm without the
    ``amdsmi`` module, a container without NVML), torch falls back to the CUDA
    runtime's own count, which initialises CUDA; accel asks torch for that count in
    a fresh child process instead, so this process stays fork-safe. Unknown means no
    GPU driver was found for that fallback.
    """

    if not _cuda_built():
        return 0
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return torch.cuda.device_count()  # already initialised: asking is free
    if torch.version.hip:
        counter = getattr(torch.cuda, "_device_count_amdsmi", None)
    else:
        counter = getattr(torch.cuda, "_device_count_nvml", None)
    count = -1 if counter is None else int(counter())
    if count >= 0:
        return count
    if not _gpu_driver_present(bool(torch.version.hip)):
        return None
    return _count_in_child_process()


def _gpu_driver_present(rocm: bool) -> bool:
    """A GPU driver is installed: the CUDA driver library loads (loading it does not
    initialise CUDA), or on ROCm the kernel driver's device node exists."""
    if rocm:
        return os.path.exists("/dev/kfd")
    library = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


_child_counts: dict[tuple[str | None, ...], int | None] = {}
_CHILD_CODE: Final = "import torch; print(torch.cuda.device_count())"
_VISIBILITY: Final = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _count_in_child_process() -> int | None:
    """``torch.cuda.device_count()`` in a fresh interpreter (spawned, not forked), which
    may initialise CUDA there; ``None`` if the child fails. Cached per visibility
    setting: the count cannot change otherwise without a new driver."""
    key = tuple(os.environ.get(name) for name in _VISIBILITY)
    if key not in _child_counts:
        try:
            result = subprocess.run(
                [sys.executable, "-c", _CHILD_CODE],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            _child_counts[key] = int(result.stdout.strip().splitlines()[-1])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            _child_counts[key] = None
    return _child_counts[key]


def _cuda_built() -> bool:
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
                reason="no GPU driver found (NVML / AMD SMI could not count the GPUs, "
                "and the CUDA driver library or ROCm's /dev/kfd is missing)",
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
        return torch.device("mps", 0)

    @hookimpl
    def distributed_backend(self) -> str:
        # No torch.distributed backend carries MPS tensors (gloo has CPU and CUDA
        # ones only): the group is gloo for CPU tensors, and accel.distributed refuses
        # to synchronise a model on MPS rather than fail inside a collective.
        return "cpu:gloo"
