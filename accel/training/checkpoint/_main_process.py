"""The main process writes, the others wait for its word.

Every save one process writes for a whole job goes through :func:`written_by_main`:
``acc.save``'s fallback write (:func:`save_on_main_process`), its asynchronous write in
a distributed job, the TPU plugin's replicas without a :mod:`torch.distributed` group,
and ``save_sharded``'s rename of its complete directory (both modes). Only the way the
word travels differs (a broadcast from rank 0, XLA's rendezvous), so a failure reads
the same on every rank, whichever way it went: the main process raises its own error,
every other process an ``OSError`` with the same ``errno`` (``EIO`` where the failure
had none), naming the path.
"""

from __future__ import annotations

import errno as errno_codes
import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from accel.errors import AcceleratorOSError, AcceleratorRuntimeError
from accel.training.checkpoint._async_save import writing_in_background
from accel.training.checkpoint._atomic import atomic_save

__all__ = [
    "Word",
    "alone",
    "broadcast_from_rank_0",
    "check_object_collectives",
    "in_a_job",
    "is_main_process",
    "save_on_main_process",
    "written_by_main",
]

#: What the main process tells the others: ``None`` (the file is complete), or the
#: failure's errno (``None`` where it had none) and ``"Type: message"``.
Word = tuple[int | None, str] | None


def is_main_process() -> bool:
    """Rank 0 of an initialised :mod:`torch.distributed` group, or any lone process."""
    if not dist.is_available() or not dist.is_initialized():
        return True
    return dist.get_rank() == 0


def in_a_job() -> bool:
    """Whether this process is one of several in an initialised :mod:`torch.distributed`
    group (a group of one is a lone process)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def check_object_collectives(caller: str) -> None:
    """Refuse, on every rank alike and before any of them, a save whose ranks would
    exchange objects (torch's ``all_gather_object`` and ``broadcast_object_list``,
    and DCP's) where those cannot run: torch reads the objects through NumPy.

    :raises AcceleratorRuntimeError: NumPy is not available in this environment.
    """
    if not _numpy_works():
        raise AcceleratorRuntimeError(
            f"{caller}: a save in a distributed job exchanges objects between the processes "
            f"with torch's object collectives, which need NumPy, and NumPy is not "
            f"available here; install it on every node (pip install numpy)"
        )


@functools.cache
def _numpy_works() -> bool:
    # torch's own test: a tensor's .numpy() is what its object collectives call.
    try:
        torch.zeros(1, dtype=torch.uint8).numpy()
    except RuntimeError:
        return False
    return True


def written_by_main(
    write: Callable[[], None],
    path: str | os.PathLike[str],
    *,
    main: bool,
    tell: Callable[[Word], Word],
    caller: str = "save",
) -> None:
    """Run ``write`` on the main process; every process returns once it ended.

    ``tell`` carries the main process's word to every process and returns it: a
    collective, called on every process (``write`` is not, so whatever it raises on
    the main process is caught first, or the others would wait forever). ``caller``
    opens the others' message.

    :raises OSError: the write failed: on the main process its own error, elsewhere an
        :class:`~accel.errors.AcceleratorOSError` with its errno, naming ``path``.
    """
    failure: BaseException | None = None
    if main:
        try:
            write()
        except BaseException as exc:  # the others wait for word of it, whatever it is
            failure = exc
    mine: Word = None
    if failure is not None:
        code = getattr(failure, "errno", None)
        mine = (code if isinstance(code, int) else None, f"{type(failure).__name__}: {failure}")
    word = tell(mine)  # also the barrier: nobody reads the file before it is complete
    if failure is not None:
        raise failure
    if word is not None:
        code, told = word
        name = os.fspath(path)
        raise AcceleratorOSError(
            code if isinstance(code, int) else errno_codes.EIO,
            f"{caller}: the main process (rank 0) could not write the checkpoint {name!r}: "
            f"{told}; the previous file at that path, if any, is unchanged",
            name,
        )


def alone(word: Word) -> Word:
    """A ``tell`` for :func:`written_by_main` in a process that is the whole job: its
    own word."""
    return word


def broadcast_from_rank_0(group: Any = None) -> Callable[[Word], Word]:
    """A ``tell`` for :func:`written_by_main`: rank 0's word, broadcast over ``group``
    (the default group where ``None``).

    :raises AcceleratorRuntimeError: see :func:`check_object_collectives`.
    """
    check_object_collectives("save")

    def tell(word: Word) -> Word:
        box: list[Any] = [word]
        if group is None:
            dist.broadcast_object_list(box, src=0)
        else:
            dist.broadcast_object_list(box, src=0, group=group)
        told: Word = box[0]
        return told

    return tell


def save_on_main_process(obj: Any, path: str | os.PathLike[str]) -> None:
    """The ``save`` hook's fallback: :func:`~accel.training.checkpoint.atomic_save`
    on the main process of an initialised :mod:`torch.distributed` group (or in a lone
    process); every rank returns once the file is complete, and raises if the main
    process could not write it. In the background write of an asynchronous save
    (:func:`~accel.training.checkpoint.writing_in_background`) it only writes: that
    runs on the main process alone, and accel tells the others itself."""
    if writing_in_background() or not in_a_job():
        atomic_save(obj, path)
        return
    written_by_main(
        lambda: atomic_save(obj, path),
        path,
        main=dist.get_rank() == 0,
        tell=broadcast_from_rank_0(),
    )
