"""The training-step hooks of the GPU plugins (``cuda`` and ``mps``).

Seeding needs no hook of theirs: the fallback's ``torch.manual_seed`` seeds every
CUDA and MPS device too (queued until CUDA starts, so it never initialises it).

Kept apart from the probing code in :mod:`accel.plugins.gpu`: these run only once
a training loop uses the device, so unlike probing they may initialise CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from accel.markers import hookimpl
from accel.training.device_loader import PrefetchingLoader
from accel.training.nested import map_nested
from accel.training.precision import HALVES, autocast_to
from accel.types import MemoryStats

if TYPE_CHECKING:
    import torch

    from accel.types import MemoryStats

__all__ = ["CudaTrainingHooks", "MpsTrainingHooks", "pin_batch"]


class CudaTrainingHooks:
    """Synchronisation, precision, memory and prefetching through ``torch.cuda``."""

    @hookimpl
    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    @hookimpl
    def autocast(
        self, accelerator: str, device: torch.device, dtype: torch.dtype | None
    ) -> AbstractContextManager[Any]:
        bf16 = bool(torch.cuda.is_bf16_supported())
        return autocast_to(
            accelerator,
            device,
            dtype,
            default=torch.bfloat16 if bf16 else torch.float16,
            supported=(torch.bfloat16, torch.float16) if bf16 else (torch.float16,),
            why="" if bf16 else " (this GPU has no bfloat16: compute capability < 8.0)",
        )

    @hookimpl
    def memory_stats(self, device: torch.device) -> MemoryStats:
        return MemoryStats(
            allocated_bytes=int(torch.cuda.memory_allocated(device)),
            peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
            total_bytes=int(torch.cuda.get_device_properties(device).total_memory),
        )

    @hookimpl
    def device_loader(self, loader: Iterable[Any], move: Callable[[Any], Any]) -> Iterable[Any]:
        return PrefetchingLoader(loader, move, pin_batch)


class MpsTrainingHooks:
    """Synchronisation, precision and memory through ``torch.mps``."""

    @hookimpl
    def synchronize(self) -> None:
        torch.mps.synchronize()

    @hookimpl
    def autocast(
        self, accelerator: str, device: torch.device, dtype: torch.dtype | None
    ) -> AbstractContextManager[Any]:
        # bfloat16 needs macOS 14; torch_autocast turns torch's refusal into an error.
        return autocast_to(accelerator, device, dtype, default=torch.float16, supported=HALVES)

    @hookimpl
    def memory_stats(self) -> MemoryStats:
        return MemoryStats(
            allocated_bytes=int(torch.mps.current_allocated_memory()),
            peak_allocated_bytes=None,  # torch.mps keeps no peak counter
            # Metal's recommended working-set limit: what the GPU may use of the
            # unified memory it shares with the CPU.
            total_bytes=int(torch.mps.recommended_max_memory()),
        )


def pin_batch(batch: Any) -> Any:
    """``batch`` with its CPU tensors in pinned memory (already pinned ones kept);
    containers are walked by :mod:`accel.training.nested`'s rules, as everywhere."""

    def pin(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "cpu" or tensor.is_pinned():
            return tensor
        return tensor.pin_memory()

    return map_nested(batch, pin)
