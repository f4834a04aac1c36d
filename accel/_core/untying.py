"""The device types of a registry's untying accelerators, learned as they are used.

A move that enters or leaves one of them keeps the model's ties (see
:mod:`accel._core.moving`). An accelerator's device type is known only once its
``get_device`` answered, which on XLA means importing torch_xla; so it is learned
from each handle as the handle is made (its device is resolved then anyway), never
by asking. Until a handle of an untying accelerator exists in a registry, no move of
that registry pays more than reading an empty set: CPU <-> CUDA moves walk nothing.
"""

from __future__ import annotations

import threading
from typing import final

__all__ = ["UntyingDeviceTypes"]


@final
class UntyingDeviceTypes:
    """The device types of one registry's accelerators that declare ``unties_weights``,
    among those a handle was made for. Shared by every accelerator of the registry."""

    __slots__ = ("_lock", "types")

    def __init__(self) -> None:
        #: Replaced, never changed in place: a move reads it without the lock.
        self.types: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def learn(self, device_type: str) -> None:
        """Note that ``device_type`` belongs to an untying accelerator."""
        if device_type in self.types:
            return
        with self._lock:
            self.types = self.types | {device_type}
