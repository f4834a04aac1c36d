"""Lightning checkpoints written and read by accel.

Lightning's ``TorchCheckpointIO`` (and ``XLACheckpointIO``, which is plain
``torch.save`` after moving tensors) is replaced by one that saves with
:meth:`accel.Accelerator.save`: the accelerator's pending work runs first (XLA's
lazy graph), tensors cross to the CPU once each (tensors shared in the checkpoint
stay shared), only the main process writes, and the write is the plugin's (atomic
where accel's ``save`` is). Reading uses :meth:`accel.Accelerator.load` where the
handle has it, else ``torch.load(..., weights_only=True)`` onto the CPU.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from typing_extensions import override

import accel
from accel.errors import AcceleratorFileNotFoundError, AcceleratorTypeError
from accel.integrations._lightning_accelerator import AccelAccelerator, as_lightning_accelerator
from accel.training.checkpoint import atomic_save

__all__ = ["AccelCheckpointIO"]


class AccelCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` (Trainer and Fabric) that saves through accel.

    Every accel strategy uses one on its own accelerator unless given another
    (``checkpoint_io=`` or the Trainer's ``plugins=``). Picklable, like
    :class:`AccelAccelerator`, for Lightning's ``spawn`` launcher.

    :param accelerator: an :class:`AccelAccelerator`, an accel accelerator name or
        handle, or ``None`` for the ``cpu`` accelerator (enough where nothing is
        pending on a device: the tensors still cross to the CPU once each).
    :param registry: the accel registry to select a named accelerator from.
    """

    def __init__(
        self,
        accelerator: AccelAccelerator | str | accel.Accelerator | None = None,
        *,
        registry: accel.AcceleratorRegistry | None = None,
    ) -> None:
        self._lightning_accelerator = as_lightning_accelerator(accelerator, registry)

    def __repr__(self) -> str:
        return f"AccelCheckpointIO({self.handle().name!r})"

    def handle(self) -> accel.Accelerator:
        """The accel accelerator whose ``save`` (and ``load``) this uses."""
        if self._lightning_accelerator is None:
            return accel.get_accelerator("cpu")
        return self._lightning_accelerator.handle()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to the local file ``path`` atomically and durably, as
        the accelerator's ``save`` writes (Lightning calls this on one rank only).

        :raises TypeError: ``storage_options`` was given (accel's ``save`` takes none).
        """
        if storage_options is not None:
            raise AcceleratorTypeError(
                f"AccelCheckpointIO saves with accel's save(), which takes no "
                f"storage_options (got {storage_options!r}); drop the argument, or pass "
                f"checkpoint_io= a CheckpointIO that understands it"
            )

        target = Path(os.fspath(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        # Lightning calls this on the global rank 0 alone, so not acc.save, whose
        # distributed write waits for every rank; the same atomic, durable write.
        self.handle().mark_step()  # XLA: run what is pending, so tensors cross as data
        atomic_save(checkpoint, target)

    @override
    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``, tensors on the CPU.

        ``weights_only`` is ``True`` unless you pass ``False`` for a checkpoint you
        trust that holds arbitrary objects; a ``map_location`` is handed to
        ``torch.load`` as Lightning's own checkpoint IO does.

        :raises FileNotFoundError: no file at ``path``.
        """
        target = Path(os.fspath(path))
        if not target.is_file():
            raise AcceleratorFileNotFoundError(
                f"no checkpoint file at {str(target)!r}: check the path (ckpt_path=, "
                f"fabric.load) or save one first"
            )
        load = getattr(self.handle(), "load", None)  # accel's load, where this accel has it
        if load is not None and weights_only is not False and map_location is None:
            loaded: dict[str, Any] = load(target)
            return loaded
        result: dict[str, Any] = torch.load(
            target,
            map_location="cpu" if map_location is None else map_location,
            weights_only=weights_only is not False,
        )
        return result

    @override
    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint file (or directory) at ``path``, if there is one."""
        target = Path(os.fspath(path))
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
