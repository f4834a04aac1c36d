"""A plugin's ``model_to_device`` may return another module in the model's place: the
move keeps that module's ties (or raises ``WeightTyingError``, the model as it was), and
the optimizers passed to the move follow its parameters."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import accel
from helpers.models import TiedLM


class CopyingPlugin:
    """Moves a deep copy of the model, as a vendor's move may."""

    def __init__(self, device: str, *, unties_weights: bool = False, change: str = "") -> None:
        self.device, self.unties_weights, self.change = device, unties_weights, change

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("npu", unties_weights=self.unties_weights)]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device(self.device)

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        moved = copy.deepcopy(model).to(device)
        if self.change == "untie head":
            moved.head.weight = nn.Parameter(torch.zeros_like(moved.head.weight))
        elif self.change == "drop head":
            del moved.head
        return moved


def _npu(plugin: CopyingPlugin) -> accel.Accelerator:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(plugin)
    return registry.get_accelerator("npu")


@pytest.mark.parametrize("declared", [True, False])
def test_a_replacement_on_a_device_that_unties_comes_back_tied(declared: bool) -> None:
    model = TiedLM()
    weight = model.embed.weight
    moved = _npu(CopyingPlugin("meta", unties_weights=declared)).model_to_device(model)
    assert moved is not model
    assert moved.head.weight is not None and moved.head.weight is moved.embed.weight
    assert moved.embed.weight.device.type == "meta"
    # The model passed to the move is left as it was: tied, on the CPU, no slot emptied.
    assert model.embed.weight is weight and model.head.weight is weight
    assert weight.device.type == "cpu"


# On the CPU too: torch's rule says a CPU move keeps ties, but a module returned in the
# model's place is another module, whose ties nothing kept.
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_replacement_whose_tie_came_apart_is_tied_again(device: str) -> None:
    moved = _npu(CopyingPlugin(device, change="untie head")).model_to_device(TiedLM())
    assert moved.head.weight is moved.embed.weight


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_replacement_that_lost_a_tied_slot_raises_and_the_model_is_as_it_was(
    device: str,
) -> None:
    model = TiedLM()
    weight = model.embed.weight
    with pytest.raises(accel.WeightTyingError, match="tied weights came apart") as info:
        _npu(CopyingPlugin(device, change="drop head")).model_to_device(model)
    assert info.value.broken_groups == [("embed.weight", "head.weight")]
    assert model.embed.weight is weight and model.head.weight is weight
    assert weight.device.type == "cpu"


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_optimizer_follows_the_replacements_parameters(device: str) -> None:
    model = TiedLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    moved = _npu(CopyingPlugin(device)).model_to_device(model, optimizer=optimizer)
    held = optimizer.param_groups[0]["params"]
    assert {id(p) for p in held} == {id(p) for p in moved.parameters()}
    assert len(held) == 3


class _NoNewEmpty(torch.Tensor):
    """A tensor subclass ``copy.deepcopy`` cannot copy (its ``new_empty`` is torch's)."""


def test_a_copy_that_fails_in_a_plugins_move_names_the_hook_and_the_plugin() -> None:
    model = TiedLM()
    model.extra = nn.Parameter(torch.ones(2).as_subclass(_NoNewEmpty))
    with pytest.raises(RuntimeError, match="__deepcopy__") as info:
        _npu(CopyingPlugin("cpu")).model_to_device(model)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised in hook 'model_to_device' of plugin" in notes
    assert "CopyingPlugin" in notes
    assert model.head.weight is model.embed.weight


class TracingPlugin(CopyingPlugin):
    """Returns the moved model traced by TorchScript, as a vendor's compiled move may."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        return torch.jit.trace(model.to(device), torch.tensor([[1, 2]]))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_a_torchscript_replacement_is_returned_as_it_is() -> None:
    # TorchScript keeps its parameters in slots of its own, which accel cannot read or
    # re-tie: the move returns the traced module rather than failing inside accel.
    model = TiedLM()
    tokens = torch.tensor([[3, 4]])
    expected = model(tokens)
    moved = _npu(TracingPlugin("cpu")).model_to_device(model)
    assert isinstance(moved, torch.jit.ScriptModule)
    assert torch.equal(moved(tokens), expected)
