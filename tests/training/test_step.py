"""The training step on the handle: optimizer_step, mark_step, synchronize, manual_seed,
autocast, on the CPU and through third-party plugins (hook called; fallback when absent)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import accel
from helpers.registries import isolated_registry
from helpers.training_fakes import (
    BareAccelerator,
    RecordingAccelerator,
    backward_once,
    linear_model_and_optimizer,
)

# -- optimizer_step ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["cpu", "bare"])
def test_optimizer_step_steps_like_the_optimizer(name: str) -> None:
    acc = isolated_registry(BareAccelerator()).get_accelerator(name)
    model, optimizer = linear_model_and_optimizer()
    twin, twin_optimizer = copy.deepcopy((model, optimizer))
    for _ in range(3):
        backward_once(model)
        backward_once(twin)
        assert acc.optimizer_step(optimizer) is None
        twin_optimizer.step()
        optimizer.zero_grad()
        twin_optimizer.zero_grad()
    assert torch.equal(model.weight, twin.weight)
    assert not torch.equal(model.weight, linear_model_and_optimizer()[0].weight)


def test_optimizer_step_passes_the_closure_and_returns_what_the_step_returns() -> None:
    acc = isolated_registry().get_accelerator("cpu")
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3)
    calls = []

    def closure() -> torch.Tensor:
        calls.append(1)
        optimizer.zero_grad()
        loss = model(torch.ones(2, 3)).pow(2).sum()
        loss.backward()
        return loss

    result = acc.optimizer_step(optimizer, closure)
    assert isinstance(result, torch.Tensor) and len(calls) >= 2  # LBFGS re-evaluates
    assert float(model(torch.ones(2, 3)).pow(2).sum().detach()) < float(result.detach())


def test_a_plugins_optimizer_step_wraps_the_fallback_step() -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("rec")
    model, optimizer = linear_model_and_optimizer()
    backward_once(model)
    before = model.weight.detach().clone()

    def closure() -> float:
        return 4.5

    assert acc.optimizer_step(optimizer, closure) == 4.5
    assert plugin.calls[0] == ("optimizer_step", {"optimizer": optimizer, "closure": closure})
    assert plugin.calls[1] == ("optimizer_step:after", {"result": 4.5})
    assert not torch.equal(model.weight, before)  # the fallback stepped, once


@pytest.mark.parametrize(
    ("optimizer", "match"),
    [
        (torch.nn.Linear(1, 1), "expects a torch.optim.Optimizer, got Linear"),
        ("adam", "got str"),
        (None, "got NoneType"),
    ],
)
def test_optimizer_step_rejects_a_non_optimizer(optimizer: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        isolated_registry().get_accelerator("cpu").optimizer_step(optimizer)


def test_optimizer_step_names_a_scheduler_passed_by_mistake() -> None:
    _, optimizer = linear_model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with pytest.raises(TypeError, match=r"scheduler: pass the optimizer it schedules"):
        isolated_registry().get_accelerator("cpu").optimizer_step(scheduler)  # type: ignore[arg-type]


def test_optimizer_step_rejects_a_closure_that_is_not_callable() -> None:
    _, optimizer = linear_model_and_optimizer()
    with pytest.raises(TypeError, match=r"closure=.*got float"):
        isolated_registry().get_accelerator("cpu").optimizer_step(optimizer, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["cpu", "rec"])
def test_a_raising_closure_propagates_and_leaves_the_state_as_the_optimizer_left_it(
    name: str,
) -> None:
    acc = isolated_registry(RecordingAccelerator()).get_accelerator(name)
    model, optimizer = linear_model_and_optimizer()
    backward_once(model)
    optimizer.step()  # momentum buffers exist now
    backward_once(model)
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(optimizer.state_dict())

    def closure() -> None:
        raise ArithmeticError("loss is NaN")

    with pytest.raises(ArithmeticError, match=r"loss is NaN") as info:
        acc.optimizer_step(optimizer, closure)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"optimizer_step for accelerator {name!r}" in notes
    if name == "cpu":
        assert "raised in hook 'optimizer_step' of plugin 'accel.fallbacks' (built-in)" in notes
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key])
    after = optimizer.state_dict()
    assert after["param_groups"] == state["param_groups"]
    for index, slot in state["state"].items():
        assert torch.equal(after["state"][index]["momentum_buffer"], slot["momentum_buffer"])


def test_a_raising_plugin_step_is_named() -> None:
    class Broken(BareAccelerator):
        @accel.hookimpl
        def optimizer_step(self) -> None:
            raise RuntimeError("device fell off the bus")

    acc = isolated_registry(Broken("npu")).get_accelerator("npu")
    _, optimizer = linear_model_and_optimizer()
    with pytest.raises(RuntimeError, match=r"fell off") as info:
        acc.optimizer_step(optimizer)
    assert "raised in hook 'optimizer_step' of plugin" in "\n".join(info.value.__notes__)


# -- mark_step, synchronize, manual_seed ----------------------------------------------


def test_mark_step_and_synchronize_call_the_plugins_hooks() -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("rec")
    acc.mark_step()
    acc.synchronize()
    assert plugin.calls == [
        ("mark_step", {"device": acc.device}),
        ("synchronize", {"device": acc.device}),
    ]


@pytest.mark.parametrize("name", ["cpu", "bare", "rec"])
def test_manual_seed_makes_the_host_random_numbers_repeat(name: str) -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(BareAccelerator(), plugin).get_accelerator(name)
    acc.manual_seed(1234)
    first = torch.rand(4)
    acc.manual_seed(1234)
    assert torch.equal(torch.rand(4), first)
    acc.manual_seed(4321)
    assert not torch.equal(torch.rand(4), first)
    if name == "rec":  # the plugin's hook ran, and the fallback still seeded torch
        assert plugin.calls.count(("manual_seed", {"seed": 1234})) == 2


@pytest.mark.parametrize(
    ("seed", "error", "match"),
    [
        (True, TypeError, "int seed, got bool"),
        (1.5, TypeError, "got float"),
        (2**64, ValueError, "outside torch's range"),
    ],
)
def test_manual_seed_rejects_bad_seeds(seed: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        isolated_registry().get_accelerator("cpu").manual_seed(seed)


# -- autocast ---------------------------------------------------------------------


def test_cpu_autocast_defaults_to_bfloat16_and_accepts_float16() -> None:
    acc = isolated_registry().get_accelerator("cpu")
    layer = torch.nn.Linear(4, 4)
    with acc.autocast():
        assert layer(torch.ones(1, 4)).dtype == torch.bfloat16
    with acc.autocast(torch.float16):
        assert layer(torch.ones(1, 4)).dtype == torch.float16
    assert layer(torch.ones(1, 4)).dtype == torch.float32  # only inside the block


@pytest.mark.parametrize(
    ("dtype", "error", "match"),
    [
        (
            torch.float64,
            ValueError,
            "cannot autocast to torch.float64; it supports: torch.bfloat16, torch.float16",
        ),
        (torch.int8, ValueError, "cannot autocast to torch.int8"),
        (b"bfloat16", TypeError, "expects a torch.dtype"),
    ],
)
def test_cpu_autocast_refuses_what_the_cpu_cannot_do(dtype: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        isolated_registry().get_accelerator("cpu").autocast(dtype)


def test_the_fallback_autocast_uses_torchs_default_and_refuses_what_torch_would_ignore() -> None:
    acc = isolated_registry(BareAccelerator()).get_accelerator("bare")  # a device of type cpu
    with acc.autocast():
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.get_autocast_dtype("cpu")
    # torch.autocast only warns here and runs in float32; accel says no.
    with pytest.raises(ValueError, match=r"cannot autocast to torch.float64 on device type 'cpu'"):
        acc.autocast(torch.float64)


def test_a_plugins_autocast_gets_the_requested_dtype_and_must_return_a_context_manager() -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("rec")
    with acc.autocast(torch.float16):
        pass
    assert plugin.calls == [("autocast", {"dtype": torch.float16})]

    class Sloppy(BareAccelerator):
        @accel.hookimpl
        def autocast(self) -> str:
            return "bf16"

    registry = isolated_registry()
    registry.register(Sloppy("sloppy"), name="sloppy-plugin")
    with pytest.raises(accel.PluginError, match=r"str, not a context manager.*'sloppy-plugin'"):
        registry.get_accelerator("sloppy").autocast()
