"""The example plugin's training hooks (Intel XPU), with torch.xpu faked on the CPU."""

from __future__ import annotations

import types
from contextlib import nullcontext
from typing import Any

import accel_example_plugin as example  # installed by scripts/test, as in test_entry_points
import pytest
import torch

import accel
from helpers.fakes import Available
from helpers.registries import isolated_registry


class AvailableXpu(Available):
    """The example plugin's module hooks, but available, with the device faked."""


@pytest.fixture
def xpu() -> accel.Accelerator:
    registry = isolated_registry(builtins=False)
    registry.register(example, name="example")
    registry.register(AvailableXpu(), name="available")  # cross-cutting, asked first
    return registry.get_accelerator("xpu")


def test_xpu_memory_stats_and_synchronize_use_torch_xpu(
    xpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Any] = []
    monkeypatch.setattr(torch.xpu, "memory_allocated", lambda d: 7)
    monkeypatch.setattr(torch.xpu, "max_memory_allocated", lambda d: 9)
    monkeypatch.setattr(
        torch.xpu, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=99)
    )
    monkeypatch.setattr(torch.xpu, "synchronize", synced.append)
    assert xpu.memory_stats() == {
        "allocated_bytes": 7,
        "peak_allocated_bytes": 9,
        "total_bytes": 99,
    }
    xpu.synchronize()
    assert synced == [torch.device("xpu", 0)]


@pytest.mark.parametrize(("bf16", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_xpu_autocast_prefers_bfloat16_where_the_gpu_has_it(
    xpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch, bf16: bool, expected: torch.dtype
) -> None:
    made: list[torch.dtype] = []
    monkeypatch.setattr(torch.xpu, "is_bf16_supported", lambda *a, **k: bf16)
    import accel.training.precision

    # torch cannot autocast on a device type this machine lacks: record the choice instead.
    monkeypatch.setattr(
        accel.training.precision,
        "torch_autocast",
        lambda acc, device, dtype: made.append(dtype) or nullcontext(),
    )
    with xpu.autocast():
        pass
    assert made == [expected]
    if not bf16:
        with pytest.raises(ValueError, match=r"has no bfloat16"):
            xpu.autocast(torch.bfloat16)
