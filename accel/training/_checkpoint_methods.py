"""The checkpoint methods of the :class:`~accel.Accelerator` handle: the model's state
on the CPU and writing it, through the ``state_dict`` and ``save`` hooks."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from accel.training._step_methods import TrainingStepMethods

if TYPE_CHECKING:
    from torch import nn

__all__ = ["CheckpointMethods"]


class CheckpointMethods(TrainingStepMethods):
    """State dicts and saving; they mark the step first, so XLA tensors cross as data."""

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
        """Write ``obj`` to ``path`` with ``torch.save``, its tensors on the CPU (shared
        tensors stay shared); in a distributed job only the main process writes.

        Pass :meth:`state_dict`'s result, or any dict/list of tensors and values (an
        optimizer's ``state_dict()``).
        """
        from accel.training.checkpoint import to_cpu

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"save expects a file path (str or os.PathLike), got {type(path).__name__}"
            )
        self.mark_step()  # XLA: run what is pending, so tensors cross as data
        self._hooks.save(to_cpu(obj), path)
