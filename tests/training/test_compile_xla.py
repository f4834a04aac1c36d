"""acc.compile on torch_xla (XLA:CPU): the openxla backend, output equal to eager."""

from __future__ import annotations

import pytest
import torch

import accel
from helpers.models import TiedLM

pytestmark = pytest.mark.xla


def test_compiled_output_on_xla_equals_eager_and_ties_stay_slow(
    registry: accel.AcceleratorRegistry,
) -> None:
    """Slow-ish: dynamo traces, then XLA compiles the graph (seconds on XLA:CPU)."""
    tpu = registry.get_accelerator("tpu")
    torch.manual_seed(0)
    model = tpu.model_to_device(TiedLM())
    compiled = tpu.compile(model)
    assert compiled.head.weight is compiled.embed.weight
    tokens = torch.arange(10, device=tpu.device).remainder(16).reshape(2, 5)
    eager = model(tokens).cpu()
    torch.testing.assert_close(compiled(tokens).cpu(), eager, rtol=1e-5, atol=1e-6)
    assert list(tpu.state_dict(compiled)) == list(model.state_dict())
