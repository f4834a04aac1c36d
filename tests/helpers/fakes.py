"""Test plugins: fakes that let the main tier exercise real plugin code paths."""

from __future__ import annotations

from typing import Any

import torch

import accel
from accel.plugins.tpu import TpuPlugin


class Available:
    """Put first among a plugin's bases: its accelerator is available (by name, not to
    ``"auto"``) with ``count`` devices, whatever the machine has."""

    count = 1

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True, auto=False)

    @accel.hookimpl
    def device_count(self) -> int:
        return self.count


class MetaTpuPlugin(Available, TpuPlugin):
    """The real TPU plugin (same tying hooks), but available and moving to `meta`.

    `module.to("meta")` builds a new Parameter per slot exactly like a move to XLA.
    """

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("meta")


class CpuTpuPlugin(MetaTpuPlugin):
    """The real TPU plugin's tying hooks, moving to the CPU: with overwrite mode on,
    a CPU move unties like an XLA one, and values stay comparable."""

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")


class RecordsMoves:
    """Put among a plugin's bases: each move's hooks and each batch move are appended to
    ``self.calls``; batches are then moved by accel's built-in mover."""

    calls: list[str]

    @accel.hookimpl
    def pre_move_hook(self) -> None:
        self.calls.append("pre_move_hook")

    @accel.hookimpl
    def post_move_hook(self) -> None:
        self.calls.append("post_move_hook")

    @accel.hookimpl
    def batch_to_device(self, batch: Any) -> Any:
        self.calls.append("batch_to_device")
        return None  # fall through to the built-in mover


class FakeAccelerator(RecordsMoves):
    """A configurable accelerator plugin that records the hooks it sees."""

    def __init__(
        self,
        name: str = "fake",
        *,
        priority: int = 0,
        available: bool = True,
        auto: bool = True,
        count: int = 1,
        aliases: tuple[str, ...] = (),
        device: str = "cpu",
    ) -> None:
        self.spec = accel.AcceleratorSpec(name, aliases=aliases, priority=priority)
        self.available = available
        self.auto = auto
        self.count = count
        self.device = device
        self.calls: list[str] = []

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [self.spec]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(self.available, reason="fake says no", auto=self.auto)

    @accel.hookimpl
    def device_count(self) -> int:
        return self.count

    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        return torch.device(self.device)


class MoveRecorder:
    """A cross-cutting plugin: declares no accelerator, sees every move."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, str]] = []

    @accel.hookimpl(wrapper=True)
    def model_to_device(self, accelerator: str, device: torch.device) -> Any:
        moved = yield
        self.moves.append((accelerator, str(device)))
        return moved
