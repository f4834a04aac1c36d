"""A failed move restores what a hook changed, or names exactly what it could not.

Each hook below changes the model the way real hooks do (rescales a weight in place,
runs a forward pass that updates BatchNorm statistics, switches to eval mode), then
raises; the move fails, and the note on the error must be true.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import accel
from helpers.fakes import MetaTpuPlugin
from helpers.models import TiedLM

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="notes need Python 3.11")

Change = Callable[[nn.Module], None]


class ChangesThenRaises:
    """A cross-cutting plugin that changes the model in one hook, then raises in another."""

    def __init__(self, when: str, change: Change) -> None:
        self.when = when
        self.change = change

    @accel.hookimpl
    def pre_move_hook(self, model: nn.Module) -> None:
        if self.when == "pre":
            self.change(model)

    @accel.hookimpl
    def post_move_hook(self, model: nn.Module) -> None:
        if self.when == "post":
            self.change(model)
        raise RuntimeError("validation failed")


class WithNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)


def _rescale(model: nn.Module) -> None:
    with torch.no_grad():
        model.linear.weight.mul_(2.0)


def _forward_in_train_mode(model: nn.Module) -> None:
    model.train()
    device = model.linear.weight.device
    model.norm(torch.randn(8, 4, device=device))  # updates the running statistics


def _eval(model: nn.Module) -> None:
    model.eval()


def _failed_move(acc: accel.Accelerator, model: nn.Module) -> str:
    with pytest.raises(RuntimeError, match="validation failed") as info:
        acc.model_to_device(model)
    notes = [n for n in getattr(info.value, "__notes__", []) if n.startswith("accel: moving")]
    assert len(notes) == 1, info.value.__notes__
    return notes[0]


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _cpu(registry: accel.AcceleratorRegistry, plugin: object) -> accel.Accelerator:
    registry.register(plugin)
    return registry.get_accelerator("cpu")


def _meta(plugin: object) -> accel.Accelerator:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(MetaTpuPlugin())
    registry.register(plugin)
    return registry.get_accelerator("tpu")


def test_eval_in_a_failing_hook_is_undone(registry: accel.AcceleratorRegistry) -> None:
    model = WithNorm().train()
    model.norm.eval()  # a mix of modes, each module's kept
    note = _failed_move(_cpu(registry, ChangesThenRaises("pre", _eval)), model)
    assert model.training and model.linear.training and not model.norm.training
    assert "the model was restored as it was before the move" in note
    assert "every module's training mode; no tensor was changed in place" in note


@pytest.mark.parametrize("when", ["pre", "post"])
def test_an_in_place_rescale_is_named_as_not_restored(
    registry: accel.AcceleratorRegistry, when: str
) -> None:
    model = WithNorm()
    before = _values(model)
    note = _failed_move(_cpu(registry, ChangesThenRaises(when, _rescale)), model)
    # A CPU move keeps the same tensors: the rescale hit the values the restore keeps.
    assert torch.equal(model.linear.weight, before["linear.weight"] * 2)
    assert "restored as it was" not in note
    assert note.endswith(
        "but 1 tensor was changed in place during the move and keeps the new values "
        "(accel keeps no copies of values): linear.weight."
    )


def test_batchnorm_statistics_updated_by_a_failing_hook_are_named(
    registry: accel.AcceleratorRegistry,
) -> None:
    model = WithNorm().eval()
    before = _values(model)
    note = _failed_move(_cpu(registry, ChangesThenRaises("pre", _forward_in_train_mode)), model)
    assert not model.training and not model.norm.training  # the mode is restored
    changed = [n for n, v in model.state_dict().items() if not torch.equal(v, before[n])]
    assert changed == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
    assert note.endswith(f"(accel keeps no copies of values): {', '.join(changed)}.")
    assert "3 tensors were changed in place during the move and keep the new values" in note


def test_edits_of_the_moved_copies_after_an_untying_move_need_no_restore() -> None:
    # On `meta` (like XLA) the move builds new tensors: a post_move_hook rescaling them
    # leaves the originals, which the restore puts back, untouched.
    model = WithNorm()
    before = _values(model)
    note = _failed_move(_meta(ChangesThenRaises("post", _rescale)), model)
    assert model.linear.weight.device.type == "cpu"
    assert all(torch.equal(v, before[n]) for n, v in model.state_dict().items())
    assert "the model was restored as it was before the move" in note


def test_edits_before_an_untying_move_are_named() -> None:
    model = TiedLM()
    note = _failed_move(_meta(ChangesThenRaises("pre", _rescale_embedding)), model)
    assert model.head.weight is model.embed.weight  # the slots are restored
    assert note.endswith("(accel keeps no copies of values): embed.weight.")


def _rescale_embedding(model: nn.Module) -> None:
    with torch.no_grad():
        model.embed.weight.mul_(0.5)


def test_an_in_place_edit_of_a_gradient_is_named(registry: accel.AcceleratorRegistry) -> None:
    model = WithNorm()
    model.linear.weight.grad = torch.ones(4, 4)

    def zero_grads(model: nn.Module) -> None:
        model.linear.weight.grad.zero_()  # type: ignore[union-attr]

    note = _failed_move(_cpu(registry, ChangesThenRaises("pre", zero_grads)), model)
    assert note.endswith("(accel keeps no copies of values): linear.weight.grad.")


def _in_place_move(model: nn.Module, device: Any) -> nn.Module:
    """What torch does for CPU <-> CUDA: new storage under the same Parameter objects."""
    for parameter in model.parameters():
        parameter.data = parameter.data.to(torch.float64)
    return model


class InPlaceMover:
    """An accelerator whose move swaps each parameter's data in place (as CPU <-> CUDA
    does), then edits the moved data and fails."""

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("inplace")]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        return _in_place_move(model, device)

    @accel.hookimpl
    def post_move_hook(self, model: nn.Module) -> None:
        _rescale(model)  # shares the Parameter's version counter with the original data
        raise RuntimeError("validation failed")


def test_edits_of_data_moved_in_place_are_not_blamed_on_the_original() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(InPlaceMover())
    model = WithNorm()
    weight, before = model.linear.weight, _values(model)
    note = _failed_move(registry.get_accelerator("inplace"), model)
    assert model.linear.weight is weight and weight.dtype == torch.float32
    assert all(torch.equal(v, before[n]) for n, v in model.state_dict().items())
    assert "the model was restored as it was before the move" in note


@pytest.mark.parametrize("when", ["pre", "post"])
def test_in_swap_mode_only_edits_of_the_originals_are_named(when: str) -> None:
    # torch's swap mode gives each Parameter object the moved implementation (with a
    # version counter of its own); the restore swaps the originals back.
    model = WithNorm()
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        note = _failed_move(_meta(ChangesThenRaises(when, _rescale)), model)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
    assert model.linear.weight.device.type == "cpu"
    if when == "pre":
        assert note.endswith("(accel keeps no copies of values): linear.weight.")
    else:  # the moved copy was rescaled, and dropped
        assert "the model was restored as it was before the move" in note


class SwappingMover:
    """An accelerator whose move turns torch's swap mode on itself (the Parameter objects
    keep their identity, their contents are swapped), optionally rescales a weight
    before it, and then fails."""

    def __init__(self, *, edit_before: bool) -> None:
        self.edit_before = edit_before

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("swapper")]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        if self.edit_before:
            _rescale(model)
        before = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return model.to(torch.float64)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(before)

    @accel.hookimpl
    def post_move_hook(self, model: nn.Module) -> None:
        raise RuntimeError("validation failed")


@pytest.mark.parametrize("edit_before", [False, True])
def test_a_move_that_swaps_in_its_own_hook_is_reported_as_restored_exactly(
    edit_before: bool,
) -> None:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(SwappingMover(edit_before=edit_before))
    model = WithNorm()
    model.linear.weight.grad = torch.ones(4, 4)
    parameters = list(model.parameters())
    before = _values(model)
    note = _failed_move(registry.get_accelerator("swapper"), model)
    assert list(model.parameters()) == parameters  # the same objects
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.linear.weight.grad is not None
    assert torch.equal(model.linear.weight.grad, torch.ones(4, 4))
    for name, value in model.state_dict().items():
        expected = before[name] * 2 if edit_before and name == "linear.weight" else before[name]
        assert torch.equal(value, expected), name
    if edit_before:
        assert "1 tensor was changed in place during the move and keeps" in note
        assert note.endswith("(accel keeps no copies of values): linear.weight.")
    else:
        assert "the model was restored as it was before the move" in note
        assert "no tensor was changed in place" in note
