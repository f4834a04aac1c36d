"""The ``cpu`` accelerator: always available, one device, the gloo backend."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from accel.markers import hookimpl
from accel.training.batch import BatchMover
from accel.training.memory import host_memory_stats
from accel.training.precision import bfloat16_autocast
from accel.types import AcceleratorSpec, Availability

if TYPE_CHECKING:
    import torch

    from accel.types import MemoryStats

__all__: list[str] = []  # CpuPlugin is public in accel.plugins


class CpuPlugin:
    """Host CPU. The fallback every machine has, so the lowest ``"auto"`` priority."""

    @hookimpl
    def register_accelerators(self) -> list[AcceleratorSpec]:
        return [AcceleratorSpec("cpu", priority=0, description="the host CPU")]

    @hookimpl
    def is_available(self) -> Availability:
        return Availability(True)

    @hookimpl
    def device_count(self) -> int:
        # torch treats the host as one device; threads are not devices.
        return 1

    @hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")

    @hookimpl
    def distributed_backend(self) -> str:
        return "gloo"

    # The training step: the fallbacks step, seed and (not) synchronise as the CPU
    # needs, so only what differs is here.

    @hookimpl
    def autocast(
        self, accelerator: str, device: torch.device, dtype: torch.dtype | None
    ) -> AbstractContextManager[Any]:
        return bfloat16_autocast(accelerator, device, dtype)

    @hookimpl
    def memory_stats(self) -> MemoryStats:
        return host_memory_stats()

    @hookimpl
    def device_loader(
        self, loader: Iterable[Any], move: Callable[[Any], Any]
    ) -> Iterable[Any] | None:
        # A DataLoader's batches are already on the CPU: with accel's own mover there is
        # nothing to do; a plugin's batch_to_device must still see every batch (fallback).
        return loader if isinstance(move, BatchMover) else None
