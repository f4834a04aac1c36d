"""Undoing a failed model move.

A :class:`RestorePoint` keeps *references* to everything a move can change (the
objects in every parameter, buffer and submodule slot, each parameter's data,
gradient and ``requires_grad``, every module's training flag), never copies of
tensors, so it costs a few dictionaries however large the model is.

Values changed in place (a hook rescaling a weight, a forward pass updating
BatchNorm statistics) cannot be put back without a copy, and copying every tensor
before every move would double the model's memory. Instead each tensor's version
counter (``tensor._version``, bumped by in-place operations) is read before the
move, and :meth:`RestorePoint.restore` names the tensors whose values changed,
so the note on a failed move says exactly what was and was not restored. (torch's
batch-norm kernels write running statistics without bumping their counters; those
are inferred from the layer's ``num_batches_tracked``. A custom kernel that writes
in place without bumping the counter stays invisible.)
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


class _VersionWatch:
    """One tensor's in-place edits, read from its version counter.

    ``alias`` is a ``detach()`` of the tensor taken before the move: it shares the
    original storage's version counter even after torch's swap mode has given the
    tensor object another implementation. After an in-place move (``param.data =
    moved``, CPU <-> CUDA) the counter is shared with the moved data too, so edits
    after the move are told apart by :meth:`mark_moved`.
    """

    __slots__ = ("alias", "moved", "tensor", "version", "version_at_move")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.alias = tensor.detach()
        self.version: int = self.alias._version
        #: Whether the move had given the tensor other storage (read by mark_moved).
        self.moved = False
        self.version_at_move: int | None = None

    def mark_moved(self) -> None:
        self.moved = not _same_storage(self.tensor, self.alias)
        self.version_at_move = self.alias._version

    def changed(self) -> bool:
        """Whether the values the restore puts back were changed in place.

        Conservative where it cannot tell: a move that failed half-way through an
        in-place move counts every edit of the shared counter.
        """
        if self.moved and self.version_at_move is not None:
            return self.version_at_move != self.version  # later edits hit the moved data
        return self.alias._version != self.version


def _watch(tensor: torch.Tensor | None, watches: dict[int, _VersionWatch]) -> None:
    if tensor is None or id(tensor) in watches or tensor.is_inference():
        return  # inference tensors have no version counter (nor can they change outside it)
    watches[id(tensor)] = _VersionWatch(tensor)


class RestorePoint:
    """What a model looked like before a move; :meth:`restore` puts it back."""

    __slots__ = ("_model", "_parameters", "_slots", "_training", "_watches")

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._slots = SlotContents(model)
        self._training = [(module, module.training) for module, _, _, _ in self._slots.modules()]
        watches: dict[int, _VersionWatch] = {}
        for _, parameters, buffers, _ in self._slots.modules():
            for parameter in parameters.values():
                _watch(parameter, watches)
                _watch(None if parameter is None else parameter.grad, watches)
            for buffer in buffers.values():
                _watch(buffer, watches)
        self._watches = list(watches.values())
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

    def mark_moved(self) -> None:
        """Call once the move itself is done: in-place edits after this point touch
        the moved tensors, not the values a restore puts back."""
        for watch in self._watches:
            watch.mark_moved()

    def restore(self) -> list[str]:
        """Put every slot, parameter storage, gradient and training flag back as
        captured; return the qualified names of the tensors whose values were
        changed in place since, which a restore cannot put back (empty if none).
        """
        import torch

        changed = {id(watch.tensor) for watch in self._watches if watch.changed()}
        if changed:
            _add_running_statistics(self._slots, changed)
        for module, training in self._training:
            module.training = training  # the flag only: train()/eval() may be overridden
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
        return _names_of(self._model, changed) if changed else []


def _add_running_statistics(slots: SlotContents, changed: set[int]) -> None:
    """Count a norm layer's running statistics as changed when its batch counter is.

    torch's batch-norm kernels update ``running_mean`` and ``running_var`` in place
    without bumping their version counters; the forward pass that does so also adds
    one to ``num_batches_tracked`` (an ordinary ``add_``, which is counted).
    """
    for _, _, buffers, _ in slots.modules():
        counter = buffers.get("num_batches_tracked")
        if counter is not None and id(counter) in changed:
            for name in ("running_mean", "running_var"):
                statistic = buffers.get(name)
                if statistic is not None:
                    changed.add(id(statistic))


def _names_of(model: nn.Module, tensor_ids: set[int]) -> list[str]:
    """The qualified names of the tensors in ``tensor_ids`` (a gradient as ``NAME.grad``),
    each tensor once, in the model's order."""
    names: dict[int, str] = {}
    for name, parameter in model.named_parameters():
        for tensor, qualified in ((parameter, name), (parameter.grad, f"{name}.grad")):
            if tensor is not None and id(tensor) in tensor_ids:
                names.setdefault(id(tensor), qualified)
    for name, buffer in model.named_buffers():
        if id(buffer) in tensor_ids:
            names.setdefault(id(buffer), name)
    return list(names.values())


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
    import torch

    # data_ptr() alone is not enough: it is 0 for every XLA and meta tensor.
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and torch._C._is_alias_of(a, b)  # type: ignore[attr-defined]  # not in torch stubs
    )
