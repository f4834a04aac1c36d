"""File-system steps the checkpoint writers share: a directory's fsync, and whether the
process that left a temporary file behind is still running."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_directory", "process_alive"]


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where the platform allows it."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some platforms (Windows) cannot open a directory; the rename stands
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # file systems that cannot fsync a directory: nothing more to do
    finally:
        os.close(descriptor)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (this process counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
