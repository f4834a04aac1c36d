"""Iterating a data loader with the batches already on the accelerator.

:meth:`accel.Accelerator.device_loader` wraps any iterable of batches in a
:class:`DeviceLoader`; the accelerator's ``device_loader`` hook decides how the
batches travel (torch_xla's parallel loader on XLA, one batch ahead from pinned
memory on CUDA, as they are on the CPU). The helpers here are those strategies'
device-independent parts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from accel.errors import AcceleratorTypeError

__all__ = ["DeviceLoader"]

_Batch = TypeVar("_Batch")


class DeviceLoader(Generic[_Batch]):
    """Batches of ``loader``, on the accelerator's device, epoch after epoch.

    ``len()`` is the wrapped loader's, where it has one. Iterate it as you would
    the loader; every ``for`` over it is a new epoch.
    """

    __slots__ = ("_describe", "batches", "loader")

    def __init__(self, loader: Iterable[Any], batches: Iterable[_Batch], describe: str) -> None:
        #: The loader this wraps (e.g. a ``torch.utils.data.DataLoader``).
        self.loader = loader
        #: What the accelerator's ``device_loader`` hook returned: each ``for`` over
        #: this object iterates it (a plugin may recognise its own, to unwrap a loader
        #: wrapped twice).
        self.batches = batches
        self._describe = describe

    def __iter__(self) -> Iterator[_Batch]:
        return iter(self.batches)

    def __len__(self) -> int:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            raise AcceleratorTypeError(
                f"the loader wrapped by device_loader ({type(self.loader).__name__}) has "
                f"no len(); iterate it to count its batches"
            ) from None

    def __repr__(self) -> str:
        return f"DeviceLoader({self._describe})"


class MovingLoader:
    """Each batch of ``loader`` moved with ``move`` as it is taken (no look-ahead)."""

    __slots__ = ("_loader", "_move")

    def __init__(self, loader: Iterable[Any], move: Callable[[Any], Any]) -> None:
        self._loader = loader
        self._move = move

    def __iter__(self) -> Iterator[Any]:
        move = self._move
        for batch in self._loader:
            yield move(batch)


class PrefetchingLoader:
    """Moves the next batch while the current one is in use (CUDA).

    Each batch's tensors are pinned (unless the loader pinned them,
    ``DataLoader(pin_memory=True)``) so that ``move`` copies them without blocking
    the host; the copy of batch *n + 1* is queued before batch *n* is handed out.
    """

    __slots__ = ("_loader", "_move", "_pin")

    def __init__(
        self, loader: Iterable[Any], move: Callable[[Any], Any], pin: Callable[[Any], Any]
    ) -> None:
        self._loader = loader
        self._move = move
        self._pin = pin

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self._loader)
        try:
            ahead = self._move(self._pin(next(batches)))
        except StopIteration:
            return
        for batch in batches:
            following = self._move(self._pin(batch))
            yield ahead
            ahead = following
        yield ahead
