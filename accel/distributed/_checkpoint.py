"""Sharded checkpoints: each rank writes its own shards through
:mod:`torch.distributed.checkpoint` (DCP), and the checkpoint appears whole or not at all.

A sharded model (FSDP2's ``fully_shard_tied``) has no rank holding all of its state,
so :meth:`Accelerator.save`, which writes on the main process, does not fit it. DCP
writes one file per rank plus a ``.metadata`` file, and can load onto another world
size. It writes into its directory in place, though: a kill mid-save leaves a
directory that looks like a checkpoint. Here DCP writes into a temporary directory
beside the target, and once every rank's shards and the metadata are written, the
main process renames it to the target (and fsyncs the parent): the target path holds
a complete checkpoint, or is absent, or holds the previous one.

Under XLA SPMD (:func:`init_spmd`) the same calls go through torch_xla's DCP planners
(:mod:`accel.distributed._spmd_checkpoint`): one process writes every device's shards,
with the same temporary directory and rename.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from accel._util.files import TEMPORARY_MARK, stale_temporaries
from accel.distributed._async_sharded import (
    check_sharded_asynchronous,
    commit_sharded,
    save_sharded_in_background,
)
from accel.distributed._dcp_layouts import (
    PLAIN,
    CheckedLoadPlanner,
    check_plain_loaded,
    lift_plain_values,
    own_forms_saved,
    readable_failure,
)
from accel.distributed._spmd_checkpoint import (
    is_optimizer,
    is_spmd,
    spmd_entry,
    spmd_load,
    spmd_save_planner,
)
from accel.errors import (
    AcceleratorFileExistsError,
    AcceleratorFileNotFoundError,
    AcceleratorTypeError,
)
from accel.training.checkpoint._async_save import PendingSave, wait_for_saves
from accel.training.checkpoint._main_process import (
    alone,
    broadcast_from_rank_0,
    check_object_collectives,
    in_a_job,
)
from accel.training.checkpoint._rank_generators import (
    gathered_generators,
    own_generators,
    record_placeholders,
)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["load_sharded", "save_sharded"]

_PLAIN = PLAIN  # the entry under which the plain values travel, as one object


@overload
def save_sharded(
    state: Mapping[str, Any], path: str | os.PathLike[str], *, asynchronous: Literal[False] = False
) -> None: ...


@overload
def save_sharded(
    state: Mapping[str, Any], path: str | os.PathLike[str], *, asynchronous: Literal[True]
) -> PendingSave: ...


def save_sharded(
    state: Mapping[str, Any], path: str | os.PathLike[str], *, asynchronous: bool = False
) -> PendingSave | None:
    """Save ``state`` as a DCP checkpoint directory at ``path``, on every rank together.

    ``state`` holds one module (sharded or not), optimizers over its parameters, and
    plain values (a step, :meth:`Accelerator.rng_state`). Every rank must call it with
    its own objects; each writes its shards, and every rank returns once the
    checkpoint is complete at ``path``. Under XLA SPMD (:func:`init_spmd`) the one
    process writes every device's shards, through torch_xla's ``SPMDSavePlanner``.

    With ``asynchronous=True`` it returns once DCP's ``async_save`` has copied the
    state to the host, and the writes and the rename run in the background; the
    :class:`~accel.training.checkpoint.PendingSave` it returns has ``wait()`` and
    ``done()`` (on every rank). Like :meth:`Accelerator.save`, it first waits for the
    pending save and raises its failure.

    :raises TypeError: ``state`` is not a dict, or holds no module or two.
    :raises FileExistsError: ``path`` exists already (sharded checkpoints are written
        once: name them by step with :func:`accel.training.checkpoint.checkpoint_path`).
    :raises ValueError: ``asynchronous=True`` under XLA SPMD.
    """

    target = Path(os.fspath(path))
    spmd = is_spmd()
    check_sharded_asynchronous(asynchronous, spmd)
    wait_for_saves()  # the pending save first (one in flight), and its failure
    _, app_state = _app_state(state, "save_sharded", spmd)
    if dist.is_initialized() and not spmd:  # DCP's ranks exchange objects, even alone
        check_object_collectives("save_sharded")
    app_state[_PLAIN] = gathered_generators(app_state[_PLAIN])  # every rank's generators
    if target.exists():
        raise AcceleratorFileExistsError(
            17,
            f"save_sharded: {str(target)!r} exists already; a sharded checkpoint is written "
            f"once, so save each one to a new path (checkpoint_path(directory, step))",
            str(target),
        )
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        _remove_stale_temporaries(target)
    # Every rank must name the same directory: the main process's host and pid.
    word = [f".{target.name}.{socket.gethostname()}.{os.getpid()}{TEMPORARY_MARK}"]
    if dist.is_initialized():
        dist.broadcast_object_list(word, src=0)
    temporary = target.with_name(word[0])
    if asynchronous:
        return save_sharded_in_background(app_state, temporary, target)
    try:
        planner = spmd_save_planner() if spmd else None
        # Ends with every rank done (or failed on every rank).
        state_dict_saver.save(app_state, checkpoint_id=str(temporary), planner=planner)
    except BaseException:
        if rank == 0:
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    # Rank 0 renames; every rank returns once it is done, or raises its failure (the
    # broadcast is also the barrier: nobody reads the checkpoint before it has its name).
    tell = broadcast_from_rank_0() if in_a_job() else alone
    commit_sharded(temporary, target, main=rank == 0, tell=tell)
    return None


def load_sharded(path: str | os.PathLike[str], state: Mapping[str, Any]) -> dict[str, Any]:
    """Load the DCP checkpoint at ``path`` into the objects of ``state`` in place, on
    every rank together; return the plain values that were saved.

    It reads :func:`save_sharded`'s checkpoints and those ``torch.distributed.checkpoint.save``
    wrote without accel (``{"model": ..., "optimizer": ..., "step": 7}``, plain values at
    the top level; an optimizer's state keyed by parameter name or by number; see "the
    layouts load_sharded reads" in docs/distributed.md). The world size may differ from
    the one that saved (DCP reshards). Under XLA SPMD the model and its optimizers are loaded in
    place through torch_xla's ``SPMDLoadPlanner`` (shardings and ties kept); an
    optimizer without state is primed first, as DCP loads only into tensors that exist.

    :raises FileNotFoundError: no checkpoint at ``path``.
    :raises KeyError: the checkpoint has no entry for a key of ``state`` (or for some
        of a module's or an optimizer's entries); nothing is loaded.
    :raises ValueError: DCP could not read the checkpoint into ``state`` (a tensor of
        another shape).
    """
    target = Path(os.fspath(path))
    if not (target / ".metadata").is_file():
        raise AcceleratorFileNotFoundError(
            2,
            f"load_sharded: there is no sharded checkpoint at {str(target)!r} (no "
            f".metadata); check the path, or find the newest with latest_checkpoint()",
            str(target),
        )
    spmd = is_spmd()
    model, app_state = _app_state(state, "load_sharded", spmd)

    saved = FileSystemReader(str(target)).read_metadata().state_dict_metadata
    # Every rank's generators were saved as one record where several ranks saved.
    app_state[_PLAIN] = record_placeholders(app_state[_PLAIN], saved, _PLAIN)
    top_level = lift_plain_values(app_state, saved, str(target))  # DCP without accel
    asked = list(app_state[_PLAIN])
    stateful = {key: value for key, value in state.items() if value is model or is_optimizer(value)}
    own_form = [] if spmd else own_forms_saved(app_state, stateful, saved)

    def read(into: dict[str, Any], planner: Any) -> None:
        try:
            state_dict_loader.load(into, checkpoint_id=str(target), planner=planner)
        except CheckpointException as error:  # a BaseException: never let it through
            raise readable_failure(error, target) from error

    if spmd:
        spmd_load(model, state, app_state, read)
    else:
        read(app_state, _weights_only_planner())
    plain = dict(own_generators(app_state[_PLAIN]))  # this rank's generators
    check_plain_loaded(asked, plain, saved, str(target))
    plain.update((key, app_state[key]) for key in top_level)
    for key, value in state.items():
        if spmd and key in stateful:
            continue  # loaded in place by spmd_load
        if key in own_form:
            value.load_state_dict(app_state[key])
        elif value is model:
            set_model_state_dict(model, app_state[key])
        elif is_optimizer(value):
            set_optimizer_state_dict(model, value, app_state[key])
        elif key in plain and hasattr(value, "load_state_dict"):
            value.load_state_dict(plain.pop(key))
    return plain


def _weights_only_planner() -> Any:
    """DCP's load planner, reading its pickled (non-tensor) entries the way
    :meth:`Accelerator.load` reads a file: ``weights_only``, so nothing in it runs; an
    entry the checkpoint lacks is an :class:`AcceleratorKeyError` naming it."""
    import io

    class WeightsOnlyLoadPlanner(CheckedLoadPlanner, DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            data = value.getvalue()
            torch.load(io.BytesIO(data), weights_only=True)  # raises on anything unsafe
            super().load_bytes(read_item, io.BytesIO(data))

    return WeightsOnlyLoadPlanner()


def _app_state(
    state: Mapping[str, Any], caller: str, spmd: bool
) -> tuple[nn.Module, dict[str, Any]]:
    if not isinstance(state, Mapping):
        raise AcceleratorTypeError(
            f"{caller} expects a dict of the run's objects, got {type(state).__name__}"
        )
    modules = [key for key, value in state.items() if isinstance(value, nn.Module)]
    if len(modules) != 1:
        raise AcceleratorTypeError(
            f"{caller} expects exactly one module in state (the optimizers' model), got "
            f"{len(modules)}: {modules}; save other models in checkpoints of their own"
        )
    model = state[modules[0]]
    app_state: dict[str, Any] = {_PLAIN: {}}
    for key, value in state.items():
        if spmd and (value is model or is_optimizer(value)):
            app_state[key] = spmd_entry(model, value)
        elif value is model:
            app_state[key] = get_model_state_dict(model)
        elif is_optimizer(value):
            app_state[key] = get_optimizer_state_dict(model, value)
        elif hasattr(value, "state_dict") and hasattr(value, "load_state_dict"):
            app_state[_PLAIN][key] = value.state_dict()  # a scheduler: same on every rank
        else:
            app_state[_PLAIN][key] = value
    return model, app_state


def _remove_stale_temporaries(target: Path) -> None:
    for entry in stale_temporaries(target):
        if entry.is_dir():
            shutil.rmtree(entry.path, ignore_errors=True)
