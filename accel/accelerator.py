"""The handle :func:`accel.get_accelerator` returns."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, final

from accel._core.notes import add_note
from accel._core.tie_keeping import begin_kept_move, finish_kept_move
from accel._core.transaction import RestorePoint
from accel.training._checkpoint_methods import CheckpointMethods
from accel.training.batch import move_batch
from accel.types import AcceleratorSpec, MoveContext, TieCheck, checked_tie_check

if TYPE_CHECKING:
    import torch
    from torch import nn

    from accel._core.hooks import AcceleratorHooks

__all__ = ["Accelerator"]

_Model = TypeVar("_Model", bound="nn.Module")
_Batch = TypeVar("_Batch")


@final
class Accelerator(CheckpointMethods):
    """One selected accelerator and device: moves models and batches there.

    Obtain it from :func:`accel.get_accelerator` or
    :meth:`AcceleratorRegistry.get_accelerator`; every operation runs the hooks of
    this accelerator's plugin and of cross-cutting plugins, never another
    accelerator's. The training-step and checkpoint methods are inherited from
    ``accel/training/`` (they are the handle's all the same).
    """

    __slots__ = ("_hooks", "_tie_check", "device", "index", "spec")

    def __init__(
        self,
        hooks: AcceleratorHooks,
        spec: AcceleratorSpec,
        *,
        index: int | None,
        device: torch.device,
        tie_check: TieCheck = "error",
    ) -> None:
        self._hooks = hooks
        #: What the plugin declared: name, aliases, priority, description.
        self.spec = spec
        #: The device index asked for (``None``: the accelerator's default device).
        self.index = index
        #: The :class:`torch.device` models and batches move to, e.g. ``xla:0``.
        self.device = device
        self._tie_check: TieCheck = tie_check

    @property
    def name(self) -> str:
        """Canonical accelerator name, e.g. ``"tpu"`` (also when selected as ``"xla"``)."""
        return self.spec.name

    @property
    def tie_check(self) -> TieCheck:
        """What a move does when tied weights came apart.

        ``"error"`` (default) raises :class:`accel.WeightTyingError` and restores the
        model; ``"warn"`` warns (:class:`accel.TyingWarning`) and keeps the moved model
        with the ties and values it had before the move; ``"off"`` does the same
        silently. Ties the model's ``tie_weights()`` would add, which accel undoes, warn
        under ``"error"`` too. Only moves that can untie weights check at all: to an
        accelerator that declares ``unties_weights`` (``tpu``), and, with the built-in
        plugins registered, to or from XLA, to ``meta`` and in torch's overwrite mode.
        """
        return self._tie_check

    @tie_check.setter
    def tie_check(self, value: TieCheck) -> None:
        self._tie_check = checked_tie_check(value)

    def __repr__(self) -> str:
        return f"Accelerator(name={self.name!r}, device={str(self.device)!r})"

    def is_available(self) -> bool:
        """Whether the accelerator can still be used (asks its plugin again)."""
        return self._hooks.availability().available

    def device_count(self) -> int:
        """How many devices of this accelerator the process can use."""
        return self._hooks.device_count() if self.is_available() else 0

    def for_index(self, index: int) -> Accelerator:
        """The same accelerator on device ``index`` (as ``get_accelerator("NAME:INDEX")``).

        :raises accel.AcceleratorUnavailableError: ``index`` is beyond :meth:`device_count`.
        """
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"for_index expects a device index (an int >= 0), got {index!r}")
        device = self._hooks.device(index, requested=f"{self.name}:{index}")
        return Accelerator(
            self._hooks, self.spec, index=index, device=device, tie_check=self._tie_check
        )

    @property
    def distributed_backend(self) -> str:
        """The :mod:`torch.distributed` backend for this accelerator, e.g. ``"nccl"``."""
        return self._hooks.distributed_backend()

    def model_to_device(
        self,
        model: _Model,
        *,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    ) -> _Model:
        """Move ``model`` to :attr:`device` through the plugins' hooks and return it.

        Runs ``pre_move_hook``, ``model_to_device`` and ``post_move_hook``; for an
        accelerator that declares ``unties_weights`` (``tpu``) the ties are remembered
        after the pre hooks and re-tied and validated before the post hooks. If any
        step fails, the model is restored (same objects in every slot, devices,
        storage, ties, gradients, ``requires_grad`` and training mode) and the
        exception is re-raised with a note saying so; tensors a hook changed in place
        cannot be restored without copies, and the note names each of them.

        Moves of one model from several threads run one at a time; moves of
        different models run concurrently.

        A torch_xla ``MpModelWrapper`` (used when processes are forked) is accepted
        too: its wrapped model moves under the wrapper's lock, as the wrapper's own
        ``to()`` would move it, and that model is returned.

        :param optimizer: optimizer(s) built on the model's parameters; their
            parameter groups and state are remapped to the moved parameters.
        :raises ValueError: none of the optimizers holds any of the model's parameters.
        """
        from torch import nn

        wrapped = _mp_model_wrapper_parts(model)
        if wrapped is not None:
            module, lock = wrapped
            with lock:  # forked processes share the wrapped model's pages: one at a time
                return self.model_to_device(module, optimizer=optimizer)  # type: ignore[return-value]
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model_to_device expects a torch.nn.Module, got {type(model).__name__}; "
                f"use batch_to_device for tensors and containers of tensors"
            )
        optimizers = _as_optimizer_list(optimizer)
        # One move of a model at a time: a second thread's snapshot would see the
        # slots the first one emptied for its move. Moves of other models go on.
        with _move_lock(model):
            return self._move(model, optimizers)

    def _move(self, model: _Model, optimizers: list[torch.optim.Optimizer]) -> _Model:
        restore_point = RestorePoint(model)
        if optimizers:
            from accel._core.optimizers import check_optimizers_hold

            check_optimizers_hold(optimizers, model, restore_point.parameter_ids())
        context = MoveContext(self.name, self.device, self._tie_check)
        # Declared by the plugin: moves to this device untie, so accel keeps the ties.
        keeps_ties = self.spec.unties_weights
        try:
            self._hooks.pre_move_hook(model, self.device, context)
            if keeps_ties:  # after every pre_move_hook: each saw the model whole
                begin_kept_move(model, context)
            moved = self._hooks.model_to_device(model, self.device, context)
            restore_point.mark_moved()
            if keeps_ties:  # before every post_move_hook: each sees it re-tied
                finish_kept_move(moved, self.device, context, stacklevel=4)
            self._hooks.post_move_hook(moved, self.device, context)
            if optimizers:
                from accel._core.optimizers import retarget_optimizers

                retarget_optimizers(optimizers, restore_point, self.device)
        except BaseException as exc:
            add_note(exc, _restored_note(self.device, restore_point.restore()))
            raise
        return moved  # type: ignore[return-value]

    def batch_to_device(self, batch: Any) -> Any:
        """Move every tensor in ``batch`` (nested dicts, lists, tuples, namedtuples,
        dataclasses) to :attr:`device`, keeping container types; other values pass
        through unchanged.
        """
        if self._hooks.only_fallback("batch_to_device"):
            # No plugin moves batches differently: skip the hook machinery (a few µs
            # a call, which adds up over a training loop's small batches).
            return move_batch(batch, self.device)
        return self._hooks.batch_to_device(batch, self.device)


#: What a restore puts back, for the note on a failed move.
_RESTORED = (
    "every parameter, buffer and submodule slot, the parameters' data, gradients and "
    "requires_grad, and every module's training mode"
)
# Tensors named in full in the note; a longer list is cut.
_UNRESTORED_SHOWN = 10


def _name_as_the_handles(groups: tuple[type, ...]) -> None:
    """Give the inherited methods the handle's name, so Python's own errors about their
    arguments say ``Accelerator.clip_grad_norm_()``, the method users call."""
    for group in groups:
        for name, member in vars(group).items():
            if callable(member) and not name.startswith("_"):
                member.__qualname__ = f"Accelerator.{name}"


_name_as_the_handles(Accelerator.__mro__[1:-1])


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
        raise TypeError(
            f"model_to_device got a torch_xla MpModelWrapper without the _model/_lock "
            f"attributes accel knows ({cls.__module__}); move its model yourself with "
            f"model_to_device(wrapper._model) or pass the model unwrapped"
        )
    return module, lock


def _as_optimizer_list(
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
) -> list[torch.optim.Optimizer]:
    import torch

    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    expected = "optimizer= must be a torch.optim.Optimizer, an iterable of them, or None"
    if isinstance(optimizer, (torch.nn.Module, str, bytes)) or not isinstance(optimizer, Iterable):
        raise TypeError(f"{expected}; got {type(optimizer).__name__}")
    optimizers = list(optimizer)
    for item in optimizers:
        if not isinstance(item, torch.optim.Optimizer):
            raise TypeError(f"{expected}; got an iterable containing {type(item).__name__}")
    return optimizers
