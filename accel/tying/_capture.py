"""The one capture a move takes of a model, and the undo of a failed move.

:class:`SlotContents` holds every module's parameter, buffer and submodule slots (and
each module's path) at one moment; the tie groups of a move that unties derive from
it (:mod:`accel.tying`), and so does :class:`RestorePoint`, which also keeps
*references* to everything else a move can change (each parameter's data, gradient
and ``requires_grad``, every module's training flag), never copies of tensors, so it
costs a few dictionaries however large the model is.

Values changed in place (a hook rescaling a weight, BatchNorm statistics) cannot be put
back without copies; each tensor's version counter is read before the move instead, and
:meth:`RestorePoint.restore` names the tensors whose values changed. (torch's batch-norm
kernels do not bump their counters; ``num_batches_tracked`` tells. A custom kernel that
writes in place without bumping the counter stays invisible.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["Path", "RestorePoint", "SlotContents", "qualified_name"]


#: A module's qualified path as a linked list, ``(parent path, attribute)``; ``None`` is
#: the model itself. The dotted string is built only where a name is needed.
Path = tuple["Path", str] | None

_Slots = tuple[
    "nn.Module",
    dict[str, "torch.Tensor | None"],
    dict[str, "torch.Tensor | None"],
    dict[str, "nn.Module | None"],
]


def qualified_name(path: Path, name: str) -> str:
    """``name`` under the module at ``path``, dotted (``"encoder.layer.0.weight"``)."""
    parts = [name]
    while path is not None:
        path, attribute = path
        parts.append(attribute)
    return ".".join(reversed(parts))


class SlotContents:
    """Every module's parameter, buffer and submodule slots at one moment, with each
    module's path (pre-order, a module registered twice once, under its first path).

    Holds references, never copies of tensors: :meth:`restore` puts the very same
    objects back, so whatever was in a slot keeps its values.
    """

    __slots__ = ("_paths", "_saved")

    def __init__(self, model: nn.Module) -> None:
        saved: list[_Slots] = []
        paths: list[Path] = []
        visited: set[int] = set()
        stack: list[tuple[nn.Module, Path]] = [(model, None)]
        while stack:
            module, path = stack.pop()
            if id(module) in visited:
                continue
            visited.add(id(module))
            # The instance dict once: three lookups through a deep class hierarchy cost more.
            registries = module.__dict__
            children = registries["_modules"]
            saved.append(
                (
                    module,
                    dict(registries["_parameters"]),
                    dict(registries["_buffers"]),
                    dict(children),
                )
            )
            paths.append(path)
            # Reversed, so the first child is popped first: the order of named_modules().
            for name, child in reversed(children.items()):
                if child is not None:
                    stack.append((child, (path, name)))
        self._saved = saved
        self._paths = paths

    def modules(self) -> list[_Slots]:
        """``(module, parameters, buffers, submodules)`` of each module, as captured."""
        return self._saved

    def paths(self) -> list[Path]:
        """Each module's :data:`Path`, in the order of :meth:`modules`."""
        return self._paths

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
    """In-place edits of a model's tensors, read from their version counters.

    Plain lists, not an object per tensor: it runs on every move. A swap (torch's
    swap mode, and always for wrapper subclasses) gives the tensor object another
    implementation with a counter of its own, so for those the original counter is
    read through a ``detach()`` taken before the move, which shares it: every
    Parameter's and gradient's (the restore point takes one anyway), since a plugin
    may turn swap mode on inside its own hook, and other tensors' where swap mode is
    on when the move begins or the tensor is a wrapper subclass. After an
    in-place move (``param.data = moved``, CPU <-> CUDA) the counter is shared with
    the moved data too, so edits after the move are told apart by :meth:`mark_moved`.
    """

    __slots__ = ("_aliases", "_moved", "_pointers", "_tensors", "_versions", "_versions_at_move")

    def __init__(
        self, tensors: list[torch.Tensor], aliases: list[torch.Tensor | None] | None = None
    ) -> None:
        """:param aliases: a ``detach()`` of each tensor taken already (sharing its
        counter), or ``None`` where there is none; the others get one as needed."""
        swapping = torch.__future__.get_swap_module_params_on_conversion()
        plain = _plain_types()
        self._tensors = tensors
        # A plain tensor is its own alias: its counter stays its own across moves.
        self._aliases = [
            alias if alias is not None else (t.detach() if swapping or type(t) not in plain else t)
            for t, alias in zip(tensors, aliases or [None] * len(tensors), strict=True)
        ]
        self._versions = [alias._version for alias in self._aliases]
        self._pointers = [_pointer(t, plain) for t in tensors]
        self._moved: list[bool] | None = None
        self._versions_at_move: list[int] = []

    def mark_moved(self) -> None:
        """Note which tensors the move gave other storage, and their counters then."""

        plain = _plain_types()
        # A data pointer tells (cheaply) where there is one; XLA, meta and wrapper
        # tensors have none (0), and their alias tells.
        self._moved = [
            _pointer(t, plain) != pointer
            if pointer or alias is t
            else not torch._C._is_alias_of(t, alias)  # type: ignore[attr-defined]
            for t, alias, pointer in zip(self._tensors, self._aliases, self._pointers, strict=True)
        ]
        self._versions_at_move = [alias._version for alias in self._aliases]

    def changed(self) -> list[torch.Tensor]:
        """The tensors whose values, as the restore puts them back, were changed in place.

        Conservative where it cannot tell: a move that failed half-way through an
        in-place move counts every edit of the shared counter, and so does an
        in-place move between two XLA (or ``meta``) devices, whose data pointers are 0.
        """
        moved = self._moved or [False] * len(self._tensors)
        return [
            tensor
            for tensor, alias, version, was_moved, at_move in zip(
                self._tensors,
                self._aliases,
                self._versions,
                moved,
                self._versions_at_move or self._versions,
                strict=True,
            )
            # Moved in place: later edits hit the moved data, which the restore drops.
            if (at_move if was_moved else alias._version) != version
        ]


