"""Moving nested batches of tensors to a device.

Usable on its own: ``move_batch(batch, device)`` needs no registry. Containers are
walked by the rules of :mod:`accel.training.nested`, the one walker that batch
moves, every ``device_loader``, checkpoints and SPMD sharding share.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import TYPE_CHECKING, Any

import torch

from accel.training.nested import map_nested

if TYPE_CHECKING:
    import torch

__all__ = ["move_batch"]


def move_batch(batch: Any, device: torch.device) -> Any:
    """Return ``batch`` with every tensor in it moved to ``device``.

    Walks mappings, lists, tuples, namedtuples and dataclass instances to any depth
    and rebuilds each with its own type (a ``defaultdict`` keeps its factory, a
    frozen dataclass stays frozen, an ``init=False`` field keeps its value); anything
    else passes through unchanged (see :mod:`accel.training.nested`). A tensor or a
    container that appears several times is moved once, so the copies stay one
    object. Pinned host memory is copied to CUDA without blocking the host.

    :raises ValueError: the batch contains itself (a reference cycle; the message
        names the path), or is nested deeper than Python's recursion limit.
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    tensor_type = torch.Tensor
    # Fast paths for the common batches: a flat dict of tensors (what a tokenizer
    # returns), an (inputs, targets) tuple, each tensor once (a tensor under two keys
    # must come out as one moved tensor: the walker's memo). Same result as the walker.
    # The checks run in C (map, set): a Python frame per value would cost as much as
    # the moves themselves, and this runs on every step of every loop.
    kind = type(batch)
    if kind is dict:
        values = batch.values()
        if all(map(isinstance, values, repeat(tensor_type))) and len(set(map(id, values))) == len(
            batch
        ):
            if _to_cuda(device):
                move = _tensor_mover(device)
                return {key: move(value) for key, value in batch.items()}
            return {key: value.to(device) for key, value in batch.items()}
    elif (kind is tuple or kind is list) and (
        all(map(isinstance, batch, repeat(tensor_type))) and len(set(map(id, batch))) == len(batch)
    ):
        if _to_cuda(device):
            move = _tensor_mover(device)
            items = [move(value) for value in batch]
        else:
            items = [value.to(device) for value in batch]
        return items if kind is list else tuple(items)
    move = _tensor_mover(device)
    if isinstance(batch, tensor_type):
        return move(batch)
    return map_nested(batch, move, leaf_type=tensor_type, what="batch")


def move_batch_or_copies(batch: Any, device: torch.device) -> Any:
    """:func:`move_batch`, as accel's ``batch_to_device`` fallback and
    :class:`BatchMover` do it: a PrivateUse1 backend may copy only contiguous host
    tensors (torch-opencl: "_copy_from: src must be contiguous"), so after such a
    refusal the same move from contiguous copies. Asked only after a refusal, so every
    other move pays nothing; a failure that is not this one fails again, and is raised.
    """
    try:
        return move_batch(batch, device)
    except RuntimeError:
        if device.type != torch._C._get_privateuse1_backend_name():
            raise
        return move_batch(map_nested(batch, _contiguous_on_host, what="batch"), device)


def _contiguous_on_host(tensor: torch.Tensor) -> torch.Tensor:
    # Only host tensors: a tensor already on the device passes through as it is.
    return tensor.contiguous() if tensor.device.type == "cpu" else tensor


class BatchMover:
    """:func:`move_batch_or_copies` to ``device`` as an object: the ``move`` a
    ``device_loader`` hook gets from the handle when no plugin moves batches itself
    (the same move as accel's ``batch_to_device`` fallback), so that the hook can tell
    when a batch it already put on ``device`` needs nothing more."""

    __slots__ = ("device",)

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, batch: Any) -> Any:
        return move_batch_or_copies(batch, self.device)


# device -> whether it is a CUDA device: ``device.type`` builds a string on every read
# (0.3 µs, a tenth of moving a small batch), a dict lookup does not.
_IS_CUDA: dict[torch.device, bool] = {}


def _to_cuda(device: torch.device) -> bool:
    is_cuda = _IS_CUDA.get(device)
    if is_cuda is None:
        is_cuda = _IS_CUDA[device] = device.type == "cuda"
    return is_cuda


def _tensor_mover(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    if not _to_cuda(device):

        def move(tensor: torch.Tensor) -> torch.Tensor:
            # No keyword when it would be False: passing it costs ~0.4 µs a tensor.
            return tensor.to(device)

        return move

    def move_to_cuda(tensor: torch.Tensor) -> torch.Tensor:
        # Pinned host memory can be copied to CUDA asynchronously; the copy is ordered
        # on the current stream, so later kernels see the data.
        if tensor.device.type == "cpu" and tensor.is_pinned():
            return tensor.to(device, non_blocking=True)
        return tensor.to(device)

    return move_to_cuda
