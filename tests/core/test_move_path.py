"""How far a move goes into accel: a CPU -> CPU move of a tied model enters few modules,
and none of the TPU plugin's (issue 38: CPU and GPU moves do not pay for tying); a move
that cannot change anything takes no capture, and every other move takes one."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
import torch

import accel
from accel.tying import _capture
from accel.tying._capture import RestorePoint
from helpers.models import TiedLM
from helpers.registries import isolated_registry
from helpers.strategies import torch_future_flag

#: The most accel modules a CPU -> CPU move that runs the hooks may enter: the handle,
#: the move, the capture, the hook caller, the fallback and the move's context type (a
#: model already there, where no plugin takes part, enters only the handle, the move and
#: the hook caller).
MOST_MODULES = 6


def _accel_modules_entered(call: Callable[[], Any]) -> set[str]:
    entered: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name == "accel" or name.startswith("accel."):
                entered.add(name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


class _OwnApply(TiedLM):
    """A model with its own ``_apply``: torch's ``.to()`` may change it, so even a
    CPU -> CPU move runs the hooks, under a capture."""

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        return super()._apply(fn, recurse)


@pytest.mark.parametrize(
    ("model_class", "most_modules"),
    [(TiedLM, 3), (_OwnApply, MOST_MODULES)],
    ids=["already-there", "through-the-hooks"],
)
def test_a_cpu_move_of_a_tied_model_enters_few_accel_modules(
    registry: accel.AcceleratorRegistry, model_class: type[TiedLM], most_modules: int
) -> None:
    cpu = registry.get_accelerator("cpu")
    model = model_class()
    cpu.model_to_device(model)  # the first move of a handle may set up caches
    entered = _accel_modules_entered(lambda: cpu.model_to_device(model))
    assert not any(name.startswith("accel.plugins.tpu") for name in entered), entered
    assert not any(
        name.startswith("accel.tying") and name != "accel.tying._capture" for name in entered
    ), entered
    assert len(entered) <= most_modules, ", ".join(sorted(entered))
    # The second case really went through the hooks: accel's fallback moved it.
    assert ("accel.plugins._fallbacks" in entered) is (model_class is _OwnApply), entered
    assert model.head.weight is model.embed.weight


def test_a_cpu_move_with_an_optimizer_enters_only_the_optimizers_module_more(
    registry: accel.AcceleratorRegistry,
) -> None:
    # The optimizers that follow the move are checked and handed over by one module
    # (accel.training._optimizers, which Lightning's strategies use too): the one module more.
    cpu = registry.get_accelerator("cpu")
    model = _OwnApply()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cpu.model_to_device(model, optimizer=optimizer)
    entered = _accel_modules_entered(lambda: cpu.model_to_device(model, optimizer=optimizer))
    assert "accel.training._optimizers" in entered
    assert len(entered - {"accel.training._optimizers"}) <= MOST_MODULES, ", ".join(sorted(entered))
    assert not any(name.startswith(("accel.plugins.tpu", "accel.tying._k")) for name in entered)
    assert optimizer.param_groups[0]["params"][0] is model.embed.weight


class _CountedCaptures:
    """Counts the captures (restore points) moves take, by wrapping the real one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken = 0
        real = _capture.RestorePoint

        def counted(model: torch.nn.Module) -> RestorePoint:
            self.taken += 1
            return real(model)

        monkeypatch.setattr(_capture, "RestorePoint", counted)


class _ReplacesItsWeightThenFails(torch.nn.Linear):
    """A module whose own ``_apply`` changes a slot, then fails: user code in the move."""

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.weight = torch.nn.Parameter(torch.zeros_like(self.weight))
        raise RuntimeError("planted failure in _apply")


class _PostMoveHook:
    @accel.hookimpl
    def post_move_hook(self, model: torch.nn.Module) -> None:
        pass


def test_a_move_that_cannot_change_anything_takes_no_capture(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Already on the CPU, only torch's .to(): each tensor's .to() returns itself.
    cpu = registry.get_accelerator("cpu")
    model = TiedLM()
    model(torch.zeros(1, 3, dtype=torch.long)).sum().backward()
    parameters = list(model.parameters())
    captures = _CountedCaptures(monkeypatch)
    assert cpu.model_to_device(model) is model
    assert captures.taken == 0
    assert list(model.parameters()) == parameters
    assert model.head.weight is model.embed.weight


def test_a_move_where_user_code_runs_is_captured_and_undone(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = registry.get_accelerator("cpu")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), _ReplacesItsWeightThenFails(2, 2))
    weight = model[1].weight
    captures = _CountedCaptures(monkeypatch)
    with pytest.raises(RuntimeError, match="planted failure") as failed:
        cpu.model_to_device(model)
    assert captures.taken == 1
    assert model[1].weight is weight
    assert "restored" in "".join(getattr(failed.value, "__notes__", []))


@pytest.mark.parametrize(
    "why",
    ["a plugin's move hook", "a buffer elsewhere", "a tensor subclass", "optimizer=", "swap mode"],
)
def test_a_move_that_may_change_something_is_captured(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = isolated_registry(*([_PostMoveHook()] if why == "a plugin's move hook" else []))
    cpu = registry.get_accelerator("cpu")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    optimizer = None
    if why == "a buffer elsewhere":
        model.register_buffer("stat", torch.zeros(1, dtype=torch.float64).to("meta"))
    elif why == "a tensor subclass":
        model.register_buffer("stat", _Marked(torch.zeros(1)))
    elif why == "optimizer=":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    captures = _CountedCaptures(monkeypatch)
    with torch_future_flag("swap_module_params_on_conversion", why == "swap mode"):
        try:
            cpu.model_to_device(model, optimizer=optimizer)
        except accel.errors.AcceleratorValueError as refused:  # meta: materialize instead
            assert why == "a buffer elsewhere"
            assert "acc.materialize" in str(refused)
    assert captures.taken == 1


class _Marked(torch.Tensor):
    """A tensor subclass: its .to() is not torch's plain one."""