def _pointer(tensor: torch.Tensor, plain: tuple[type, ...]) -> int:
    # Wrapper subclasses may have no storage to point at; they are compared by alias.
    return tensor.data_ptr() if type(tensor) in plain else 0


@functools.cache
def _plain_types() -> tuple[type, ...]:
    return (torch.Tensor, torch.nn.Parameter)


class RestorePoint:
    """What a model looked like before a move; :meth:`restore` puts it back."""

    __slots__ = ("_model", "_parameters", "_samples", "_slots", "_training", "_watches")

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        #: The move's one capture of the model's slots: the undo and the tie groups.
        self._slots = SlotContents(model)
        self._training = [(module, module.training) for module, _, _, _ in self._slots.modules()]
        states: dict[int, _ParameterState] = {}
        buffers: dict[int, torch.Tensor] = {}
        samples: dict[str, torch.Tensor] = {}
        for _, module_parameters, module_buffers, _ in self._slots.modules():
            for parameter in module_parameters.values():
                if parameter is None or id(parameter) in states:
                    continue
                samples.setdefault(parameter.device.type, parameter)
                grad = parameter.grad  # read once: a property, not free on a Parameter
                states[id(parameter)] = _ParameterState(
                    parameter,  # type: ignore[arg-type]
                    # A new alias of the same storage (a reference, not a copy) sharing
                    # the version counter: a move that swaps the Parameter's contents
                    # (torch's swap mode, even turned on inside a hook) leaves it the
                    # original's, so the watch reads edits of the values put back.
                    parameter.detach(),
                    parameter.requires_grad,
                    grad,
                    None if grad is None else grad.detach(),
                )
            for buffer in module_buffers.values():
                if buffer is not None and id(buffer) not in buffers:
                    buffers[id(buffer)] = buffer
                    samples.setdefault(buffer.device.type, buffer)
        self._parameters = list(states.values())
        self._samples = samples
        watched: list[tuple[torch.Tensor, torch.Tensor | None]] = [
            (state.parameter, state.data) for state in self._parameters
        ]
        watched += [
            (state.grad, state.grad_data) for state in self._parameters if state.grad is not None
        ]
        watched += [(buffer, None) for key, buffer in buffers.items() if key not in states]
        # Inference tensors have no version counter (nor can they change outside it).
        kept = [(t, alias) for t, alias in watched if not t.is_inference()]
        self._watches = _VersionWatch([t for t, _ in kept], [alias for _, alias in kept])

    def parameter_ids(self) -> set[int]:
        """``id`` of every distinct Parameter of the model when it was captured."""
        return {id(state.parameter) for state in self._parameters}

    def slots(self) -> SlotContents:
        """Every module's slots as captured (the tie groups derive from them)."""
        return self._slots

    def device_samples(self) -> dict[str, torch.Tensor]:
        """One tensor of the model per device type it held when captured."""
        return self._samples

    def moved_parameters(self, moved: nn.Module) -> dict[int, nn.Parameter]:
        """Map ``id(parameter before the move)`` to the Parameter now in its slot of
        ``moved`` (the model, or the module that replaced it: its modules matched by
        identity where it holds them, else by qualified name); a tie maps to one."""
        captured = self._slots.modules()
        now: list[nn.Module | None]
        if moved is self._model:
            now = [module for module, _, _, _ in captured]
        else:
            replacement = SlotContents(moved)
            held = {id(module) for module, _, _, _ in replacement.modules()}
            by_path = {
                qualified_name(path, ""): module
                for (module, _, _, _), path in zip(
                    replacement.modules(), replacement.paths(), strict=True
                )
            }
            now = [
                module if id(module) in held else by_path.get(qualified_name(path, ""))
                for (module, _, _, _), path in zip(captured, self._slots.paths(), strict=True)
            ]
        moved_map: dict[int, nn.Parameter] = {}
        for (_, parameters, _, _), module_now in zip(captured, now, strict=True):
            if module_now is None:
                continue
            for name, before in parameters.items():
                after = module_now._parameters.get(name)
                if before is not None and after is not None and id(before) not in moved_map:
                    moved_map[id(before)] = after
        return moved_map

    def mark_moved(self) -> None:
        """Call once the move itself is done: in-place edits after this point touch
        the moved tensors, not the values a restore puts back."""
        self._watches.mark_moved()

    def restore(self) -> list[str]:
        """Put every slot, parameter storage, gradient and training flag back as
        captured; return the qualified names of the tensors whose values were
        changed in place since, which a restore cannot put back (empty if none).
        """

        changed = {id(tensor) for tensor in self._watches.changed()}
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

    if _same_storage(tensor.data, data):
        return
    if torch._has_compatible_shallow_copy_type(tensor, data):
        tensor.data = data
    else:
        torch.utils.swap_tensors(tensor, rebuild(data))  # type: ignore[no-untyped-call]


def _as_parameter(data: torch.Tensor, state: _ParameterState) -> torch.Tensor:
    return torch.nn.Parameter(data, requires_grad=state.requires_grad)


def _as_plain_tensor(data: torch.Tensor) -> torch.Tensor:
    return data.detach()


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    # data_ptr() alone is not enough: it is 0 for every XLA and meta tensor.
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and torch._C._is_alias_of(a, b)  # type: ignore[attr-defined]  # not in torch stubs
    )
