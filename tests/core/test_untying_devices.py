"""Ties kept both ways on every untying device: a move that enters or leaves a device
type torch's rule says unties keeps the structure of before, declared or not.

The fake device (tests/helpers/untying_device.py) unties as every PrivateUse1 backend
does: torch's ``Module.to`` gives each slot a Parameter of its own, to it and from it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import accel
from helpers.models import TiedLM
from helpers.registries import isolated_registry
from helpers.untying_device import UntyingDevicePlugin, values


def _unique(model: nn.Module) -> int:
    return len(list(model.parameters()))


def test_a_tied_model_comes_back_to_the_cpu_tied_with_its_values_and_optimizer() -> None:
    registry = isolated_registry(UntyingDevicePlugin())
    device_acc, cpu = registry.get_accelerator("untying"), registry.get_accelerator("cpu")
    model = TiedLM()
    weight = model.embed.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = device_acc.model_to_device(model, optimizer=optimizer)
    assert model.embed.weight.device.type == "privateuseone"
    assert model.head.weight is model.embed.weight and _unique(model) == 3

    model = cpu.model_to_device(model, optimizer=optimizer)

    assert model.embed.weight.device.type == "cpu"
    assert model.head.weight is model.embed.weight  # torch alone gives 4 parameters
    assert _unique(model) == 3
    assert torch.equal(model.embed.weight, weight)
    held = optimizer.param_groups[0]["params"]
    assert len(held) == 3 and any(p is model.embed.weight for p in held)


def test_separate_parameters_stay_separate_on_the_way_back() -> None:
    registry = isolated_registry(UntyingDevicePlugin())
    device_acc, cpu = registry.get_accelerator("untying"), registry.get_accelerator("cpu")
    model = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(model[0].weight)  # equal values, no tie
    model = cpu.model_to_device(device_acc.model_to_device(model))
    assert model[0].weight is not model[1].weight and _unique(model) == 2


def test_a_move_between_two_untying_devices_keeps_the_ties() -> None:
    first = UntyingDevicePlugin("first", "privateuseone")
    second = UntyingDevicePlugin("second", "maia")
    registry = isolated_registry(first, second)
    on_first = registry.get_accelerator("first").model_to_device(TiedLM())
    weight = values(on_first.embed.weight).clone()
    # The second device's torch move, from the first: every slot a Parameter of its own.
    moved = registry.get_accelerator("cpu").model_to_device(on_first)
    on_second = registry.get_accelerator("second").model_to_device(moved)
    assert on_second.embed.weight.device.type == "maia"
    assert on_second.head.weight is on_second.embed.weight and _unique(on_second) == 3
    assert torch.equal(values(on_second.embed.weight), weight)
    back = registry.get_accelerator("cpu").model_to_device(on_second)
    assert back.head.weight is back.embed.weight and _unique(back) == 3


class _FailsAfterMoves:
    """A cross-cutting plugin whose post_move_hook raises."""

    @accel.hookimpl
    def post_move_hook(self, device: torch.device) -> None:
        if device.type == "cpu":
            raise RuntimeError("post-move check failed")


def test_a_failed_move_back_leaves_the_model_on_the_device_tied() -> None:
    registry = isolated_registry(UntyingDevicePlugin())
    model = registry.get_accelerator("untying").model_to_device(TiedLM())
    tied = model.embed.weight
    registry.register(_FailsAfterMoves())
    with pytest.raises(RuntimeError, match="post-move check failed"):
        registry.get_accelerator("cpu").model_to_device(model)
    assert model.embed.weight is tied and model.head.weight is tied
    assert tied.device.type == "privateuseone"


class _UndeclaredDevicePlugin(UntyingDevicePlugin):
    """The same device, its plugin declaring nothing about ties."""

    def __init__(self) -> None:
        super().__init__()
        self.spec = accel.AcceleratorSpec("untying")


def test_an_undeclared_untying_device_keeps_the_ties_both_ways() -> None:
    registry = isolated_registry(_UndeclaredDevicePlugin())
    assert registry.get_accelerator("untying").spec.unties_weights is False
    model = registry.get_accelerator("untying").model_to_device(TiedLM())
    assert model.head.weight is model.embed.weight and _unique(model) == 3
    back = registry.get_accelerator("cpu").model_to_device(model)
    assert back.embed.weight.device.type == "cpu"
    assert back.head.weight is back.embed.weight and _unique(back) == 3


def test_a_model_leaving_the_device_keeps_its_ties_in_a_registry_that_never_selected_it() -> None:
    on_device = isolated_registry(UntyingDevicePlugin()).get_accelerator("untying")
    model = on_device.model_to_device(TiedLM())
    other = isolated_registry()  # no plugin of that device, no handle of it
    back = other.get_accelerator("cpu").model_to_device(model)
    assert back.head.weight is back.embed.weight and _unique(back) == 3
