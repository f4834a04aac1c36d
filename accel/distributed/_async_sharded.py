"""``save_sharded(state, path, asynchronous=True)``: DCP's own ``async_save``, writing
into the temporary directory, and then the commit of a synchronous sharded save, run
in the background. Once every rank's shards and DCP's ``.metadata`` are written, rank
0 renames the directory to ``path`` and every rank's ``wait()`` returns: the commit
(:func:`commit_sharded`) a synchronous sharded save makes too, through the one
"main process writes, the others hear from it" helper of ``acc.save``.

``async_save`` stages the state before it returns. Its default stager copies every
tensor into new CPU storage (CPU tensors too, so the loop's next steps never reach the
checkpoint), and then DCP writes in a thread of its own. It needs a process group that
can talk from the host: accel passes the gloo group of its asynchronous saves
(:func:`~accel.training.checkpoint._async_save.save_group`), so it works under nccl too. The
commit waits on DCP's future in accel's background thread, so one save stays in
flight, shared with ``acc.save``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_saver

from accel._util.files import fsync_directory
from accel.errors import AcceleratorValueError
from accel.training.checkpoint._async_save import (
    PendingSave,
    check_asynchronous,
    one_save_at_a_time,
    save_group,
    start_background,
)
from accel.training.checkpoint._main_process import (
    Word,
    alone,
    broadcast_from_rank_0,
    written_by_main,
)

__all__ = ["check_sharded_asynchronous", "commit_sharded", "save_sharded_in_background"]


def check_sharded_asynchronous(asynchronous: object, spmd: bool) -> None:
    """:raises TypeError: ``asynchronous`` is not a bool.
    :raises AcceleratorValueError: ``asynchronous=True`` under XLA SPMD."""
    check_asynchronous("save_sharded", asynchronous)
    if asynchronous and spmd:
        raise AcceleratorValueError(
            "save_sharded: asynchronous=True is not supported under XLA SPMD (DCP's "
            "async_save cannot stage torch_xla's sharded tensors); save with "
            "asynchronous=False, or use torch_xla's CheckpointManager.save_async"
        )


def save_sharded_in_background(
    app_state: dict[str, Any], temporary: Path, target: Path
) -> PendingSave:
    """Stage ``app_state`` with ``async_save`` into ``temporary`` (on every rank), and
    rename it to ``target`` in the background once DCP is done on every rank."""
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    with one_save_at_a_time():
        group = save_group() if distributed else None
        try:
            response = state_dict_saver.async_save(
                app_state, checkpoint_id=str(temporary), process_group=group
            )
        except BaseException:
            if rank == 0:
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        # A Future, or (with a stager of its own) a response that holds one.
        upload = getattr(response, "upload_completion", response)

        def commit(_: None) -> None:
            _commit(upload, temporary, target, rank, group)

        return start_background(target, commit, None)


def _commit(upload: Any, temporary: Path, target: Path, rank: int, group: Any) -> None:
    staged: BaseException | None = None
    try:
        upload.result()  # DCP fails on every rank when one rank could not write
    except BaseException as exc:
        staged = exc
    tell = alone if group is None else broadcast_from_rank_0(group)
    commit_sharded(temporary, target, main=rank == 0, tell=tell, staged=staged)


def commit_sharded(
    temporary: Path,
    target: Path,
    *,
    main: bool,
    tell: Callable[[Word], Word],
    staged: BaseException | None = None,
) -> None:
    """Rename the complete checkpoint directory ``temporary`` to ``target`` on the main
    process; every process returns once it has its name. ``staged`` is DCP's failure
    to write it (then the directory is removed and ``staged`` raised on every rank).

    :raises OSError: the rename failed: on the main process its own error, elsewhere
        an :class:`~accel.errors.AcceleratorOSError` with its errno, naming ``target``.
    """

    def rename() -> None:
        try:
            if staged is not None:
                raise staged
            os.replace(temporary, target)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        fsync_directory(target.parent)  # after the rename, which stands whatever it finds

    try:
        written_by_main(rename, target, main=main, tell=tell, caller="save_sharded")
    except OSError:
        if staged is None:
            raise
    if staged is not None:
        raise staged  # every rank's own: DCP failed on every rank
