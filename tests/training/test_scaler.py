"""Loss scaling: acc.grad_scaler() where float16 needs one, and optimizer_step(scaler=)
equal to the hand-written scaler.step / scaler.update, on the CPU and through plugins."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import accel
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator, RecordingAccelerator


def _cpu() -> accel.Accelerator:
    return accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")


def test_the_cpu_needs_no_scaler_for_its_default_bfloat16_nor_for_float32() -> None:
    cpu = _cpu()
    assert cpu.grad_scaler() is None
    assert cpu.grad_scaler(torch.bfloat16) is None
    assert cpu.grad_scaler("float32") is None


def test_float16_gets_a_scaler_for_the_device_with_the_options_given() -> None:
    scaler = _cpu().grad_scaler(torch.float16, init_scale=1024.0, growth_interval=3)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.is_enabled() and scaler.get_scale() == 1024.0
    assert scaler.get_growth_interval() == 3
    assert scaler._device == "cpu"


def test_an_accelerator_preferring_float16_gets_a_scaler_by_default() -> None:
    class Float16First(BareAccelerator):
        @accel.hookimpl
        def autocast(self, device: torch.device) -> Any:
            return torch.autocast(device.type, dtype=torch.float16)

    acc = isolated_registry(Float16First("half")).get_accelerator("half")
    assert isinstance(acc.grad_scaler(), torch.amp.GradScaler)
    assert acc.grad_scaler(torch.bfloat16) is None


def _train(step: Any, overflow_at: int, steps: int = 4) -> tuple[list[torch.Tensor], list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    scales = []
    for index in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(8, 4)).float().pow(2).mean()
        scaler.scale(loss).backward()
        if index == overflow_at:  # an overflow: the step is skipped and the scale halved
            model.weight.grad[0, 0] = torch.inf  # type: ignore[index]
        step(optimizer, scaler)
        optimizer.zero_grad()
        scales.append(scaler.get_scale())
    return [p.detach().clone() for p in model.parameters()], scales


def _by_hand(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    scaler.step(optimizer)
    scaler.update()


@pytest.mark.parametrize("accelerator", ["cpu", "bare", "rec"])
def test_scaled_steps_equal_the_hand_written_scaler_step_and_update(accelerator: str) -> None:
    acc = isolated_registry(BareAccelerator(), RecordingAccelerator()).get_accelerator(accelerator)
    ours, our_scales = _train(lambda o, s: acc.optimizer_step(o, scaler=s), overflow_at=1)
    theirs, their_scales = _train(_by_hand, overflow_at=1)
    assert our_scales == their_scales
    assert our_scales == [2048.0, 1024.0, 2048.0, 4096.0]  # grew, halved at the overflow
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0)
    unscaled, _ = _train(lambda o, s: o.step(), overflow_at=-1)
    assert not torch.equal(unscaled[0], ours[0])  # the control: scaling changed the run


def test_a_plugins_step_wrapper_sees_the_scaler_step_inside_it() -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("rec")
    model = torch.nn.Linear(2, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    before = model.weight.detach().clone()
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()  # unscaled gradient: ones
    acc.optimizer_step(optimizer, scaler=scaler)
    assert plugin.hooks_called() == ["optimizer_step", "optimizer_step:after"]
    # Stepped with the unscaled gradient; no overflow, so the scale is kept.
    torch.testing.assert_close(model.weight.detach(), before - 0.1)
    assert scaler.get_scale() == 2.0**16


def test_a_disabled_scaler_steps_plainly_and_takes_a_closure() -> None:
    cpu = _cpu()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        return loss

    before = model.weight.detach().clone()
    loss = cpu.optimizer_step(optimizer, closure, scaler=torch.amp.GradScaler("cpu", enabled=False))
    assert isinstance(loss, torch.Tensor)
    assert not torch.equal(before, model.weight)


def test_bad_scalers_are_refused() -> None:
    cpu = _cpu()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"expects a torch.amp.GradScaler .* got float"):
        cpu.optimizer_step(optimizer, scaler=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="closure cannot be combined with an enabled GradScaler"):
        cpu.optimizer_step(optimizer, lambda: 0.0, scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match=r"cannot autocast to torch\.float64"):
        cpu.grad_scaler(torch.float64)


def test_a_plugin_returning_no_scaler_is_named() -> None:
    class NoScaler(BareAccelerator):
        @accel.hookimpl
        def grad_scaler(self) -> str:
            return "scaler"

    acc = isolated_registry(NoScaler("noscale")).get_accelerator("noscale")
    with pytest.raises(accel.PluginError, match="returned str, not a GradScaler"):
        acc.grad_scaler(torch.float16)
