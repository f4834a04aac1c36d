"""The save in flight: at most one per process, written by a background thread, its
failure raised at the next save or wait. Shared by ``acc.save(..., asynchronous=True)``
(whose pipeline is :mod:`accel.training.checkpoint._save`) and
``save_sharded(..., asynchronous=True)``.

A thread is enough. ``torch.save`` pickles the state's small containers, holding the
GIL briefly, and hands the tensors' bytes to the file in large chunks. The ``write``
system calls and the ``fsync`` run with the GIL released (measured in
``benchmarks/bench_async_checkpoint.py``).

At most one save is in flight in a process: a save (asynchronous or not), a sharded
save, :func:`wait_for_saves` and the exit all wait for the pending one first. So the
host holds at most one snapshot, and two checkpoints never race for one path. A
failure is kept and raised once, at the first of the pending save's ``wait()``, the
next save or :func:`wait_for_saves`. A process that exits with a save pending finishes
it (atexit), and says on stderr if it failed. A kill during the write leaves the
previous checkpoint, as the atomic write always does.

In a :mod:`torch.distributed` job, rank 0 writes. The other ranks learn the outcome
from rank 0 over a gloo group of accel's own (:func:`save_group`), created at the
first asynchronous save on every rank, so that the background threads never share a
communicator with the loop's collectives; under nccl it is the host-capable group
DCP's ``async_save`` needs too. The background thread is marked, so that a ``save``
hook knows it only writes there (:func:`writing_in_background`): a thread of its own
is no sign, since a loop may run in one (Ray Train's does).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, final

import torch.distributed as dist

from accel._util.notes import add_note
from accel.errors import AcceleratorTypeError

__all__ = [
    "PendingSave",
    "check_asynchronous",
    "one_save_at_a_time",
    "pending_paths",
    "save_group",
    "start_background",
    "wait_for_saves",
    "writing_in_background",
]


@final
class PendingSave:
    """A checkpoint being written in the background, returned by
    ``acc.save(obj, path, asynchronous=True)`` and
    ``accel.distributed.save_sharded(state, path, asynchronous=True)``."""

    __slots__ = ("_done", "_failure", "_reported", "path")

    def __init__(self, path: Path) -> None:
        #: Where the checkpoint is being written.
        self.path = path
        self._done = threading.Event()
        self._failure: BaseException | None = None
        self._reported = False

    def done(self) -> bool:
        """Whether the write has ended: the checkpoint is complete and durable at
        :attr:`path` (on every rank), or the write failed and :meth:`wait` raises."""
        return self._done.is_set()

    def wait(self) -> None:
        """Return once the checkpoint is complete and durable at :attr:`path`.

        In a distributed job it returns on every rank once rank 0's file is complete.

        :raises OSError: the write failed (a full disk, say); the message names the
            path, and the previous checkpoint there is unchanged.
        """
        self._done.wait()
        if self._failure is not None:
            self._reported = True
            raise self._failure

    def __repr__(self) -> str:
        state = "failed" if self._failure else "complete" if self.done() else "writing"
        return f"<PendingSave {str(self.path)!r} {state}>"

    def _finish(self, failure: BaseException | None) -> None:
        if failure is not None:
            # The traceback's frames hold the snapshot: free it now, keep the lines.
            traceback.clear_frames(failure.__traceback__)
            add_note(
                failure,
                f"raised by the asynchronous save of {str(self.path)!r}, which failed in "
                f"the background; the previous checkpoint at that path, if any, is "
                f"unchanged",
            )
        self._failure = failure
        self._done.set()


#: Held while a save waits for the previous one and takes its snapshot.
_SLOT: Final = threading.Lock()
#: The save in flight, or the last one until its failure is reported.
_current: PendingSave | None = None
_exit_hook_registered = False
#: ``writing`` is set in accel's background writer threads only.
_WRITER: Final = threading.local()


def writing_in_background() -> bool:
    """Whether this call runs in accel's background write of an asynchronous save.

    A ``save`` hook called there runs on the process that writes only, with a CPU
    snapshot: it only writes, with no collective (accel tells the other ranks). Any
    other call, from whatever thread, is a synchronous save made on every process.
    """
    return bool(getattr(_WRITER, "writing", False))


def check_asynchronous(caller: str, asynchronous: object) -> None:
    """:raises TypeError: ``asynchronous`` is not a bool."""
    if not isinstance(asynchronous, bool):
        raise AcceleratorTypeError(
            f"{caller}: asynchronous must be True or False, got "
            f"{type(asynchronous).__name__}: {asynchronous!r}"
        )


def wait_for_saves() -> None:
    """Wait for the process's pending asynchronous save, if any.

    :raises OSError: it failed and its failure was not raised yet (by its ``wait()``,
        the next save or an earlier call).
    """
    pending = _current
    if pending is None:
        return
    pending._done.wait()
    if pending._failure is not None and not pending._reported:
        pending._reported = True
        raise pending._failure


class one_save_at_a_time:  # a verb at the call site: `with one_save_at_a_time():`
    """Context manager held while a save is prepared: it waits for the pending one
    (raising its failure), and keeps saves of other threads out until it ends."""

    __slots__ = ()

    def __enter__(self) -> None:
        _SLOT.acquire()
        try:
            wait_for_saves()
        except BaseException:
            _SLOT.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        _SLOT.release()


def pending_paths() -> frozenset[str]:
    """The absolute path of the checkpoint being written, if one is: not complete yet,
    so retention neither counts nor deletes it."""
    pending = _current
    if pending is None or pending.done():
        return frozenset()
    return frozenset({os.path.abspath(pending.path)})


def start_background(path: Path, work: Callable[[Any], None], payload: Any) -> PendingSave:
    """Run ``work(payload)`` in a thread as the pending save of ``path``; call it inside
    :class:`one_save_at_a_time`. ``work`` gets the only reference to ``payload`` (the
    snapshot), so the snapshot is freed when the write ends."""
    global _current, _exit_hook_registered
    pending = PendingSave(path)
    box = [payload]
    del payload

    def run() -> None:
        _WRITER.writing = True  # this thread's for good: it ends with the write
        failure: BaseException | None = None
        try:
            work(box.pop())
        except BaseException as exc:  # kept for wait(), whatever it is
            failure = exc
        pending._finish(failure)

    if not _exit_hook_registered:
        atexit.register(_finish_at_exit)
        _exit_hook_registered = True
    _current = pending
    threading.Thread(target=run, name=f"accel-save {path.name}", daemon=True).start()
    return pending


def _finish_at_exit() -> None:
    pending = _current
    if pending is None:
        return
    pending._done.wait()  # daemon threads still run while atexit handlers do
    failure = pending._failure
    if failure is not None and not pending._reported:
        print(
            f"accel: the asynchronous save of {str(pending.path)!r} failed and nothing "
            f"waited for it before the process exited ({type(failure).__name__}: "
            f"{failure}); the previous checkpoint at that path, if any, is unchanged",
            file=sys.stderr,
            flush=True,
        )


_GROUP: list[Any] = [None, None]  # [the default group it was made for, the save group]


def save_group() -> Any:
    """The gloo group of every rank that asynchronous saves talk over, made at the
    first call on every rank (a collective) and again for a new default group."""
    world = dist.group.WORLD
    if _GROUP[0] is not world or _GROUP[1] is None:
        _GROUP[1] = dist.new_group(backend="gloo")
        _GROUP[0] = world
    return _GROUP[1]
