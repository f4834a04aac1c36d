"""The transaction of every transformation of a model (:func:`transact`): its one
capture, and the undo when it fails.

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

from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import torch
from torch import nn

from accel._util.notes import add_note

__all__ = [
    "ModuleSlots",
    "Path",
    "RestorePoint",
    "SlotContents",
    "counterparts",
    "live_slots",
    "qualified_name",
    "transact",
]

_Result = TypeVar("_Result")


def transact(
    model: nn.Module,
    run: Callable[[RestorePoint], _Result],
    failed: Callable[[list[str]], str],
    *,
    undo: Callable[[], object] = lambda: None,
) -> _Result:
    """One transformation of ``model`` (a move, a materialize, a tensor-parallel or FSDP2
    split) as a transaction: the one capture, ``run(capture)``, and the one rollback.

    If ``run`` raises, ``undo()`` (what a capture of slots cannot put back, such as
    FSDP2's module classes) runs, then the capture's restore, and the exception gets
    the note ``failed(names of the tensors changed in place)``. Every tying step of the
    transformation runs inside this call: the capture is taken once, and a move never
    comes back to this module after it left (tests/tying/test_one_transaction.py).
    """
    capture = RestorePoint(model)
    try:
        return run(capture)
    except BaseException as exc:
        try:
            undo()
        finally:  # the slots are put back even if undo() fails
            add_note(exc, failed(capture.restore()))
        raise


#: A module's qualified path as a linked list, ``(parent path, attribute)``; ``None`` is
#: the model itself. The dotted string is built only where a name is needed.
Path = tuple["Path", str] | None

#: A module's parameter or buffer registry: attribute -> tensor (``None``: an empty slot).
TensorSlots = Mapping[str, torch.Tensor | None]

#: One module's slots: ``(module, path, parameters, buffers, submodules)``.
ModuleSlots = tuple[nn.Module, Path, TensorSlots, TensorSlots, Mapping[str, nn.Module | None]]

#: What a restore puts back of one Parameter: the Parameter, a ``detach()`` of it,
#: its ``requires_grad``, its gradient and a ``detach()`` of the gradient.
_ParameterState = tuple[torch.Tensor, torch.Tensor, bool, torch.Tensor | None, torch.Tensor | None]

# Tensor types that are no wrapper subclass: their data pointer and version counter
# are their own.
_PLAIN: Final = (torch.Tensor, nn.Parameter)


def qualified_name(path: Path, name: str) -> str:
    """``name`` under the module at ``path``, dotted (``"encoder.layer.0.weight"``)."""
    parts = [name]
    while path is not None:
        path, attribute = path
        parts.append(attribute)
    return ".".join(reversed(parts))


def live_slots(model: nn.Module) -> list[ModuleSlots]:
    """Every module of ``model`` with its path and its own slot registries (live, not
    copies), in the order and under the names of ``named_modules()`` (a module
    registered twice once, under its first path)."""
    found: list[ModuleSlots] = []
    visited: set[int] = set()
    stack: list[tuple[nn.Module, Path]] = [(model, None)]
    pop, push, add = stack.pop, stack.append, found.append  # bound once: read per module
    while stack:
        module, path = pop()
        if id(module) in visited:
            continue
        visited.add(id(module))
        # The instance dict once: three lookups through a deep class hierarchy cost more.
        registries = module.__dict__
        children = registries["_modules"]
        add((module, path, registries["_parameters"], registries["_buffers"], children))
        if children:  # most modules are leaves: no reversed() to build for them
            # Reversed, so the first child is popped first: the order of named_modules().
            for name, child in reversed(children.items()):
                if child is not None:
                    push((child, (path, name)))
    return found


class SlotContents:
    """Every module's parameter, buffer and submodule slots at one moment, with each
    module's path (see :func:`live_slots`).

    Holds references, never copies of tensors: :meth:`restore` puts the very same
    objects back, so whatever was in a slot keeps its values.
    """

    __slots__ = ("_saved",)

    def __init__(self, model: nn.Module) -> None:
        self._saved: list[ModuleSlots] = [
            (module, path, dict(parameters), dict(buffers), dict(submodules))
            for module, path, parameters, buffers, submodules in live_slots(model)
        ]

    def modules(self) -> list[ModuleSlots]:
        """``(module, path, parameters, buffers, submodules)`` of each module, as captured."""
        return self._saved

    def tensors(self) -> dict[tuple[int, str, str], torch.Tensor]:
        """``(id(module), attribute, slot kind)`` -> the tensor in that slot, as captured."""
        return {
            (id(module), name, kind): tensor
            for module, _, parameters, buffers, _ in self._saved
            for kind, slots in (("parameter", parameters), ("buffer", buffers))
            for name, tensor in slots.items()
            if tensor is not None
        }

    def restore(self, *, only_look: bool = False) -> bool:
        """Put every captured slot's object back (slots added since are dropped).

        Returns whether any slot had changed; with ``only_look``, nothing is put back.
        """
        changed = False
        for module, _, parameters, buffers, submodules in self._saved:
            for live, saved in (
                (module._parameters, parameters),
                (module._buffers, buffers),
                (module._modules, submodules),
            ):
                # Compared with `is`: `==` would call tensors' elementwise __eq__.
                if len(live) != len(saved) or any(
                    live.get(name) is not value for name, value in saved.items()
                ):
                    if only_look:
                        return True
                    changed = True
                    live.clear()
                    live.update(saved)  # type: ignore[arg-type]
        return changed


def counterparts(before: SlotContents, replacement: nn.Module) -> dict[int, nn.Module]:
    """Map ``id`` of each module in ``before`` to its module in ``replacement``, a module
    that replaced the captured model (a copy, or a wrapper around its modules): itself
    where ``replacement`` holds it, else the module under its qualified name. A module
    found in neither way is left out."""
    by_name = dict(replacement.named_modules())
    held = {id(module) for module in by_name.values()}
    found: dict[int, nn.Module] = {}
    for module, path, _, _, _ in before.modules():
        if id(module) in held:
            found[id(module)] = module
        elif (now := by_name.get("" if path is None else qualified_name(*path))) is not None:
            found[id(module)] = now
    return found


class RestorePoint:
    """What a model looked like before a move; :meth:`restore` puts it back.

    In-place edits are read from version counters (a plain tuple per tensor, not an
    object of a class: it runs on every move). A swap (torch's swap mode, and always for
    wrapper subclasses) gives the tensor object another implementation with a counter of
    its own, so the original counter is read through a ``detach()`` taken before the
    move, which shares it: every Parameter's and gradient's, since a plugin may turn
    swap mode on inside its own hook, and a buffer's where swap mode is on when the move
    begins or the buffer is a wrapper subclass. After an in-place move
    (``param.data = moved``, CPU <-> CUDA) the counter is shared with the moved data
    too, so edits after the move are told apart by :meth:`mark_moved`.
    """

    __slots__ = (
        "_at_move",
        "_model",
        "_parameters",
        "_samples",
        "_slots",
        "_training",
        "_watched",
    )

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        #: The move's one capture of the model's slots: the undo and the tie groups.
        self._slots = SlotContents(model)
        # Unpacked in full: a starred target (`module, *_`) builds a list per module.
        self._training = [(module, module.training) for module, _, _, _, _ in self._slots.modules()]
        swapping = torch.__future__.get_swap_module_params_on_conversion()
        states: dict[int, _ParameterState] = {}
        # id(tensor) -> (the tensor, an alias sharing its version counter)
        watched: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # The first tensor on each device, keyed by the device: reading ``device.type``
        # builds a new string each time (three times the cost of reading the device), so
        # the types are read below, once per device.
        by_device: dict[torch.device, torch.Tensor] = {}
        for _, _, module_parameters, module_buffers, _ in self._slots.modules():
            for parameter in module_parameters.values():
                if parameter is None or (key := id(parameter)) in states:
                    continue
                by_device.setdefault(parameter.device, parameter)
                grad = parameter.grad  # read once: a property, not free on a Parameter
                # A new alias of the same storage (a reference, not a copy) sharing the
                # version counter: a move that swaps the Parameter's contents (torch's
                # swap mode, even turned on inside a hook) leaves it the original's.
                data, grad_data = parameter.detach(), None if grad is None else grad.detach()
                states[key] = (parameter, data, parameter.requires_grad, grad, grad_data)
                watched[key] = (parameter, data)
                if grad is not None and grad_data is not None:
                    watched[id(grad)] = (grad, grad_data)
            for buffer in module_buffers.values():
                if buffer is not None and id(buffer) not in watched:
                    by_device.setdefault(buffer.device, buffer)
                    # A plain tensor is its own alias: its counter stays its own across moves.
                    plain = not swapping and type(buffer) in _PLAIN
                    watched[id(buffer)] = (buffer, buffer if plain else buffer.detach())
        self._parameters = list(states.values())
        self._samples: dict[str, torch.Tensor] = {}
        for device, tensor in by_device.items():
            self._samples.setdefault(device.type, tensor)
        #: Per watched tensor: the tensor, its alias, the alias's counter and the tensor's
        #: data pointer now. Inference tensors have no version counter (nor can they
        #: change outside it), so they are left out.
        self._watched: list[tuple[torch.Tensor, torch.Tensor, int, int]] = [
            (tensor, alias, alias._version, _pointer(tensor))
            for tensor, alias in watched.values()
            if not tensor.is_inference()
        ]
        #: Per watched tensor, its counter when the move gave it other storage (None: it
        #: did not).
        self._at_move: list[int | None] = [None] * len(self._watched)

    def parameter_ids(self) -> set[int]:
        """``id`` of every distinct Parameter of the model when it was captured."""
        return {id(state[0]) for state in self._parameters}

    def slots(self) -> SlotContents:
        """Every module's slots as captured (the tie groups derive from them)."""
        return self._slots

    def device_samples(self) -> dict[str, torch.Tensor]:
        """One tensor of the model per device type it held when captured."""
        return self._samples

    def moved_parameters(self, moved: nn.Module) -> dict[int, nn.Parameter]:
        """Map ``id(parameter before the move)`` to the Parameter now in its slot of
        ``moved`` (the model, or the module that replaced it: see :func:`counterparts`);
        a tie maps to one."""
        found = None if moved is self._model else counterparts(self._slots, moved)
        moved_map: dict[int, nn.Parameter] = {}
        for module, _, parameters, _, _ in self._slots.modules():
            module_now = module if found is None else found.get(id(module))
            if module_now is None:
                continue
            for name, before in parameters.items():
                after = module_now._parameters.get(name)
                if before is not None and after is not None and id(before) not in moved_map:
                    moved_map[id(before)] = after
        return moved_map

    def mark_moved(self) -> None:
        """Call once the move itself is done: in-place edits after this point touch
        the moved tensors, not the values a restore puts back. Notes which tensors
        the move gave other storage, and their counters then."""
        at_move: list[int | None] = []
        for tensor, alias, _, pointer in self._watched:
            # A data pointer tells (cheaply) where there is one; XLA, meta and wrapper
            # tensors have none (0), and their alias tells.
            if pointer or alias is tensor:
                moved = _pointer(tensor) != pointer
            else:
                moved = not torch._C._is_alias_of(tensor, alias)  # type: ignore[attr-defined]
            at_move.append(alias._version if moved else None)
        self._at_move = at_move

    def restore(self) -> list[str]:
        """Put every slot, parameter storage, gradient and training flag back as
        captured; return the qualified names of the tensors whose values were
        changed in place since, which a restore cannot put back (empty if none).

        Conservative where it cannot tell: a move that failed half-way through an
        in-place move counts every edit of the shared counter, and so does an
        in-place move between two XLA (or ``meta``) devices, whose data pointers are 0.
        """
        changed = {
            id(tensor)
            for (tensor, alias, version, _), at_move in zip(
                self._watched, self._at_move, strict=True
            )
            # Moved in place: later edits hit the moved data, which the restore drops.
            if (alias._version if at_move is None else at_move) != version
        }
        # torch's batch-norm kernels update running_mean and running_var in place without
        # bumping their counters; the forward pass that does so also adds one to
        # num_batches_tracked (an ordinary add_, which is counted).
        for _, _, _, buffers, _ in self._slots.modules() if changed else ():
            counter = buffers.get("num_batches_tracked")
            if counter is not None and id(counter) in changed:
                statistics = (buffers.get("running_mean"), buffers.get("running_var"))
                changed.update(id(statistic) for statistic in statistics if statistic is not None)
        for module, training in self._training:
            module.training = training  # the flag only: train()/eval() may be overridden
        self._slots.restore()
        with torch.no_grad():
            for parameter, data, requires_grad, grad, grad_data in self._parameters:
                # Holding the gradient would block swap_tensors (it checks use counts).
                parameter.grad = None
                _put_back(parameter, data, requires_grad)
                if grad is not None and grad_data is not None:
                    _put_back(grad, grad_data, None)
                parameter.grad = grad
                parameter.requires_grad_(requires_grad)
        return _names_of(self._model, changed) if changed else []


def _pointer(tensor: torch.Tensor) -> int:
    # Wrapper subclasses may have no storage to point at; they are compared by alias.
    return tensor.data_ptr() if type(tensor) in _PLAIN else 0


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


def _put_back(tensor: torch.Tensor, data: torch.Tensor, requires_grad: bool | None) -> None:
    """Make ``tensor`` (the same Python object) hold ``data`` again.

    A move either set ``tensor.data`` in place (CPU <-> CUDA) or, in torch's swap
    mode and for wrapper subclasses, swapped the tensor's whole implementation;
    undo whichever happened. Objects the move replaced are untouched and need
    nothing here.

    :param requires_grad: a Parameter's, to rebuild it; ``None`` for a gradient.
    """
    now = tensor.data
    # data_ptr() alone is not enough: it is 0 for every XLA and meta tensor.
    if (
        now.device == data.device
        and now.dtype == data.dtype
        and now.data_ptr() == data.data_ptr()
        and torch._C._is_alias_of(now, data)  # type: ignore[attr-defined]  # not in torch stubs
    ):
        return
    if torch._has_compatible_shallow_copy_type(tensor, data):
        tensor.data = data
    else:
        rebuilt = data.detach() if requires_grad is None else nn.Parameter(data, requires_grad)
        torch.utils.swap_tensors(tensor, rebuilt)  # type: ignore[no-untyped-call]
