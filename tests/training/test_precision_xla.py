"""Full precision on torch_xla (XLA:CPU): acc.autocast(enabled=False) and float32
switch off an enclosing bfloat16 autocast."""

from __future__ import annotations

import pytest
import torch

import accel

pytestmark = pytest.mark.xla


def test_full_precision_inside_xla_autocast(registry: accel.AcceleratorRegistry) -> None:
    tpu = registry.get_accelerator("tpu")
    ones = torch.ones(2, 2, device=tpu.device)
    with tpu.autocast():
        assert (ones @ ones).dtype is torch.bfloat16  # the control
        with tpu.autocast(enabled=False):
            assert (ones @ ones).dtype is torch.float32
        with tpu.autocast(dtype=torch.float32):
            assert (ones @ ones).dtype is torch.float32
