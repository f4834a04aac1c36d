"""One load, top to bottom: what ``acc.load(path, state=None)`` does.

:func:`load_and_restore` is the whole pipeline, the mirror of ``acc.save``'s
(:mod:`accel.training.checkpoint._save`):

1. the arguments checked, before anything is read;
2. the file read: the ``load`` hook (its fallback, :mod:`._read`, is ``torch.load``
   with ``weights_only=True``), tensors on the CPU;
3. this rank's generators picked from the record of every rank's (:mod:`._rank_generators`);
4. without ``state``: that object, returned;
5. everything checked to fit the objects of ``state`` before any of them changes
   (:mod:`._fitting`);
6. the tensors bound for the device uploaded together, in one call of the
   ``restore_to_device`` hook (:mod:`._restoring`);
7. ``load_state_dict`` in place, modules first: an optimizer puts its state on its
   parameters' device;
8. on XLA, the step marked, so that the restored tensors become device data in one
   step; the stored entries restored into nothing returned.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, Protocol

import torch
from torch import nn

from accel.training.checkpoint._arguments import checked_path, checked_state
from accel.training.checkpoint._fitting import fitted
from accel.training.checkpoint._rank_generators import own_generators
from accel.training.checkpoint._restoring import moved_for_restore

__all__ = ["LoadHooks", "load_and_restore"]


class LoadHooks(Protocol):
    """What a load asks of the accelerator: the hooks of the handle's hook caller."""

    def load(self, path: str | os.PathLike[str]) -> Any: ...
    def restore_to_device(self, tensors: list[torch.Tensor], device: torch.device) -> Any: ...
    def mark_step(self, device: torch.device) -> None: ...


def load_and_restore(
    path: str | os.PathLike[str], state: Any, *, hooks: LoadHooks, device: torch.device
) -> Any:
    """:meth:`Accelerator.load`: the steps of the module docstring, in order."""
    checked_path("load", path)  # 1.
    checked_state(state)
    stored = own_generators(hooks.load(path))  # 2. and 3.
    if state is None:  # 4.
        return stored
    restoring = fitted(stored, state, os.fspath(path))  # 5.
    move = partial(hooks.restore_to_device, device=device)
    entries = moved_for_restore(restoring.targets, restoring.entries, device, move)  # 6.
    targets = restoring.targets
    for key in sorted(targets, key=lambda key: not isinstance(targets[key], nn.Module)):  # 7.
        targets[key].load_state_dict(entries[key])
    hooks.mark_step(device)  # 8. a no-op on an eager device
    return restoring.remainder
