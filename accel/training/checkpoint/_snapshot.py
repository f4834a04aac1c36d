"""The snapshot an asynchronous save writes: every tensor of the stored object copied
into fresh CPU memory before the save returns, so that nothing the loop changes
afterwards reaches the file.

CPU tensors are copied too. Handing the live tensors to a background writer is the bug
of pytorch #144657 (DCP's staging kept CPU tensors as they were, and the optimizer's
next steps leaked into the checkpoint being written).

What shares memory keeps sharing it. One tensor under two names (a tied weight) stays
one tensor, and views of one storage stay views of one copied storage, as
``torch.save`` stores them. CPU and CUDA tensors are copied storage by storage.
Tensors of other devices (XLA, a vendor's) and tensor subclasses are copied one by
one, with ``tensor.to("cpu", copy=True)``, the device's own transfer.

The copies go into the storages of the previous snapshot where their sizes match
(``spare``), as DCP's cached stager does. A storage above glibc's mmap threshold (32
MiB at most) gets fresh pages from the kernel at every allocation, each faulting as
it is first written: copying 4 x 64 MiB into fresh storages took 0.14 s on this
project's machine, into storages written before 0.03 s (medians of 7). So a process
that saves asynchronously holds one snapshot's host memory from its first save on.

On CUDA the copy is synchronous, into pageable host memory. Pinned buffers would
copy faster, but torch's caching host allocator rounds each block up to a power of
two, and registering pageable memory with CUDA means managing it by hand, which
nothing here could test (no GPU).
"""

from __future__ import annotations

import copy
import ctypes
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Any, Final

import torch

__all__ = ["take_snapshot"]

_MAPPINGS: Final = (dict, OrderedDict, Counter)
#: Devices whose storages the host copies byte for byte (``UntypedStorage.copy_``).
_STORAGE_DEVICES: Final = frozenset({"cpu", "cuda"})


def take_snapshot(
    stored: Any, spare: Iterable[torch.UntypedStorage] = ()
) -> tuple[Any, list[torch.UntypedStorage]]:
    """``stored`` (what :func:`~accel.training.checkpoint._save.storable` returned) rebuilt
    with every tensor copied to CPU memory of its own, detached; sharing kept. Also
    the storages the copies live in, for the next snapshot's ``spare``.

    Dicts, lists, tuples and sets are rebuilt (a state dict keeps its ``_metadata``),
    an object that contains itself still does, plain values are kept. A value of a
    type allowed with ``torch.serialization.add_safe_globals`` is deep-copied.

    :param spare: storages nothing else uses any more (the last snapshot's), copied
        into where one has the size needed; those it does not reuse are not kept.
    """
    memo: dict[int, Any] = {}
    storages: dict[tuple[str, int, int], torch.UntypedStorage] = {}
    owned: list[torch.UntypedStorage] = []
    by_size: dict[int, list[torch.UntypedStorage]] = {}
    for storage in spare:
        by_size.setdefault(storage.nbytes(), []).append(storage)
    atomic = (type(None), bool, int, float, complex, str, bytes, torch.Size, torch.dtype,
              torch.device, torch.layout)  # fmt: skip

    def copy_tensor(tensor: torch.Tensor) -> torch.Tensor:
        plain = tensor.detach()
        if not _copied_by_storage(plain):
            return plain.to("cpu", copy=True)
        storage = plain.untyped_storage()
        key = (str(plain.device), storage.data_ptr(), storage.nbytes())
        copied = storages.get(key) if storage.nbytes() else None
        if copied is None:
            same_size = by_size.get(storage.nbytes())
            copied = same_size.pop() if same_size else _new_storage(storage.nbytes())
            if plain.device.type == "cpu":
                # One memcpy: torch's copy_ splits a large copy over its intra-op
                # threads, and on a host whose cores are shared one descheduled thread
                # stalls them all (3x slower, measured on this project's machine).
                ctypes.memmove(copied.data_ptr(), storage.data_ptr(), storage.nbytes())
            else:
                copied.copy_(storage)  # CUDA: a synchronous copy into pageable memory
            storages[key] = copied
            owned.append(copied)
        view = torch.empty(0, dtype=plain.dtype)
        return view.set_(copied, plain.storage_offset(), plain.size(), plain.stride())

    def convert(value: Any) -> Any:
        key = id(value)
        if key in memo:
            return memo[key]
        kind = type(value)
        if isinstance(value, torch.Tensor):
            memo[key] = copy_tensor(value)
        elif kind in _MAPPINGS:
            rebuilt = memo[key] = copy.copy(value)  # registered first: a cycle comes back here
            for name, item in value.items():
                rebuilt[name] = convert(item)
        elif kind is list:
            items: list[Any] = []
            memo[key] = items
            items.extend(convert(item) for item in value)
        elif kind is tuple:
            memo[key] = tuple(convert(item) for item in value)
        elif kind is set:
            memo[key] = {convert(item) for item in value}
        elif kind in atomic:
            return value
        else:  # bytearray, or a type the user allowed for loading: a copy of its own
            memo[key] = copy.deepcopy(value)
        return memo[key]

    return convert(stored), owned


def _new_storage(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(nbytes)  # type: ignore[no-untyped-call]


def _copied_by_storage(tensor: torch.Tensor) -> bool:
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type in _STORAGE_DEVICES
        and tensor.layout == torch.strided
        and not (tensor.is_quantized or tensor.is_conj() or tensor.is_neg())
    )
