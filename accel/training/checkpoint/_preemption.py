"""Preemption: a signal that asks a run to stop becomes a flag the loop checks at a step
boundary, the same step on every process, so every process saves and leaves together.

SLURM (``--signal=USR1@90`` or at the time limit), Kubernetes and spot VMs send SIGTERM
(or the signal asked for) some seconds before they kill the process. The default
SIGTERM handler dies on the spot, mid-step or mid-save; the guard notes the signal
instead. In a :mod:`torch.distributed` job the ranks agree on the flag with an
all-reduce started at one check and read at the next, so a check never waits on the
network: the request shows one step after the signal on every rank at once. A signal
noted before the guard was entered (``_early_signals``: from the run's first call into
accel) is agreed on at entry, and shows at the first read.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Final, final

import torch
import torch.distributed as dist

from accel.errors import AcceleratorRuntimeError
from accel.training.checkpoint._async_save import wait_for_saves
from accel.training.checkpoint._early_signals import DEFAULT_SIGNALS, take_early_signal

if TYPE_CHECKING:
    import torch

__all__ = ["PreemptionGuard"]

#: The guards entered and not yet left, innermost last.
_ENTERED: Final[list[PreemptionGuard]] = []


@final
class PreemptionGuard:
    """Notes preemption signals while active; ``requested`` says when to save and stop.

    Use it through :meth:`Accelerator.preemption_guard`. Signal handlers can only be set
    from the main thread, so it must be entered there. Guards nest: a signal noted by
    the inner one reaches the enclosing one too, and on exit the inner one passes on a
    request it saw, so the outer loop stops as well. A signal noted before it was
    entered, or outside its own signals by the early handler, is taken over as its own.
    """

    __slots__ = (
        "_device",
        "_enclosing",
        "_pending",
        "_previous",
        "_requested",
        "_signals",
        "received",
    )

    def __init__(self, device: torch.device, *, signals: tuple[int, ...] | None = None) -> None:
        self._device = device
        self._signals = DEFAULT_SIGNALS if signals is None else tuple(signals)
        self._previous: dict[int, Any] = {}
        self._pending: tuple[Any, torch.Tensor] | None = None
        self._requested = False
        #: The guard this one was entered inside (``None``: the outermost).
        self._enclosing: PreemptionGuard | None = None
        #: The signal noted in this process (``None``: none yet).
        self.received: int | None = None

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is not threading.main_thread():
            raise AcceleratorRuntimeError(
                "preemption_guard() must be entered in the main thread: Python delivers "
                "signals there only; enter it around the training loop in the main thread"
            )
        for number in self._signals:
            self._previous[number] = signal.signal(number, self._note)
        # Handlers are per signal, so a guard for other signals would not be found
        # through them: the guards entered (in the main thread) are a stack.
        self._enclosing = _ENTERED[-1] if _ENTERED else None
        _ENTERED.append(self)
        self._take_early_signal()
        if _distributed():
            # Agree now on what was noted before the loop: the first read then has the
            # answer, so a signal from start-up stops the run at its first step.
            self._start_agreement(self.received is not None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._pending is not None:
            self._pending[0].wait()  # leave no collective half done
            self._pending = None
        if self in _ENTERED:
            _ENTERED.remove(self)
        outer, self._enclosing = self._enclosing, None
        if outer is not None:
            # A signal the outer guard does not watch, or a request the ranks agreed on
            # in here, still means: stop. (Agreement is reached at the same read on
            # every rank, so every rank passes it on alike.)
            if outer.received is None:
                outer.received = self.received
            outer._requested = outer._requested or self._requested
        # The loop leaves after its last save: the process may end as soon as this
        # returns, so an asynchronous save must be complete first (and raise here).
        wait_for_saves()

    def _take_early_signal(self) -> None:
        early = take_early_signal()
        if self.received is None:
            self.received = early

    def _start_agreement(self, local: bool) -> None:
        # nccl reduces device tensors only; gloo host tensors.
        device = self._device if dist.get_backend() == "nccl" else torch.device("cpu")
        flag = torch.tensor([int(local)], dtype=torch.int32, device=device)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)

    def _note(self, number: int, frame: FrameType | None) -> None:
        self.received = number
        if self._enclosing is not None:  # nested: the enclosing guard's loop must stop too
            self._enclosing._note(number, frame)

    @property
    def requested(self) -> bool:
        """Whether to save and stop now. Read it once per step, on every process: in a
        distributed job the processes agree at each read (it stays true once true)."""
        if self._requested:
            return True

        self._take_early_signal()
        local = self.received is not None
        if not _distributed():
            self._requested = local
            return local

        agreed = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            agreed = bool(flag.item())
        if agreed:
            self._pending = None
            self._requested = True
            return True
        self._start_agreement(local)
        return False


def _distributed() -> bool:
    """Whether the ranks must agree: a :mod:`torch.distributed` group of several."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
