"""A vendor's accel plugin as it would ship: accel hooks only, not a line of Lightning.

The integration tests drive Lightning with it to show that a third-party accel
plugin reaches Lightning users through accel.integrations.lightning alone.
"""

from __future__ import annotations

from typing import ClassVar

import torch

import accel
from helpers.fakes import Available, RecordsMoves


class VendorPlugin(Available, RecordsMoves):
    """Accelerator ``vendornpu``: two devices (backed by host memory), moves and step
    boundaries recorded, memory statistics of its own."""

    NAME = "vendornpu"
    MEMORY: ClassVar[dict[str, int | None]] = {
        "allocated_bytes": 1024,
        "peak_allocated_bytes": 4096,
        "total_bytes": None,  # this runtime cannot say
    }

    def __init__(self, *, count: int = 2) -> None:
        self.count = count
        self.calls: list[str] = []

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec(self.NAME, aliases=("vnpu",), priority=10)]

    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        return torch.device("cpu")

    @accel.hookimpl
    def mark_step(self) -> None:
        self.calls.append("mark_step")

    @accel.hookimpl
    def memory_stats(self) -> dict[str, int | None]:
        return dict(self.MEMORY)


class IndexedVendorPlugin(VendorPlugin):
    """Accelerator ``vendornpu`` whose devices carry their index (``cpu:0``, ``cpu:1``),
    as a real vendor's do, so that a worker put on the wrong one shows."""

    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        return torch.device("cpu", index or 0)


class InstalledVendorPlugin(VendorPlugin):
    """``vendornpu`` as an ``accel`` entry point builds it (a class, no arguments), for
    processes the tests do not start themselves (Ray's workers): every instance is kept
    in :attr:`INSTANCES`, so that the process can report the calls its plugin saw."""

    INSTANCES: ClassVar[list[VendorPlugin]] = []

    def __init__(self) -> None:
        super().__init__()
        InstalledVendorPlugin.INSTANCES.append(self)


class OwnBackendVendorPlugin(VendorPlugin):
    """Accelerator ``vendorccl``, whose plugin declares a process-group backend of its
    own (``vendorccl``) that neither torch nor Ray knows."""

    NAME = "vendorccl"

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec(self.NAME, priority=10)]

    @accel.hookimpl
    def distributed_backend(self) -> str:
        return "vendorccl"
