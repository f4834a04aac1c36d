"""Keeping the last N checkpoints of a run, and finding the newest one to resume from.

Checkpoints are named by step (``step-000001200.pt``) in one directory. A checkpoint is
complete as soon as it has its name: :meth:`Accelerator.save` writes a temporary file
(``.step-000001200.pt.<host>.<pid>.accel-tmp``) and renames it, so a torn file never
carries a checkpoint's name and these functions never see one. :func:`prune_checkpoints`
runs after the new checkpoint is saved, so the old ones go only once the new one is
complete (Accelerate's ``total_limit`` deletes them before). A checkpoint an
asynchronous save of this process is still writing is neither listed nor deleted
until its write is durable, even once it has its name.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Final

from accel.errors import AcceleratorValueError
from accel.training._async_save import pending_paths

__all__ = ["checkpoint_path", "latest_checkpoint", "list_checkpoints", "prune_checkpoints"]

_NAME: Final = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    """The path of step ``step``'s checkpoint in ``directory``: ``step-000001200.pt``.

    :raises ValueError: ``step`` is negative.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise AcceleratorValueError(f"checkpoint_path: step must be an int >= 0, got {step!r}")
    return Path(os.fspath(directory)) / f"step-{step:09d}.pt"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The checkpoints in ``directory``, oldest step first (none if it does not exist):
    files :meth:`Accelerator.save` wrote and directories
    :func:`accel.distributed.save_sharded` wrote (complete once they have the name)."""
    root = Path(os.fspath(directory))
    if not root.is_dir():
        return []
    writing = pending_paths()  # an asynchronous save's: complete only once it is durable
    found = []
    for entry in os.scandir(root):
        match = _NAME.match(entry.name)
        if match and writing and os.path.abspath(entry.path) in writing:
            continue
        # A file from acc.save, or a directory from accel.distributed.save_sharded.
        if match and (entry.is_file() or os.path.isfile(os.path.join(entry.path, ".metadata"))):
            found.append((int(match.group(1)), root / entry.name))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint of the highest step in ``directory``, or ``None`` to start afresh."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def prune_checkpoints(directory: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints in ``directory``; return the deleted.

    Call it after :meth:`Accelerator.save` returned, on the main process only (the other
    processes of a distributed job would race it for the same files).

    :raises ValueError: ``keep`` is below 1 (the newest checkpoint is always kept).
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise AcceleratorValueError(
            f"prune_checkpoints: keep must be an int >= 1 (the newest checkpoint is always "
            f"kept), got {keep!r}"
        )
    old = list_checkpoints(directory)[:-keep]
    for path in old:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return old
