"""An accelerator whose probing initialises its device (torch-opencl counts devices by
setting up OpenCL) declares it; listing and "auto" then leave it unprobed until it is
selected by name."""

from __future__ import annotations

import pytest

import accel
from helpers.registries import isolated_registry


class InitialisingProbe:
    """An accelerator that can only tell by initialising; counts its probes."""

    def __init__(self) -> None:
        self.spec = accel.AcceleratorSpec("opencl", priority=10_000, probing_initialises=True)
        self.probes = 0

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [self.spec]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        self.probes += 1
        return accel.Availability(True)

    @accel.hookimpl
    def device_count(self) -> int:
        return 1


def _row(registry: accel.AcceleratorRegistry) -> accel.AcceleratorInfo:
    return next(info for info in registry.list_accelerators() if info.name == "opencl")


def test_listing_and_auto_leave_it_unprobed() -> None:
    plugin = InitialisingProbe()
    registry = isolated_registry(plugin)
    row = _row(registry)
    assert not row.available and "not probed" in row.reason
    assert "get_accelerator('opencl')" in row.remedy
    assert registry.get_accelerator("auto").name != "opencl"  # the highest priority
    assert plugin.probes == 0


def test_selected_by_name_it_is_probed_and_then_listed_and_picked() -> None:
    plugin = InitialisingProbe()
    registry = isolated_registry(plugin)
    assert registry.get_accelerator("opencl").name == "opencl"
    assert plugin.probes == 1
    assert _row(registry).available
    assert registry.get_accelerator("auto").name == "opencl"


def test_the_declaration_is_a_bool() -> None:
    with pytest.raises(TypeError, match="probing_initialises of 'opencl' must be a bool, got 1"):
        accel.AcceleratorSpec("opencl", probing_initialises=1)  # type: ignore[arg-type]
