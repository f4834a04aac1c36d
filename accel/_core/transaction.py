"""Undoing a failed model move.

A :class:`RestorePoint` keeps *references* to everything a move can change (the
objects in every parameter, buffer and submodule slot, each parameter's data,
gradient and ``requires_grad``), never copies of tensors, so it costs a few
dictionaries however large the model is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accel._core.walk import each_module

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["RestorePoint", "SlotContents"]


_Slots = tuple[
    "nn.Module",
    dict[str, "torch.Tensor | None"],
    dict[str, "torch.Tensor | None"],
    dict[str, "nn.Module | None"],
]


class SlotContents:
    """Every module's parameter, buffer and submodule slots at one moment.

    Holds references, never copies of tensors: :meth:`restore` puts the very same
    objects back, so whatever was in a slot keeps its values.
    """

    __slots__ = ("_saved",)

    def __init__(self, model: nn.Module) -> None:
        self._saved: list[_Slots] = [
            (module, dict(module._parameters), dict(module._buffers), dict(module._modules))
            for module in each_module(model)
        ]

    def modules(self) -> list[_Slots]:
        """``(module, parameters, buffers, submodules)`` of each module, as captured."""
        return self._saved

    def restore(self) -> bool:
        """Put every captured slot's object back (slots added since are dropped).

        Returns whether any slot had changed.
        """
        changed = False
        for module, parameters, buffers, submodules in self._saved:
            for live, saved in (
                (module._parameters, parameters),
                (module._buffers, buffers),
                (module._modules, submodules),
            ):
                # Compared with `is`: `==` would call tensors' elementwise __eq__.
                if len(live) != len(saved) or any(
                    live.get(name) is not value for name, value in saved.items()
                ):
                    changed = True
                    live.clear()
                    live.update(saved)  # type: ignore[arg-type]
        return changed


@dataclass(frozen=True)
class _ParameterState:
    parameter: nn.Parameter
    data: torch.Tensor
    requires_grad: bool
    grad: torch.Tensor | None
    grad_data: torch.Tensor | None


class RestorePoint:
    """What a model looked like before a move; :meth:`restore` puts it back."""

    __slots__ = ("_parameters", "_slots")

    def __init__(self, model: nn.Module) -> None:
        self._slots = SlotContents(model)
        states: dict[int, _ParameterState] = {}
        for _, parameters, _, _ in self._slots.modules():
            for parameter in parameters.values():
                if parameter is None or id(parameter) in states:
                    continue
                grad = parameter.grad
                states[id(parameter)] = _ParameterState(
                    parameter,  # type: ignore[arg-type]
                    # .data is a new alias of the same storage: a reference, not a copy.
                    parameter.data,
                    parameter.requires_grad,
                    grad,
                    None if grad is None else grad.data,
                )
        self._parameters = list(states.values())

    def parameter_ids(self) -> set[int]:
        """``id`` of every distinct Parameter of the model when it was captured."""
        return {id(state.parameter) for state in self._parameters}

    def moved_parameters(self) -> dict[int, nn.Parameter]:
        """Map ``id(parameter before the move)`` to the Parameter now in its slot.

        Read after a move: follows every slot captured before it, so a tied
        parameter maps to the one re-tied object.
        """
        moved: dict[int, nn.Parameter] = {}
        for module, parameters, _, _ in self._slots.modules():
            for name, before in parameters.items():
                after = module._parameters.get(name)
                if before is not None and after is not None and id(before) not in moved:
                    moved[id(before)] = after
        return moved

    def restore(self) -> None:
        """Put every slot, parameter storage and gradient back as captured."""
        import torch

        self._slots.restore()
        with torch.no_grad():
            for state in self._parameters:
                parameter = state.parameter
                # Holding the gradient would block swap_tensors (it checks use counts).
                parameter.grad = None
                _put_back(parameter, state.data, functools.partial(_as_parameter, state=state))
                if state.grad is not None and state.grad_data is not None:
                    _put_back(state.grad, state.grad_data, _as_plain_tensor)
                parameter.grad = state.grad
                parameter.requires_grad_(state.requires_grad)


def _put_back(
    tensor: torch.Tensor, data: torch.Tensor, rebuild: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """Make ``tensor`` (the same Python object) hold ``data`` again.

    A move either set ``tensor.data`` in place (CPU <-> CUDA) or, in torch's swap
    mode and for wrapper subclasses, swapped the tensor's whole implementation;
    undo whichever happened. Objects the move replaced are untouched and need
    nothing here.
    """
    import torch

    if _same_storage(tensor.data, data):
        return
    if torch._has_compatible_shallow_copy_type(tensor, data):
        tensor.data = data
    else:
        torch.utils.swap_tensors(tensor, rebuild(data))  # type: ignore[no-untyped-call]


def _as_parameter(data: torch.Tensor, state: _ParameterState) -> torch.Tensor:
    import torch

    return torch.nn.Parameter(data, requires_grad=state.requires_grad)


def _as_plain_tensor(data: torch.Tensor) -> torch.Tensor:
    return data.detach()


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.dtype == b.dtype and a.data_ptr() == b.data_ptr()
