"""Moving a model, as one transaction: the move lock, one capture of the model, one
decision whether the move unties (torch's rule, :func:`move_unties`), the hooks in
order, the ties kept on the module the move returned, the optimizers that follow (refused
where none holds any of the model's parameters), and the undo on failure;
:meth:`accel.Accelerator.model_to_device` calls it."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Final, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from accel._core.hooks import AcceleratorHooks
from accel.errors import AcceleratorTypeError
from accel.training._materialize import refuse_meta
from accel.training._optimizers import (
    as_optimizer_list,
    check_optimizers_hold,
    follow_moved_parameters,
)
from accel.tying._capture import RestorePoint, SlotContents, transact
from accel.tying._keeping import Keeper
from accel.types import AcceleratorSpec, MoveContext, TieCheck

__all__ = ["move_model", "move_unties"]

_Model = TypeVar("_Model", bound=nn.Module)


def move_model(
    hooks: AcceleratorHooks,
    spec: AcceleratorSpec,
    device: torch.device,
    tie_check: TieCheck,
    model: _Model,
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
) -> _Model:
    """:meth:`accel.Accelerator.model_to_device` (see there): the move transaction, one
    capture, one decision, the hooks in order, the ties finished on the module the move
    returned, everything undone on failure."""
    if not isinstance(model, nn.Module):
        module, lock = _mp_model_wrapper_parts(model)
        with lock:  # forked processes share the wrapped model's pages: one at a time
            return move_model(hooks, spec, device, tie_check, module, optimizer)
    optimizers = [] if optimizer is None else as_optimizer_list(optimizer)
    # One move of a model at a time: a second thread's snapshot would see the
    # slots the first one emptied for its move. Moves of other models go on.
    with _move_lock(model):
        # Already there, and only accel's fallback would run (no plugin takes part in a
        # move): its model.to(device) provably returns the model unchanged, so there is
        # nothing to do, capture or undo (the capture alone costs half the .to()).
        if (
            not optimizers
            and not spec.unties_weights
            and not any(map(hooks.answered_by_plugin, _MOVE_HOOKS))
            and unchanged_by_torch_move(model, device)
        ):
            return model
        context = MoveContext(spec.name, device, tie_check)
        return transact(  # type: ignore[return-value]
            model,
            functools.partial(_move, hooks, spec, context, model, optimizers),
            functools.partial(_restored_note, device),
        )


def _move(
    hooks: AcceleratorHooks,
    spec: AcceleratorSpec,
    context: MoveContext,
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    capture: RestorePoint,
) -> nn.Module:
    """The move inside its transaction (:func:`~accel.tying._capture.transact`), from
    ``capture``, its one capture: one decision, the hooks in order, the ties kept."""
    device = context.device
    if "meta" in capture.device_samples() and device.type != "meta":
        refuse_meta(model, device)  # no values to move: materialize instead
    if optimizers:
        check_optimizers_hold(optimizers, model, capture.parameter_ids())
    hooks.pre_move_hook(model, device, context)
    # The ties a move keeps are the model's after every pre_move_hook: where a plugin
    # has one (it may change them), read again; else the capture's.
    before = SlotContents(model) if hooks.answered_by_plugin("pre_move_hook") else capture.slots()

    def to_device() -> tuple[nn.Module, str]:
        moved_by = hooks.model_to_device(model, device, context)
        capture.mark_moved()
        return moved_by

    def post_move(moved: nn.Module) -> None:
        hooks.post_move_hook(moved, device, context)

    # The declaration only overrides torch's rule; CPU <-> CUDA never gets past it.
    if spec.unties_weights or move_unties(capture.device_samples(), device):
        # Hollowed only where torch's own Module.to and _apply move the model: a
        # plugin's move, or the model's own _apply, may read any slot.
        hollow = not hooks.answered_by_plugin("model_to_device") and _moved_by_torch(model, before)
        moved = Keeper(before, context, post_move).keep(model, to_device, hollow=hollow)
    else:
        moved, mover = to_device()
        if moved is model or isinstance(moved, torch.jit.ScriptModule):
            post_move(moved)
        else:
            # A module a plugin returned in the model's place is checked on any move:
            # whatever device it is on, it must have the model's ties.
            returned = (moved, mover)
            moved = Keeper(before, context, post_move).keep(model, lambda: returned)
    if optimizers:
        follow_moved_parameters(optimizers, capture.moved_parameters(moved), device)
    return moved


#: The hooks through which a plugin takes part in a move: with none of them, the move
#: is accel's fallback alone, torch's ``model.to(device)``.
_MOVE_HOOKS: Final = ("pre_move_hook", "model_to_device", "post_move_hook")

# torch's own implementations, which unchanged_by_torch_move reasons about.
_MODULE_TO: Final = torch.nn.Module.to
_MODULE_APPLY: Final = torch.nn.Module._apply


def unchanged_by_torch_move(model: nn.Module, device: torch.device) -> bool:
    """Whether torch's own ``model.to(device)`` provably changes nothing in ``model``,
    so that a move which runs no plugin code has nothing to do.

    True when neither of torch's conversion flags is set, the model's ``to`` and every
    module's ``_apply`` are torch's own, and every parameter, gradient and buffer is a
    plain tensor already on ``device``: each ``.to(device)`` then returns the tensor
    itself and ``Module._apply`` sets each Parameter's data to what it already holds.
    A walk of the slots, no alias, counter or copy: a tenth of the capture's cost.
    """
    future = torch.__future__
    if (
        future.get_swap_module_params_on_conversion()
        or future.get_overwrite_module_params_on_conversion()
        or type(model).to is not _MODULE_TO
    ):
        return False
    parameter_type = torch.nn.Parameter
    # An inline walk rather than a generator over the modules, which doubles its cost.
    visited: set[int] = set()
    stack: list[nn.Module | None] = [model]
    while stack:
        module = stack.pop()
        if module is None or id(module) in visited:
            continue
        visited.add(id(module))
        if type(module)._apply is not _MODULE_APPLY:
            return False
        registries = module.__dict__
        for parameter in registries["_parameters"].values():
            if parameter is not None and (
                type(parameter) is not parameter_type
                or parameter.device != device
                or ((grad := parameter.grad) is not None and not _stays(grad, device))
            ):
                return False
        for buffer in registries["_buffers"].values():
            if buffer is not None and not _stays(buffer, device):
                return False
        stack.extend(registries["_modules"].values())
    return True


def _moved_by_torch(model: nn.Module, slots: SlotContents) -> bool:
    """Whether torch's own ``Module.to`` and ``_apply`` move every module of ``slots``
    (none of the model's classes overrides them)."""
    return type(model).to is _MODULE_TO and all(
        type(module)._apply is _MODULE_APPLY for module, _, _, _, _ in slots.modules()
    )


def _stays(tensor: torch.Tensor, device: torch.device) -> bool:
    return type(tensor) is torch.Tensor and tensor.device == device


# -- the decision: torch's own rule ---------------------------------------------------
#
# ``Module._apply`` keeps each Parameter object (so each tie) when it swaps tensors
# (``torch.__future__.get_swap_module_params_on_conversion()``, or a wrapper subclass
# as the result) or sets ``param.data`` in place, which it does only where
# ``torch._has_compatible_shallow_copy_type(param, moved)`` and the overwrite flag
# (``get_overwrite_module_params_on_conversion()``) is off. Otherwise every slot gets a
# Parameter of its own: XLA, ``meta`` and every PrivateUse1 backend, in both directions.
# The compatibility is measured once per pair of device types, on an empty tensor, the
# first time a move between them happens (so on devices the move touches anyway: no
# device runtime is started for it); the flags are read on every move.

# (source device type, target device type) -> whether torch keeps Parameters in place.
_KEEPS: dict[tuple[str, str], bool] = {}


def move_unties(samples: dict[str, torch.Tensor], target: torch.device) -> bool:
    """Whether moving tensors like ``samples`` (one tensor per device type the model
    holds) to ``target`` gives tied slots Parameters of their own, by torch's rule."""
    if torch.__future__.get_swap_module_params_on_conversion():
        return False  # every Parameter keeps its identity through swap_tensors
    if torch.__future__.get_overwrite_module_params_on_conversion():
        return bool(samples)  # a new Parameter for every slot, wherever it goes
    for source, sample in samples.items():
        if source == target.type:  # the same tensor implementation: kept in place
            continue
        if (keeps := _KEEPS.get((source, target.type))) is None:
            keeps = _KEEPS[source, target.type] = _measure(sample, target)
        if not keeps:
            return True
    return False


def _measure(sample: torch.Tensor, target: torch.device) -> bool:
    """torch's decision for an empty tensor like ``sample`` moved to ``target``.

    A device that cannot make or receive a tensor outside its own move (a backend
    with no kernels for ``.to``) counts as untying: keeping ties that were kept anyway
    costs time, never correctness.
    """
    try:
        with torch.no_grad():
            probe = sample.detach().new_empty(0)
            moved = probe.to(target)
    except Exception:
        return False
    return is_traceable_wrapper_subclass(moved) or bool(
        torch._has_compatible_shallow_copy_type(probe, moved)
    )


#: What a restore puts back, for the note on a failed move.
_RESTORED = (
    "every parameter, buffer and submodule slot, the parameters' data, gradients and "
    "requires_grad, and every module's training mode"
)
# Tensors named in full in the note; a longer list is cut.
_UNRESTORED_SHOWN = 10


def _restored_note(device: torch.device, unrestored: list[str]) -> str:
    """The note on a failed move: what was restored and, exactly, what was not."""
    if not unrestored:
        return (
            f"accel: moving the model to {device} failed; the model was restored as it was "
            f"before the move ({_RESTORED}; no tensor was changed in place)."
        )
    shown = ", ".join(unrestored[:_UNRESTORED_SHOWN])
    if len(unrestored) > _UNRESTORED_SHOWN:
        shown += f" and {len(unrestored) - _UNRESTORED_SHOWN} more"
    return (
        f"accel: moving the model to {device} failed; accel restored {_RESTORED}, but "
        f"{len(unrestored)} tensor{'s were' if len(unrestored) != 1 else ' was'} changed in "
        f"place during the move and keep{'' if len(unrestored) != 1 else 's'} the new values "
        f"(accel keeps no copies of values): {shown}."
    )


# id(model) -> (a weak reference to it, its move lock). Kept here rather than as an
# attribute of the model, which would break copy.deepcopy and pickling of the model
# (locks are neither copyable nor picklable). Keyed by id rather than by the model
# (a WeakKeyDictionary) so that a model with its own __eq__/__hash__ works too; the
# weak reference's callback drops the entry before the id can be reused.
_MOVE_LOCKS: dict[int, tuple[weakref.ref[nn.Module], threading.RLock]] = {}
# Re-entrant: a collection may run inside the guarded block (any allocation can start
# one) and call _forget_lock for another model on the same thread.
_MOVE_LOCKS_GUARD = threading.RLock()


def _move_lock(model: nn.Module) -> threading.RLock:
    """The lock that serialises moves of ``model``, created on its first move.

    Re-entrant: a hook may move the same model again from the same thread.
    """
    key = id(model)
    entry = _MOVE_LOCKS.get(key)  # the common case, without the guard
    if entry is not None and entry[0]() is model:
        return entry[1]
    with _MOVE_LOCKS_GUARD:
        entry = _MOVE_LOCKS.get(key)
        if entry is None or entry[0]() is not model:
            reference = weakref.ref(model, functools.partial(_forget_lock, key))
            entry = _MOVE_LOCKS[key] = (reference, threading.RLock())
        return entry[1]


def _forget_lock(key: int, reference: weakref.ref[nn.Module]) -> None:
    with _MOVE_LOCKS_GUARD:
        entry = _MOVE_LOCKS.get(key)
        if entry is not None and entry[0] is reference:
            del _MOVE_LOCKS[key]


def _mp_model_wrapper_parts(obj: object) -> tuple[nn.Module, Any]:
    """The model and lock inside ``obj``, torch_xla's ``MpModelWrapper`` (not a module);
    anything else that is not a module is refused.

    Recognised by its class, without importing torch_xla; the attributes are the ones
    its own ``to()`` uses (stable across torch_xla releases).
    """
    cls = type(obj)
    if cls.__name__ != "MpModelWrapper" or not cls.__module__.startswith("torch_xla"):
        raise AcceleratorTypeError(
            f"model_to_device expects a torch.nn.Module, got {cls.__name__}; "
            f"use batch_to_device for tensors and containers of tensors"
        )
    module, lock = getattr(obj, "_model", None), getattr(obj, "_lock", None)
    if module is None or lock is None:
        raise AcceleratorTypeError(
            f"model_to_device got a torch_xla MpModelWrapper without the _model/_lock "
            f"attributes accel knows ({cls.__module__}); move its model yourself with "
            f"model_to_device(wrapper._model) or pass the model unwrapped"
        )
    return module, lock
