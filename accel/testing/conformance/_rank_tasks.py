"""What each of the kit's two distributed workers runs, in order, once the group has
started: the tasks whose results the promises of :mod:`._distributed` compare."""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

import accel.distributed as adist
from accel.testing.conformance._checkpoints import FailsToStore
from accel.testing.conformance._models import (
    cpu_copy,
    reference_inputs,
    reference_layer,
    sgd_for,
    squared_error,
)

__all__ = [
    "CLIP_MAX_NORM",
    "SAVE_DELAY_S",
    "TASKS",
    "WORLD_SIZE",
    "all_reduce_task",
    "clip_task",
    "ddp_step_task",
    "failed_save_task",
    "gradients_of",
    "no_sync_task",
    "save_task",
]

WORLD_SIZE = 2


#: What the workers check, in this order, in one start of the two processes.
TASKS = ("all_reduce", "ddp_step", "no_sync", "clip", "save", "failed_save")


def all_reduce_task(rank: int, acc: Any) -> dict[str, torch.Tensor]:
    tensor = torch.full((3,), float(rank + 1), device=acc.device)
    torch.distributed.all_reduce(tensor)
    return {"sum": tensor.to("cpu")}


def ddp_step_task(rank: int, acc: Any) -> dict[str, torch.Tensor]:
    model = acc.model_to_device(reference_layer())
    optimizer = sgd_for(model)
    wrapped = adist.wrap_data_parallel(model)
    inputs, targets = reference_inputs()
    x, y = acc.batch_to_device((inputs.chunk(2)[rank], targets.chunk(2)[rank]))
    # DDP averages the ranks' gradients: twice each half's sum is the whole batch's
    # sum, as the one-process step computes it.
    loss = squared_error(wrapped(x), y) * WORLD_SIZE
    loss.backward()  # type: ignore[no-untyped-call]
    acc.optimizer_step(optimizer)
    return cpu_copy(model)


def gradients_of(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.grad.to("cpu").clone() for name, p in model.named_parameters()}


def no_sync_task(rank: int, acc: Any) -> dict[str, Any]:
    """Two micro-batches of this rank's half: the first under ``no_sync(enabled=True)``
    (gradients kept on the rank), the last under ``no_sync(enabled=False)`` (synced)."""
    model = acc.model_to_device(reference_layer())
    optimizer = sgd_for(model)
    wrapped = adist.wrap_data_parallel(model)
    inputs, targets = reference_inputs()
    micro = list(zip(inputs.chunk(2)[rank].chunk(2), targets.chunk(2)[rank].chunk(2), strict=True))
    found: dict[str, Any] = {}
    for index, (x, y) in enumerate(micro):
        with acc.no_sync(wrapped, enabled=index < len(micro) - 1):
            x, y = acc.batch_to_device((x, y))
            loss = squared_error(wrapped(x), y) * WORLD_SIZE  # as in ddp_step_task
            loss.backward()  # type: ignore[no-untyped-call]
        found["unsynced" if index == 0 else "synced"] = gradients_of(model)
    acc.optimizer_step(optimizer)
    found["model"] = cpu_copy(model)
    return found


#: Seconds rank 0's write takes (its object is slow to store): a rank 1 that writes, or
#: returns before the file is complete, then shows in what it reads back right after its
#: own save. The wait is inside the write: the save's collective before the write (every
#: rank's generators) lines both ranks up, so a wait before the save hid nothing.
SAVE_DELAY_S = 1.0


class SlowToStore:
    """Takes :data:`SAVE_DELAY_S` to store, then stores as an empty ``OrderedDict``
    (which ``weights_only`` loading reads back)."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        time.sleep(SAVE_DELAY_S)
        return OrderedDict, ()


def save_task(rank: int, acc: Any, workdir: Path) -> dict[str, torch.Tensor]:
    """Both ranks save to one path, each its own rank number, rank 0's write slow; each
    reads the file back as soon as its save returns (-1: no file yet)."""
    path = workdir / "checkpoint.pt"
    try:
        weights = torch.full((2,), float(rank), device=acc.device)
        obj: dict[str, Any] = {"writer": rank, "weights": weights}
        if rank == 0:
            obj["slow"] = SlowToStore()
        # Allowed for the save's check of what load reads back.
        with torch.serialization.safe_globals([SlowToStore]):
            acc.save(obj, path)
        seen = torch.load(path, weights_only=True)["writer"] if path.exists() else -1
    finally:
        torch.distributed.barrier()  # neither rank leaves while the other may still read
    return {"writer": torch.tensor(seen)}


def failed_save_task(rank: int, acc: Any, workdir: Path) -> dict[str, torch.Tensor]:
    """Both ranks save to one path; rank 0's write fails as a full disk does (its object
    raises OSError when stored, as in checkpoints.failed_save). 1: the save raised an
    OSError, 0: it returned."""
    path = workdir / "failed.pt"
    obj: dict[str, Any] = {"writer": rank}
    if rank == 0:
        obj["broken"] = FailsToStore()
    raised = 0
    try:
        # Allowed for the save's check of what load reads back: the write itself fails.
        with torch.serialization.safe_globals([FailsToStore]):
            acc.save(obj, path)
    except OSError:
        raised = 1
    finally:
        torch.distributed.barrier()  # neither rank leaves while the other may still save
    return {"raised": torch.tensor(raised)}


#: Small enough that the reference layer's gradients are clipped.
CLIP_MAX_NORM = 0.1


def clip_task(rank: int, acc: Any) -> dict[str, Any]:
    """A DDP backward of this rank's half, then clip_grad_norm_ and the step."""
    model = acc.model_to_device(reference_layer())
    optimizer = sgd_for(model)
    wrapped = adist.wrap_data_parallel(model)
    inputs, targets = reference_inputs()
    x, y = acc.batch_to_device((inputs.chunk(2)[rank], targets.chunk(2)[rank]))
    loss = squared_error(wrapped(x), y) * WORLD_SIZE  # as in ddp_step_task
    loss.backward()  # type: ignore[no-untyped-call]
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=CLIP_MAX_NORM)
    acc.optimizer_step(optimizer)
    return {"norm": norm.to("cpu"), "model": cpu_copy(model)}
