"""Loss scaling on torch_xla (XLA:CPU): no scaler for bfloat16, a GradScaler for float16
whose steps through acc.optimizer_step equal the hand-written ones, with the reduction
before the scaler's step (faked two replicas) and the step marked."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import accel

pytestmark = pytest.mark.xla


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def test_tpu_needs_a_scaler_only_for_float16(tpu: accel.Accelerator) -> None:
    assert tpu.grad_scaler() is None  # bfloat16, the TPU's autocast type
    scaler = tpu.grad_scaler(torch.float16)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "xla"


def _train(tpu: accel.Accelerator, step: Any) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = tpu.model_to_device(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("xla", init_scale=2.0**8, growth_interval=1)
    for index in range(3):
        x = torch.full((8, 4), float(index + 1), device=tpu.device)
        scaler.scale(model(x).pow(2).mean()).backward()
        step(optimizer, scaler)
        optimizer.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


def test_scaled_steps_on_xla_equal_the_hand_written_ones(tpu: accel.Accelerator) -> None:
    def by_hand(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)
        scaler.update()

    ours = _train(tpu, lambda o, s: tpu.optimizer_step(o, scaler=s))
    theirs = _train(tpu, by_hand)
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0)


def test_the_reduction_comes_before_the_scalers_step_and_the_step_is_marked(
    tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    events: list[str] = []
    real_sync = torch_xla.sync
    monkeypatch.setattr(xr, "world_size", lambda: 2)  # faked: one process, two "replicas"
    monkeypatch.setattr(xm, "all_reduce", lambda *a, **k: events.append("all_reduce"))
    monkeypatch.setattr(torch_xla, "sync", lambda *a, **k: (events.append("sync"), real_sync())[1])
    model = tpu.model_to_device(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("xla")
    real_step = scaler.step
    monkeypatch.setattr(scaler, "step", lambda o: (events.append("scaler.step"), real_step(o))[1])
    scaler.scale(model(torch.ones(1, 2, device=tpu.device)).sum()).backward()
    tpu.optimizer_step(optimizer, scaler=scaler)
    assert events == ["all_reduce", "scaler.step", "sync"]
