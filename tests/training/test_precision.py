"""Full precision through acc.autocast: enabled=False, dtype=torch.float32 and dtype
names, on the CPU, through a third-party plugin and on a device torch cannot autocast."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch

import accel
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator, RecordingAccelerator


def _matmul_dtype() -> torch.dtype:
    return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


@pytest.mark.parametrize(
    "full", [{"enabled": False}, {"dtype": torch.float32}, {"dtype": "float32"}]
)
def test_full_precision_switches_off_an_enclosing_autocast(
    registry: accel.AcceleratorRegistry, full: dict[str, Any]
) -> None:
    cpu = registry.get_accelerator("cpu")
    with cpu.autocast():
        assert _matmul_dtype() is torch.bfloat16  # the control: autocast is on here
        with cpu.autocast(**full):
            assert _matmul_dtype() is torch.float32
        assert _matmul_dtype() is torch.bfloat16  # and on again after the block


def test_a_dtype_may_be_named() -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    with cpu.autocast("float16"):
        assert _matmul_dtype() is torch.float16
    with cpu.autocast("torch.bfloat16"):
        assert _matmul_dtype() is torch.bfloat16
    with cpu.autocast("bf16"), cpu.autocast("FP32"):
        assert _matmul_dtype() is torch.float32


def test_full_precision_asks_no_plugin() -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("rec")
    with acc.autocast(enabled=False):
        assert _matmul_dtype() is torch.float32
    with acc.autocast(torch.float32):
        assert _matmul_dtype() is torch.float32
    assert "autocast" not in plugin.hooks_called()
    with acc.autocast(torch.float16):
        pass
    assert plugin.hooks_called() == ["autocast"]  # the control: low precision asks it


def test_full_precision_through_the_fallback_of_a_third_party_plugin() -> None:
    acc = isolated_registry(BareAccelerator()).get_accelerator("bare")
    with acc.autocast(), acc.autocast(enabled=False):
        assert _matmul_dtype() is torch.float32


def test_full_precision_on_a_device_torch_cannot_autocast(meta_tpu: accel.Accelerator) -> None:
    # torch.autocast("meta") raises; full precision there is simply the computation.
    context = meta_tpu.autocast(enabled=False)
    assert isinstance(context, nullcontext)
    with context:
        assert (torch.ones(2, device="meta") * 2).dtype is torch.float32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "float17"}, "torch has no dtype of that name"),
        ({"dtype": "Tensor"}, "torch has no dtype of that name"),
        ({"dtype": 16}, "expects a torch.dtype such as torch.bfloat16, got int"),
        ({"enabled": "no"}, "autocast\\(enabled=...\\) expects a bool, got str"),
    ],
)
def test_bad_precision_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    with pytest.raises(TypeError, match=match):
        cpu.autocast(**kwargs)
