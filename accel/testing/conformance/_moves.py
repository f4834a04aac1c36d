"""Promises of model moves: values and dtypes, ties kept and never created, both ways,
the optimizer following, and the rollback of a failed move."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accel.testing.conformance._catalog import Subject, promise
from accel.testing.conformance._models import (
    TiedModel,
    TwinModel,
    cpu_copy,
    parameter_names,
    same_values,
    sgd_for,
    unique_parameters,
)

__all__ = ["PROMISES"]


def _on(model: nn.Module, device_type: str, what: str) -> None:
    for name, tensor in model.state_dict(keep_vars=True).items():
        assert tensor.device.type == device_type, (
            f"{what}: {name} is on {tensor.device}, not on a {device_type} device"
        )


def _tied(model: TiedModel, what: str, subject: Subject) -> None:
    assert model.head.weight is model.embed.weight, (
        f"{what}: head.weight and embed.weight are no longer one Parameter "
        f"({unique_parameters(model)} unique parameters, were 3).{_tie_remedy(subject)}"
    )
    assert unique_parameters(model) == 3, f"{what}: {unique_parameters(model)} parameters, were 3"


def _tie_remedy(subject: Subject) -> str:
    """What a vendor does about a lost tie: the usual cause is a device whose moves give
    every slot a Parameter of its own, which torch's rule did not see (a stand-in device,
    a move of the plugin's own), and the declaration that makes accel keep the ties."""
    spec = subject.accelerator.spec
    if spec.unties_weights:
        return (
            f" {spec.name!r} declares unties_weights=True, so accel kept the ties: a hook "
            f"that runs after the move (post_move_hook, or a cross-cutting plugin's) broke it"
        )
    return (
        f" If this device's moves give every slot a Parameter of its own (as on XLA and "
        f"every PrivateUse1 backend), declare it in register_accelerators: "
        f"AcceleratorSpec({spec.name!r}, ..., unties_weights=True), and accel keeps the "
        f"ties on every move; otherwise a model_to_device or post_move_hook hook broke it"
    )


def _optimizer_holds(optimizer: torch.optim.Optimizer, model: nn.Module, what: str) -> None:
    held = [p for group in optimizer.param_groups for p in group["params"]]
    ids = {id(p) for p in held}
    missing = [
        name for name, p in model.named_parameters(remove_duplicate=False) if id(p) not in ids
    ]
    assert not missing, f"{what}: the optimizer no longer holds {', '.join(missing)}"
    assert len(held) == unique_parameters(model), (
        f"{what}: the optimizer holds {len(held)} tensors for {unique_parameters(model)} parameters"
    )


@promise("moves.values_and_dtypes", "a move keeps every value and dtype, both ways")
def values_and_dtypes(subject: Subject) -> None:
    acc = subject.accelerator
    model = TiedModel()
    before = cpu_copy(model)
    model = acc.model_to_device(model)
    _on(model, acc.device.type, "to the device")
    same_values(cpu_copy(model), before, "to the device")
    model = subject.registry.get_accelerator("cpu").model_to_device(model)
    _on(model, "cpu", "back to the CPU")
    same_values(cpu_copy(model), before, "back to the CPU")


@promise(
    "moves.ties_kept_to_device",
    "a tied weight is one Parameter on the device, and the optimizer holds it once",
)
def ties_kept_to_device(subject: Subject) -> None:
    model = TiedModel()
    optimizer = sgd_for(model)
    model = subject.accelerator.model_to_device(model, optimizer=optimizer)
    _tied(model, "to the device", subject)
    _optimizer_holds(optimizer, model, "to the device")


@promise(
    "moves.ties_kept_back_to_cpu",
    "moved back to the CPU, the tie is still one Parameter, and the optimizer follows",
)
def ties_kept_back_to_cpu(subject: Subject) -> None:
    model = TiedModel()
    optimizer = sgd_for(model)
    model = subject.accelerator.model_to_device(model, optimizer=optimizer)
    cpu = subject.registry.get_accelerator("cpu")
    model = cpu.model_to_device(model, optimizer=optimizer)
    _on(model, "cpu", "back to the CPU")
    _tied(model, "back to the CPU", subject)
    _optimizer_holds(optimizer, model, "back to the CPU")
    assert parameter_names(model) == parameter_names(TiedModel()), (
        f"back to the CPU: the parameters are {parameter_names(model)}"
    )


@promise(
    "moves.no_tie_created",
    "two equal but separate weights stay separate, both ways",
)
def no_tie_created(subject: Subject) -> None:
    model = TwinModel()
    model = subject.accelerator.model_to_device(model)
    assert model.first.weight is not model.second.weight, "to the device: a tie was created"
    model = subject.registry.get_accelerator("cpu").model_to_device(model)
    assert model.first.weight is not model.second.weight, "back to the CPU: a tie was created"
    with torch.no_grad():
        model.first.weight.add_(1.0)
    assert not torch.equal(model.first.weight, model.second.weight), (
        "back to the CPU: the two weights share storage"
    )


class _PlantedMoveError(RuntimeError):
    """The failure the kit plants in the middle of a move."""


#: The tensor methods a move copies a tensor with, whatever the plugin's move is
#: (``Module.to`` calls ``to``; a hand-written move ``clone`` or ``cpu``). Not
#: ``detach``: accel's restore point takes views of the parameters before the move.
_MOVING = frozenset({torch.Tensor.to, torch.Tensor.clone, torch.Tensor.cpu})


class _RefusesToMove(torch.Tensor):
    """A tensor that cannot be copied while :attr:`armed`; as a parameter, the move
    fails on it."""

    armed = False

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if cls.armed and func in _MOVING:
            raise _PlantedMoveError("the conformance kit's planted failure")
        return super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        # A move that deep-copies the model (a replacement module) meets the planted
        # failure too, not torch's own refusal to deep-copy a tensor subclass.
        if type(self).armed:
            raise _PlantedMoveError("the conformance kit's planted failure")
        return super().__deepcopy__(memo)  # type: ignore[no-untyped-call]


class _FailsToMove(nn.Module):
    """Registered last, so that the other submodules have moved when it fails."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2).as_subclass(_RefusesToMove))


@promise(
    "moves.rollback",
    "a move that fails midway raises, and the model is back as it was: the same "
    "Parameters on the CPU, tied, with their values, the optimizer holding them",
)
def rollback(subject: Subject) -> None:
    model = TiedModel()
    model.add_module("fails", _FailsToMove())
    optimizer = sgd_for(model)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    before = cpu_copy(model)
    _RefusesToMove.armed = True
    try:
        subject.accelerator.model_to_device(model, optimizer=optimizer)
    except _PlantedMoveError:
        pass
    else:
        raise AssertionError(
            "a move with a parameter that cannot be copied did not raise (the kit plants "
            "that failure; a model_to_device hook must let it through)"
        )
    finally:
        _RefusesToMove.armed = False
    after = dict(model.named_parameters(remove_duplicate=False))
    changed = [name for name, p in parameters.items() if after.get(name) is not p]
    assert not changed, f"after the failed move, other objects hold {', '.join(changed)}"
    _on(model, "cpu", "after the failed move")
    same_values(cpu_copy(model), before, "after the failed move")
    assert model.head.weight is model.embed.weight, "after the failed move: the tie came apart"
    _optimizer_holds(optimizer, model, "after the failed move")


PROMISES = (values_and_dtypes, ties_kept_to_device, ties_kept_back_to_cpu, no_tie_created, rollback)
