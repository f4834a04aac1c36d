"""The checkpoint methods of the :class:`~accel.Accelerator` handle: the model's state
on the CPU, writing and reading checkpoints, the random generators and preemption,
through the ``state_dict``, ``save``, ``load``, ``rng_state`` and ``set_rng_state``
hooks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from accel.training._rank_generators import gathered_generators, own_generators
from accel.training._step_methods import TrainingStepMethods

if TYPE_CHECKING:
    from torch import nn

    from accel.training.preemption import PreemptionGuard

__all__ = ["CheckpointMethods"]


class CheckpointMethods(TrainingStepMethods):
    """State dicts, saving and loading; they mark the step first, so XLA tensors cross
    as data."""

    __slots__ = ()

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        """``model``'s state dict with every tensor on the CPU; a tensor the model holds
        under several names (a tied weight) is one CPU tensor under all of them, so
        ``torch.save`` stores it once and ``load_state_dict`` restores the tie. Of a
        compiled model (:meth:`compile`), the plain model's keys.
        """
        from torch import nn

        from accel.training.compiling import unwrap_compiled

        if not isinstance(model, nn.Module):
            raise TypeError(
                f"state_dict expects a torch.nn.Module, got {type(model).__name__}; use "
                f"save() for other objects"
            )
        return self._hooks.state_dict(unwrap_compiled(model))

    def save(self, obj: Any, path: str | os.PathLike[str]) -> None:
        """Write ``obj`` to ``path`` atomically and durably, its tensors on the CPU
        (shared tensors stay shared); in a distributed job only the main process
        writes, and every process returns once the file is complete.

        Modules, optimizers, LR schedulers and grad scalers are stored as their state
        dicts (a module's through :meth:`state_dict`, a tied weight once), as ``obj``
        itself or anywhere in its dicts, lists and tuples; other values as they are.
        ``path`` holds the previous file or the new one at any moment, never a torn
        one. Saving leaves every random generator as it was.

        :raises TypeError: something in ``obj`` that :meth:`load` could not read back
            (``weights_only``), named by its key path; nothing is written.
        :raises OSError: the file could not be written; the message names ``path``,
            and the previous file there is unchanged.
        """
        from accel.training.checkpoint import storable

        _check_path("save", path)
        if self._hooks.only_fallback("mark_step"):
            self._hooks.save(gathered_generators(storable(obj, self.state_dict)), path)
            return
        # XLA: run what is pending so tensors cross as data. Each step mark (this one,
        # and state_dict's for every module) advances XLA's generator; put it back, so
        # that this save does not show in later draws.
        device_rng = self._hooks.rng_state(self.device)
        try:
            stored = gathered_generators(storable(obj, self.state_dict))
            self.mark_step()
            self._hooks.save(stored, path)
        finally:
            self._hooks.set_rng_state(device_rng, self.device)

    def load(self, path: str | os.PathLike[str], state: Any = None) -> Any:
        """Read a checkpoint :meth:`save` wrote, with ``weights_only=True``.

        Without ``state``: the stored object, its tensors on the CPU. With ``state``
        (the dict that was saved, say): every value with ``load_state_dict`` gets its
        stored state in place (a module keeps its device and its ties, optimizer state
        lands on its parameters' device; a compiled model through the model it wraps),
        and the other stored entries are returned as a dict. ``state`` may also be the
        one object that was saved on its own (``save(model, path)`` stores the model's
        state dict; ``load(path, model)`` restores it and returns ``{}``). Nothing
        changes unless everything fits: modules' keys and shapes, optimizers' parameter
        groups and parameter-shaped state are all checked first.

        :raises FileNotFoundError: no file at ``path``.
        :raises KeyError: a key of ``state`` with ``load_state_dict`` is not in the file.
        :raises ValueError: the file is not a checkpoint, or a module's parameters differ
            in name or shape, or an optimizer's parameter groups (named).
        :raises pickle.UnpicklingError: the file holds objects ``weights_only`` refuses.
        """
        from accel.training.checkpoint import restore_into

        _check_path("load", path)
        if not (state is None or isinstance(state, Mapping) or hasattr(state, "load_state_dict")):
            raise TypeError(
                f"load(path, state) expects state to be a dict of the objects to restore "
                f"(model, optimizer, ...) or one object with load_state_dict, got "
                f"{type(state).__name__}"
            )
        stored = own_generators(self._hooks.load(path))  # this rank's generators
        if state is None:
            return stored
        # XLA: one upload of every tensor bound for the device, not one each.
        move = None
        if not self._hooks.only_fallback("restore_to_device"):
            move = partial(self._hooks.restore_to_device, device=self.device)
        remainder = restore_into(stored, state, os.fspath(path), device=self.device, move=move)
        self.mark_step()  # XLA: the restored tensors become device data in one step
        return remainder

    def rng_state(self) -> dict[str, Any]:
        """The state of every generator a run draws from: ``"python"``, ``"numpy"``
        (``None`` without NumPy), ``"torch"`` (the host) and ``"device"`` (this
        accelerator's generators; XLA keeps its own). Store it in a checkpoint and give
        it back to :meth:`set_rng_state`."""
        from accel.training.rng import host_rng_state

        return {**host_rng_state(), "device": self._hooks.rng_state(self.device)}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Put every generator back as :meth:`rng_state` found it.

        :raises TypeError: ``state`` is not a dict.
        :raises ValueError: an entry is missing, or the device state is from another
            device type.
        """
        from accel.training.rng import set_host_rng_state

        if not isinstance(state, Mapping):
            raise TypeError(
                f"set_rng_state expects the dict acc.rng_state() returned, got "
                f"{type(state).__name__}"
            )
        set_host_rng_state(dict(state))
        if state.get("device") is not None:
            self._hooks.set_rng_state(state["device"], self.device)

    def preemption_guard(self, *, signals: tuple[int, ...] | None = None) -> PreemptionGuard:
        """A context manager that notes SIGTERM and SIGUSR1 instead of dying of them.

        Inside it, ``guard.requested`` turns true at the step where a signal was noted,
        on every process of a distributed job at the same step; save then and leave
        the loop. The previous signal handlers are back on exit.
        """
        from accel.training.preemption import PreemptionGuard

        return PreemptionGuard(self.device, signals=signals)


def _check_path(operation: str, path: object) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{operation} expects a file path (str or os.PathLike), got {type(path).__name__}"
        )
