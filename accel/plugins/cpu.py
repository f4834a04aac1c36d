"""The ``cpu`` accelerator: always available, one device, the gloo backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.markers import hookimpl
from accel.types import AcceleratorSpec, Availability

if TYPE_CHECKING:
    import torch


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
        import torch

        return torch.device("cpu")

    @hookimpl
    def distributed_backend(self) -> str:
        return "gloo"
