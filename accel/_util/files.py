"""File-system steps the checkpoint writers share: a directory's fsync, and the
temporaries that killed saves left behind."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Final

__all__ = ["TEMPORARY_MARK", "fsync_directory", "process_alive", "stale_temporaries"]

#: Ends the name of every temporary file or directory a checkpoint writer makes.
TEMPORARY_MARK: Final = ".accel-tmp"
# ``<host>.<pid>``, and a random part after them where several threads may save. The
# host is matched lazily: a random part of eight decimal digits ("21219087") must not be
# read as the pid, with the real pid taken into the host name.
_OWNER: Final = re.compile(r"(?P<host>.+?)\.(?P<pid>\d+)(?:\.[0-9a-f]{8})?")


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


def stale_temporaries(target: Path) -> Iterator[os.DirEntry[str]]:
    """The temporaries of saves to ``target`` (``.<name>.<host>.<pid>[.<random>]``
    and :data:`TEMPORARY_MARK`) whose process, on this host, is gone: killed mid-save.
    A resumed run saves the same step again, so nobody else will remove them."""
    prefix = f".{target.name}."
    host = socket.gethostname()
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return  # the save itself reports what is wrong with the directory
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(TEMPORARY_MARK)):
            continue
        owner = _OWNER.fullmatch(name[len(prefix) : -len(TEMPORARY_MARK)])
        if owner is not None and owner["host"] == host and not process_alive(int(owner["pid"])):
            yield entry
