"""Moving a model: the move lock, the hooks in order, tie keeping, the undo on failure
and the optimizers that follow; :meth:`accel.Accelerator.model_to_device` calls it."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from typing import Any, TypeVar

import torch
from torch import nn

from accel._core.hooks import AcceleratorHooks
from accel._core.optimizers import check_optimizers_hold
from accel._core.transaction import RestorePoint
from accel._util.notes import add_note
from accel.errors import AcceleratorTypeError
from accel.training.step import follow_moved_parameters
from accel.tying._keeping import begin_kept_move, finish_kept_move, holds_a_tensor_on
from accel.types import AcceleratorSpec, MoveContext, TieCheck

__all__ = ["move_model"]

_Model = TypeVar("_Model", bound=nn.Module)


def move_model(
    hooks: AcceleratorHooks,
    spec: AcceleratorSpec,
    device: torch.device,
    tie_check: TieCheck,
    model: _Model,
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
) -> _Model:
    """:meth:`accel.Accelerator.model_to_device` (see there)."""
    wrapped = _mp_model_wrapper_parts(model)
    if wrapped is not None:
        module, lock = wrapped
        with lock:  # forked processes share the wrapped model's pages: one at a time
            return move_model(hooks, spec, device, tie_check, module, optimizer)  # type: ignore[return-value]
    if not isinstance(model, nn.Module):
        raise AcceleratorTypeError(
            f"model_to_device expects a torch.nn.Module, got {type(model).__name__}; "
            f"use batch_to_device for tensors and containers of tensors"
        )
    optimizers = _as_optimizer_list(optimizer)
    # One move of a model at a time: a second thread's snapshot would see the
    # slots the first one emptied for its move. Moves of other models go on.
    with _move_lock(model):
        return _move(hooks, spec, device, tie_check, model, optimizers)


def _move(
    hooks: AcceleratorHooks,
    spec: AcceleratorSpec,
    device: torch.device,
    tie_check: TieCheck,
    model: _Model,
    optimizers: list[torch.optim.Optimizer],
) -> _Model:
    restore_point = RestorePoint(model)
    if optimizers:
        check_optimizers_hold(optimizers, model, restore_point.parameter_ids())
    context = MoveContext(spec.name, device, tie_check)
    keeps_ties = _move_unties(hooks, spec, device, model)
    try:
        hooks.pre_move_hook(model, device, context)
        if keeps_ties:  # after every pre_move_hook: each saw the model whole
            begin_kept_move(model, context)
        moved = hooks.model_to_device(model, device, context)
        restore_point.mark_moved()
        if keeps_ties:  # before every post_move_hook: each sees it re-tied
            finish_kept_move(moved, device, context)
        hooks.post_move_hook(moved, device, context)
        if optimizers:
            follow_moved_parameters(optimizers, restore_point.moved_parameters(), device)
    except BaseException as exc:
        add_note(exc, _restored_note(device, restore_point.restore()))
        raise
    return moved  # type: ignore[return-value]


def _move_unties(
    hooks: AcceleratorHooks, spec: AcceleratorSpec, device: torch.device, model: nn.Module
) -> bool:
    """Whether the move enters or leaves a device type of an accelerator (of this
    registry) that declares ``unties_weights``: then accel keeps the ties.

    Torch swaps a tensor's data in place, keeping each Parameter, only between device
    types that can share a storage implementation (CPU and CUDA); on and off XLA or a
    PrivateUse1 backend it gives every slot a Parameter of its own, in both directions.
    The model is walked only once this registry made a handle of an untying
    accelerator: before that, no move pays more than reading an empty set.
    """
    if spec.unties_weights:
        return True  # declared by the plugin: moves to its device untie
    untying = hooks.untying.types
    if not untying:
        return False
    return device.type in untying or holds_a_tensor_on(model, untying)


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
_MOVE_LOCKS_GUARD = threading.Lock()


def _move_lock(model: nn.Module) -> threading.RLock:
    """The lock that serialises moves of ``model``, created on its first move.

    Re-entrant: a hook may move the same model again from the same thread.
    """
    key = id(model)
    entry = _MOVE_LOCKS.get(key)
    if entry is not None and entry[0]() is model:
        return entry[1]
    with _MOVE_LOCKS_GUARD:
        entry = _MOVE_LOCKS.get(key)
        if entry is None or entry[0]() is not model:
            reference = weakref.ref(model, functools.partial(_forget_lock, key))
            entry = (reference, threading.RLock())
            _MOVE_LOCKS[key] = entry
        return entry[1]


def _forget_lock(key: int, reference: weakref.ref[nn.Module]) -> None:
    with _MOVE_LOCKS_GUARD:
        entry = _MOVE_LOCKS.get(key)
        if entry is not None and entry[0] is reference:
            del _MOVE_LOCKS[key]


def _mp_model_wrapper_parts(obj: object) -> tuple[nn.Module, Any] | None:
    """The model and lock inside torch_xla's ``MpModelWrapper``, else ``None``.

    Recognised by its class, without importing torch_xla; the attributes are the ones
    its own ``to()`` uses (stable across torch_xla releases).
    """
    cls = type(obj)
    if cls.__name__ != "MpModelWrapper" or not cls.__module__.startswith("torch_xla"):
        return None
    module, lock = getattr(obj, "_model", None), getattr(obj, "_lock", None)
    if module is None or lock is None:
        raise AcceleratorTypeError(
            f"model_to_device got a torch_xla MpModelWrapper without the _model/_lock "
            f"attributes accel knows ({cls.__module__}); move its model yourself with "
            f"model_to_device(wrapper._model) or pass the model unwrapped"
        )
    return module, lock


def _as_optimizer_list(
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
) -> list[torch.optim.Optimizer]:
    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    expected = "optimizer= must be a torch.optim.Optimizer, an iterable of them, or None"
    if isinstance(optimizer, (torch.nn.Module, str, bytes)) or not isinstance(optimizer, Iterable):
        raise AcceleratorTypeError(f"{expected}; got {type(optimizer).__name__}")
    optimizers = list(optimizer)
    for item in optimizers:
        if not isinstance(item, torch.optim.Optimizer):
            raise AcceleratorTypeError(
                f"{expected}; got an iterable containing {type(item).__name__}"
            )
    return optimizers
