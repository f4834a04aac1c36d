"""The ``tpu`` plugin's ``device_loader``: torch_xla's parallel loader, cutting the
graph where the optimizer step is.

torch_xla's ``MpDeviceLoader`` copies each batch to the device in background threads
and marks the step (cuts and dispatches the lazy graph) as it hands out every batch.
With gradient accumulation that makes every micro-step a graph execution of its own,
with the gradients written out between them: 18 executions for 6 optimizer steps of 3
micro-batches, where one step mark per optimizer step runs 6. Here the loader still
copies ahead, but it marks the step when the next batch is handed out only if the loop
is not in the middle of accumulating gradients, that is unless a backward pass has
changed a gradient since the last batch and no optimizer step has followed it. A loop
without a backward pass (evaluation) is cut at every batch, as ``MpDeviceLoader``
does; an optimizer step is cut at the next batch (see :mod:`._xla_training`).

Which gradients: those of the first and last trainable parameter of each model moved
to XLA with ``acc.model_to_device`` (:func:`watch_model`). A loop whose model accel
did not move, or whose watched parameters do not train, is cut at every batch: every
doubt ends in torch_xla's own behaviour, never in a graph that grows.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import torch

from accel._util.notes import add_note
from accel.plugins._xla_cut import cut
from accel.training.batch import BatchMover
from accel.training.nested import map_nested

if TYPE_CHECKING:
    from torch import nn

__all__ = ["XlaLoader", "loop_state", "watch_model"]

#: ``batches_per_execution`` for torch_xla's loader: it never marks a step itself.
_NEVER: Final = sys.maxsize


class XlaLoader:
    """torch_xla's ``MpDeviceLoader`` over ``loader``, re-raising the loader's errors,
    marking the step itself (see the module's docstring).

    The parallel loader copies each batch's CPU tensors to ``device`` in a background
    thread; tensors already on an XLA device stay out of it (torch_xla aborts on them:
    ``Check failed: tensor_data``). Each batch is then rebuilt as the loader made it
    (:mod:`accel.training.nested`'s rules, as on every accelerator) and passed
    through ``move``, the handle's ``batch_to_device``, so the plugins' batch hooks
    run on TPU too (they see the tensors already on the device). When ``move`` is
    accel's own :class:`~accel.training.batch.BatchMover` (no plugin moves batches),
    a batch torch_xla moved whole is handed out as it comes.

    ``MpDeviceLoader`` reads the loader in a background thread; an exception there
    ends that thread and the iteration simply stops, as if the epoch were over.
    Here the exception is caught in the thread and raised in the training loop.
    """

    __slots__ = ("device", "loader", "move")

    def __init__(
        self, loader: Iterable[Any], device: torch.device, move: Callable[[Any], Any]
    ) -> None:
        self.loader = loader
        self.device = device
        self.move = move

    def __iter__(self) -> Iterator[Any]:
        import torch_xla.distributed.parallel_loader as pl

        source = _Capturing(self.loader)
        skeletons = source.skeletons
        move = self.move
        # Batches torch_xla moved whole are on the device: only plugins' hooks are left.
        moved_whole_is_done = isinstance(move, BatchMover) and move.device == self.device
        loop = _LOOP_STATE
        batches = iter(pl.MpDeviceLoader(source, self.device, batches_per_execution=_NEVER))
        watched = _WATCHED
        versions, gradients = -1, 0  # the watched parameters when the last batch was taken
        loop.active += 1
        try:
            while True:
                if watched.refs:
                    versions_now, gradients_now = watched.signature()
                    # Between micro-steps: a backward pass changed a gradient (created
                    # it, or added to it), and no step changed a parameter.
                    accumulating = versions_now == versions and gradients_now not in (gradients, 0)
                    versions, gradients = versions_now, gradients_now
                else:
                    accumulating = False
                if loop.owed or not accumulating:
                    cut()  # before waiting for the batch: the step runs meanwhile
                    loop.owed = False
                try:
                    moved = next(batches)
                except StopIteration:
                    break
                loop.fetches += 1
                skeleton = skeletons.popleft()
                if skeleton is _AS_MOVED:
                    yield moved if moved_whole_is_done else move(moved)
                elif skeleton is tuple:  # torch_xla hands tuples back as lists
                    yield tuple(moved) if moved_whole_is_done else move(tuple(moved))
                else:  # rebuild the batch as the loader made it around the moved tensors
                    yield move(map_nested(skeleton, partial(_fill, moved), leaf_type=_Slot))
        finally:  # also on `break`: the loop's last step is marked here
            loop.active -= 1
            if loop.owed:
                cut()
                loop.owed = False
        if source.error is not None:
            add_note(
                source.error,
                f"accel: raised by the loader after {source.count} batches, in "
                f"torch_xla's loader thread; the batches before it were used.",
            )
            raise source.error


def chain(first: Callable[[Any], Any], then: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``then(first(batch))``: a loader wrapped twice moves each batch through both."""
    return lambda batch: then(first(batch))


# -- where the step is ----------------------------------------------------------------


class _LoopState(threading.local):
    """Per thread: the device_loader loops running and the steps they owe a mark."""

    def __init__(self) -> None:
        self.active = 0  # XlaLoader iterations in progress
        self.fetches = 0  # batches they handed out
        self.fetches_at_last_step = -1  # ``fetches`` at the last optimizer_step
        self.owed = False  # an optimizer_step left its mark to the next batch


_LOOP_STATE = _LoopState()


def loop_state() -> _LoopState:
    """This thread's device_loader loops, shared with ``optimizer_step``."""
    return _LOOP_STATE


class _WatchedParameters:
    """Weak references to the parameters whose gradients tell accumulation apart."""

    __slots__ = ("_lock", "refs")

    def __init__(self) -> None:
        self.refs: list[weakref.ref[torch.Tensor]] = []
        self._lock = threading.Lock()

    def add(self, parameters: Iterable[torch.Tensor]) -> None:
        with self._lock:
            live = [ref for ref in self.refs if ref() is not None]
            known = {id(ref()) for ref in live}
            self.refs = live + [weakref.ref(p) for p in parameters if id(p) not in known]

    def signature(self) -> tuple[int, int]:
        """The sum of the parameters' versions (an optimizer step changes them in place,
        and versions only grow), and a sum over their gradients that a backward pass
        changes (a new gradient, or one added to in place, bumping its version); 0
        while no parameter has a gradient. A coincidence between two batches' sums (a
        watched model freed, another moved) costs one cut more or one fewer, never a
        graph that keeps growing: the next optimizer step is cut again."""
        versions = gradients = 0
        for ref in self.refs:
            parameter = ref()
            if parameter is not None:
                versions += parameter._version
                grad = parameter.grad
                if grad is not None:
                    gradients += id(grad) + grad._version
        return versions, gradients


_WATCHED = _WatchedParameters()


def watch_model(model: nn.Module) -> None:
    """Tell accumulation apart by the gradients of ``model``'s first and last trainable
    parameters (fine-tuning often freezes the first layers, rarely the head)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if trainable:
        _WATCHED.add({id(p): p for p in (trainable[0], trainable[-1])}.values())


# -- batches in torch_xla's loader thread ------------------------------------------------


class _Slot:
    """Where the ``index``-th tensor of a batch goes back in."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


#: A batch that torch_xla rebuilds as it was: a plain dict or list of CPU tensors.
_AS_MOVED: Final = object()


class _Capturing:
    """Iterates ``loader`` (in torch_xla's loader thread), keeping the exception that
    ends it. A plain dict, list or tuple of CPU tensors, or one CPU tensor, goes to
    torch_xla as it is (it rebuilds those itself, tuples as lists); any other batch as a
    flat list of its CPU tensors. What it takes to rebuild each batch waits in
    ``skeletons``, in order, for the training loop."""

    __slots__ = ("_loader", "count", "error", "skeletons")

    def __init__(self, loader: Iterable[Any]) -> None:
        self._loader = loader
        self.error: Exception | None = None
        self.count = 0
        self.skeletons: deque[Any] = deque()  # appended here, popped there: thread-safe

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        tensor_type = torch.Tensor
        skeletons = self.skeletons
        try:
            for batch in self._loader:
                kind = type(batch)
                if kind is tensor_type:
                    plain = batch.is_cpu
                elif kind is dict or kind is list or kind is tuple:
                    plain = True  # (a loop, not all(): this runs for every batch)
                    for value in batch.values() if kind is dict else batch:
                        # Only exact tensors: torch_xla leaves subclasses where they are.
                        if type(value) is not tensor_type or not value.is_cpu:
                            plain = False
                            break
                else:
                    plain = False
                if plain:
                    skeletons.append(tuple if kind is tuple else _AS_MOVED)
                    self.count += 1
                    yield batch
                    continue
                tensors: list[torch.Tensor] = []
                skeletons.append(map_nested(batch, partial(_take, tensors)))
                self.count += 1
                yield tensors
        except Exception as exc:
            self.error = exc


def _take(tensors: list[torch.Tensor], tensor: torch.Tensor) -> _Slot | torch.Tensor:
    if tensor.device.type != "cpu":
        return tensor  # already on a device: kept, and `move` sees it
    tensors.append(tensor)
    return _Slot(len(tensors) - 1)


def _fill(tensors: list[torch.Tensor], slot: _Slot) -> torch.Tensor:
    return tensors[slot.index]
