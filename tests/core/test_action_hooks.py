"""The rule for action hooks (accel.hookspecs): one plain implementation does the action,
the plugin's where it has one, else accel's fallback; wrappers work around it."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
import torch

import accel
from helpers.fakes import FakeAccelerator
from helpers.registries import isolated_registry


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(2, 1)
    model.weight.grad = torch.ones_like(model.weight)
    model.bias.grad = torch.ones_like(model.bias)
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


class StepsItself(FakeAccelerator):
    """Steps the optimizer and returns what optimizer.step() returns: None."""

    @accel.hookimpl
    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()


class Watches:
    """A cross-cutting wrapper around the step."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @accel.hookimpl(wrapper=True)
    def optimizer_step(self) -> Generator[None, Any, Any]:
        result = yield
        self.seen.append(result)
        return result


def test_a_plugin_step_that_returns_none_steps_once() -> None:
    acc = isolated_registry(StepsItself("npu")).get_accelerator("npu")
    model, optimizer = _model_and_optimizer()
    before = model.weight.detach().clone()
    assert acc.optimizer_step(optimizer) is None
    assert torch.equal(model.weight.detach(), before - 1.0)  # once, not twice


def test_a_wrapper_sees_the_steps_value() -> None:
    watcher = Watches()
    acc = isolated_registry(watcher).get_accelerator("cpu")
    _, optimizer = _model_and_optimizer()
    assert acc.optimizer_step(optimizer, closure=lambda: torch.tensor(3.0)) == 3.0
    assert watcher.seen == [torch.tensor(3.0)]


def test_two_plain_implementations_of_an_action_hook_are_refused_naming_both() -> None:
    registry = isolated_registry(StepsItself("npu"))

    class AlsoSteps:
        @accel.hookimpl
        def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            optimizer.step()

    with pytest.raises(accel.PluginError, match="optimizer_step") as info:
        registry.register(AlsoSteps(), name="also-steps")
    message = str(info.value)
    # A cross-cutting step meets the first accelerator that steps itself (the TPU's).
    assert "also-steps" in message and "already does for accelerator" in message
    assert "wrapper=True" in message
    # Refused whole: the registry is as it was, and the NPU steps once.
    model, optimizer = _model_and_optimizer()
    before = model.weight.detach().clone()
    registry.get_accelerator("npu").optimizer_step(optimizer)
    assert torch.equal(model.weight.detach(), before - 1.0)


def test_an_error_in_a_plugins_hook_names_the_hook_and_the_plugin() -> None:
    class Raises(FakeAccelerator):
        @accel.hookimpl
        def synchronize(self) -> None:
            raise RuntimeError("device lost")

    acc = isolated_registry(Raises("npu")).get_accelerator("npu")
    with pytest.raises(RuntimeError, match="device lost") as info:
        acc.synchronize()
    notes = getattr(info.value, "__notes__", [])
    assert any("'synchronize'" in n and "Raises" in n for n in notes), notes


def test_every_hook_call_goes_through_pluggys_call_loop_with_its_specs_arguments() -> None:
    # pluggy's own monitoring sits in its call loop (PluginManager._hookexec): a hook
    # that accel called by itself, or through a loop of its own, would not be seen.
    registry = isolated_registry()
    manager = registry._loaded().dispatcher.validator()
    seen: dict[str, set[str]] = {}

    def before(hook_name: str, implementations: object, kwargs: dict[str, object]) -> None:
        seen.setdefault(hook_name, set()).update(kwargs)

    undo = manager.add_hookcall_monitoring(before, lambda *args: None)
    try:
        cpu = registry.get_accelerator("cpu")
        _model, optimizer = _model_and_optimizer()
        cpu.batch_to_device({"x": torch.ones(1)})
        cpu.optimizer_step(optimizer)
        cpu.mark_step()
        cpu.synchronize()
        cpu.manual_seed(0)
        cpu.memory_stats()
        with cpu.autocast():
            pass
    finally:
        undo()
    called = {
        "is_available",
        "device_count",
        "get_device",
        "batch_to_device",
        "optimizer_step",
        "mark_step",
        "synchronize",
        "manual_seed",
        "memory_stats",
        "autocast",
    }
    assert called <= set(seen), sorted(called - set(seen))
    for hook_name, arguments in seen.items():
        spec = getattr(manager.hook, hook_name).spec
        assert arguments == set(spec.argnames), hook_name


def test_a_wrapper_registered_later_runs_around_the_hot_calls() -> None:
    # mark_step and synchronize take the shortest path into pluggy's loop: a wrapper
    # registered after their first call still runs around them (the snapshot is new).
    registry = isolated_registry()
    cpu = registry.get_accelerator("cpu")
    cpu.mark_step()
    cpu.synchronize()
    calls: list[str] = []

    class AroundSteps:
        @accel.hookimpl(wrapper=True)
        def mark_step(self) -> Generator[None, Any, Any]:
            calls.append("mark_step")
            return (yield)

        @accel.hookimpl(wrapper=True)
        def synchronize(self) -> Generator[None, Any, Any]:
            calls.append("synchronize")
            return (yield)

    registry.register(AroundSteps())
    cpu.mark_step()
    cpu.synchronize()
    assert calls == ["mark_step", "synchronize"]


def test_no_hookspec_has_default_arguments() -> None:
    # accel passes every argument of a spec itself, straight into pluggy's call loop
    # (no HookCaller.__call__ to fill in defaults): a default would never apply.
    registry = isolated_registry()
    manager = registry._loaded().dispatcher.validator()
    with_defaults = {
        name: caller.spec.kwargdefaults
        for name, caller in vars(manager.hook).items()
        if caller.spec is not None and caller.spec.kwargdefaults
    }
    assert with_defaults == {}
