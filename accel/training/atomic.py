"""Atomic, durable checkpoint files: the path holds the old file or the new one, never
a torn one.

``torch.save(obj, path)`` truncates ``path`` and then writes it: a kill, a crash or a
full disk in between leaves a short file where the last good checkpoint was. Here the
object is written to a temporary file next to ``path`` (same directory, so same file
system), flushed and ``fsync``-ed, renamed over ``path`` in one step, and the
directory is ``fsync``-ed so the rename itself survives a power cut. A failure removes
the temporary file and leaves ``path`` alone. A temporary file that a killed process
could not remove is removed by the next save to the same path.

Tensors are stored on the CPU as they are pickled (one copy per distinct tensor, so a
tensor held twice is stored once), without first rebuilding the object: an object
that contains itself is stored as ``torch.save`` stores it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import re
import secrets
import socket
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

if TYPE_CHECKING:
    import torch

import torch

from accel._util.files import fsync_directory, process_alive
from accel.errors import AcceleratorValueError

__all__ = ["atomic_save"]

#: Part of every temporary file's name: ``.<name>.<host>.<pid>.<random>.accel-tmp``
#: (the random part keeps two saves to one path, from two threads, apart).
TEMPORARY_MARK: Final = ".accel-tmp"


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` to ``path`` with ``torch.save``, atomically and durably, its
    tensors on the CPU.

    Saves to one path from several threads or processes never see each other's
    temporary file: each returns once ``path`` holds a complete checkpoint (its own or
    a later one). A symbolic link at ``path`` is replaced by the new file; the file it
    pointed to is left as it was.

    :raises OSError: the file could not be written (missing directory, permissions, a
        full disk); the message names ``path`` and ``path`` is as it was.
    """
    target = Path(os.fspath(path))
    _remove_stale_temporaries(target)
    temporary, descriptor = _create_temporary(target)
    try:
        # Unbuffered: torch hands over large chunks, and a buffer would copy each once
        # more (a third of torch.save's own speed, measured on GPT-2-sized states).
        with os.fdopen(descriptor, "wb", buffering=0) as file:
            _write(obj, file, target)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException as exc:  # also KeyboardInterrupt: never leave the temporary
        _unlink(temporary)
        if isinstance(exc, OSError) and not _names(exc, target):
            raise _naming(exc, target, "writing it") from exc
        raise
    fsync_directory(target.parent)


def is_temporary(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a temporary file of :func:`atomic_save` (never a checkpoint)."""
    name = Path(os.fspath(path)).name
    return name.startswith(".") and name.endswith(TEMPORARY_MARK)


# -- writing ----------------------------------------------------------------------------


class _RecordingFile:
    """A file torch writes into, keeping the ``OSError`` of a failed write.

    torch's writer turns an exception raised by ``write`` into a ``RuntimeError``
    (``[enforce fail at inline_container.cc] unexpected pos``) that says neither the
    path nor the reason; the recorded error says both.
    """

    __slots__ = ("error", "file")

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        # An unbuffered file may write part of a chunk (a disk filling up): finish it,
        # or record why not.
        view = memoryview(data).cast("B")
        written = 0
        try:
            while written < len(view):
                written += self.file.write(view[written:]) or 0
        except OSError as exc:
            self.error = exc
            raise
        return written

    def flush(self) -> None:
        self.file.flush()


def _write(obj: Any, file: BinaryIO, target: Path) -> None:
    recording = _RecordingFile(file)
    try:
        torch.save(obj, recording, pickle_module=_cpu_pickle_module())  # type: ignore[arg-type]
    except RuntimeError as exc:
        if recording.error is not None:
            raise _naming(recording.error, target, "writing it") from exc
        raise
    except RecursionError as exc:
        raise AcceleratorValueError(
            f"save: the object for {str(target)!r} is nested too deeply to pickle; "
            f"flatten it (a chain of containers deeper than Python's recursion limit)"
        ) from exc


class _CpuPickler(pickle.Pickler):
    """Pickles a tensor that is not on the CPU (or needs grad) as its detached CPU copy,
    one copy per tensor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Keeps the copies alive while pickling: pickle's memo is keyed by id(), and a
        # freed copy's id could be reused by the next one.
        self._copies: list[torch.Tensor] = []

    def reducer_override(self, obj: Any) -> Any:
        # Stored detached (a Parameter as a plain tensor), as state_dict() gives them.
        if isinstance(obj, torch.Tensor) and (obj.device.type != "cpu" or obj.requires_grad):
            copy = obj.detach().to("cpu")
            self._copies.append(copy)
            return copy.__reduce_ex__(2)  # type: ignore[no-untyped-call]
        return NotImplemented


_PICKLE_MODULE: types.ModuleType | None = None


def _cpu_pickle_module() -> types.ModuleType:
    """``pickle`` with :class:`_CpuPickler` as its ``Pickler``, for ``torch.save``."""
    global _PICKLE_MODULE
    if _PICKLE_MODULE is None:
        module = types.ModuleType("accel_cpu_pickle")
        module.__dict__.update(
            {name: getattr(pickle, name) for name in dir(pickle) if not name.startswith("__")}
        )
        module.Pickler = _CpuPickler  # type: ignore[attr-defined]
        _PICKLE_MODULE = module
    return _PICKLE_MODULE


# -- file-system details ------------------------------------------------------------------


def _create_temporary(target: Path) -> tuple[Path, int]:
    """A new temporary file next to ``target``, of this save alone, and its descriptor."""
    owner = f".{target.name}.{socket.gethostname()}.{os.getpid()}"
    while True:
        temporary = target.with_name(f"{owner}.{secrets.token_hex(4)}{TEMPORARY_MARK}")
        try:
            # O_EXCL: never write through a file (or link) someone else left; mode 0o666
            # minus the umask, as a plain open() would give.
            return temporary, os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # another save drew the same random name: draw again
        except OSError as exc:
            raise _naming(exc, target, "creating a file next to it") from exc


def _naming(exc: OSError, target: Path, doing: str) -> OSError:
    """``exc`` again, as the same ``OSError`` subclass, saying which checkpoint failed."""
    reason = exc.strerror or str(exc)
    remedy = {
        errno.ENOENT: "create the directory first",
        errno.EACCES: "save somewhere this process may write",
        errno.EPERM: "save somewhere this process may write",
        errno.EROFS: "the file system is read-only; save somewhere else",
        errno.ENOSPC: "free some space or save somewhere else",
        errno.EFBIG: "the file size limit (ulimit -f) is too small for the checkpoint",
        errno.EDQUOT: "the disk quota is used up; free some space",
    }.get(exc.errno or 0, "check the path and the disk")
    return OSError(  # OSError(errno, ...) picks the subclass: FileNotFoundError, ...
        exc.errno,
        f"save could not write the checkpoint {str(target)!r} ({doing}): {reason}; the "
        f"previous file at that path, if any, is unchanged; {remedy}",
        str(target),
    )


def _names(exc: OSError, target: Path) -> bool:
    return bool(exc.filename == str(target))


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ``<host>.<pid>`` and, since saves from several threads, ``.<random>`` after them.
_OWNER: Final = re.compile(r"(?P<host>.+)\.(?P<pid>\d+)(?:\.[0-9a-f]{8})?")


def _remove_stale_temporaries(target: Path) -> None:
    """Remove the temporaries of saves to ``target`` whose process, on this host, is gone."""
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
        if owner is None:
            continue  # not a name atomic_save gives
        if owner["host"] == host and not process_alive(int(owner["pid"])):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
