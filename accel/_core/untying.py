"""Kept only for the imports of :mod:`accel._core.hooks` and
:mod:`accel._registry.dispatch`: moves no longer learn device types (torch's own rule
decides which moves untie, :func:`accel._core.moving.move_unties`). Delete this module
once those two stop passing a :class:`UntyingDeviceTypes` around."""

from __future__ import annotations

from typing import final

__all__ = ["UntyingDeviceTypes"]


@final
class UntyingDeviceTypes:
    """Unused (see the module)."""

    __slots__ = ("types",)

    def __init__(self) -> None:
        self.types: frozenset[str] = frozenset()

    def learn(self, device_type: str) -> None:
        """Does nothing any more (see the module)."""
