"""The training-step methods of the :class:`~accel.Accelerator` handle.

Each runs its hook of the same name (see :mod:`accel.hookspecs`): the selected
accelerator's plugin answers, accel's fallback last. The handle inherits them, so a
training loop sees one object; they live here because they are the training step's
job, not selection's or the move's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from accel._core.notes import add_note

if TYPE_CHECKING:
    import torch

    from accel._core.hooks import AcceleratorHooks
    from accel.training.device_loader import DeviceLoader
    from accel.training.memory import MemoryStats

__all__ = ["HandleBase", "TrainingStepMethods"]

_Batch = TypeVar("_Batch")
# Optimizer classes already checked: one set lookup per optimizer_step, not an isinstance
# against a lazily imported torch class.
_OPTIMIZER_CLASSES: set[type] = set()


class HandleBase:
    """What the handle's method groups need of it (the handle itself provides them)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _hooks: AcceleratorHooks
        device: torch.device

        @property
        def name(self) -> str: ...

        def batch_to_device(self, batch: Any) -> Any: ...


class TrainingStepMethods(HandleBase):
    """Stepping, marking, seeding, precision, memory and loading, per accelerator."""

    __slots__ = ()

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None
    ) -> Any:
        """Step ``optimizer`` as this accelerator needs; return what the step returns.

        On XLA this reduces gradients across replicas when several processes train
        (torch_xla's own reduction), steps, and marks the step, so a loop compiles a
        bounded number of graphs. Elsewhere it is ``optimizer.step(closure)``.

        :raises TypeError: ``optimizer`` is not a ``torch.optim.Optimizer``, or
            ``closure`` is neither ``None`` nor callable.
        """
        if type(optimizer) not in _OPTIMIZER_CLASSES:
            _check_optimizer(optimizer)
        if closure is not None and not callable(closure):
            raise TypeError(
                f"optimizer_step(closure=...) expects a callable that re-evaluates the "
                f"model and returns the loss, or None; got {type(closure).__name__}"
            )
        if self._hooks.only_fallback("optimizer_step"):
            # No plugin steps differently: skip the hook machinery (a few µs a step).
            try:
                return optimizer.step() if closure is None else optimizer.step(closure)
            except Exception as exc:
                add_note(
                    exc,
                    f"accel: raised in optimizer_step for accelerator {self.name!r} "
                    f"(accel's built-in step, {type(optimizer).__name__}.step); the model "
                    f"and optimizer are as the optimizer left them.",
                )
                raise
        try:
            return self._hooks.optimizer_step(optimizer, closure, self.device)
        except Exception as exc:
            add_note(
                exc,
                f"accel: optimizer_step for accelerator {self.name!r} failed; the model "
                f"and optimizer are as the optimizer left them.",
            )
            raise

    def mark_step(self) -> None:
        """End a step: on XLA, cut the pending lazy graph and run it; elsewhere nothing."""
        if self._hooks.only_fallback("mark_step"):
            return
        self._hooks.mark_step(self.device)

    def synchronize(self) -> None:
        """Block until the device has finished the work queued on it so far."""
        from accel._core.fallbacks import torch_accelerator

        # Only the fallback answers, and it has nothing to wait for: skip the hook call.
        # (It does wait for a device torch drives itself, through torch.accelerator.)
        if self._hooks.only_fallback("synchronize") and torch_accelerator(self.device.type) is None:
            return
        self._hooks.synchronize(self.device)

    def manual_seed(self, seed: int) -> None:
        """Seed torch on the host and on this accelerator's devices (XLA keeps its own
        random state), so the same seed gives the same run on this accelerator.

        :raises TypeError: ``seed`` is not an int.
        :raises ValueError: ``seed`` is outside what torch accepts.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"manual_seed expects an int seed, got {type(seed).__name__}")
        if not -(2**63) <= seed < 2**64:
            raise ValueError(
                f"manual_seed: seed {seed} is outside torch's range [-2**63, 2**64); "
                f"reduce it, e.g. seed % 2**63"
            )
        self._hooks.manual_seed(seed, self.device)

    def autocast(self, dtype: torch.dtype | None = None) -> AbstractContextManager[Any]:
        """A context manager running its block in mixed precision on this accelerator.

        ``dtype`` defaults to the accelerator's preferred low-precision type: bfloat16
        on TPU and CPU, on CUDA bfloat16 where the GPU supports it and float16
        otherwise, float16 on MPS. Uses ``torch.autocast``.

        :raises ValueError: the device cannot autocast to ``dtype`` (torch itself would
            only warn and run the block in full precision).
        """
        return self._hooks.autocast(self.device, dtype)

    def memory_stats(self) -> MemoryStats:
        """This device's memory: ``allocated_bytes``, ``peak_allocated_bytes``,
        ``total_bytes``, the same keys on every accelerator; a value the runtime does not
        report is ``None``. On the CPU: the process's resident memory and the RAM.
        """
        return self._hooks.memory_stats(self.device)

    def device_loader(self, loader: Iterable[_Batch]) -> DeviceLoader[_Batch]:
        """Iterate ``loader``'s batches already on :attr:`device`, moved ahead of use.

        XLA uses torch_xla's parallel loader (which also marks the step per batch),
        CUDA copies the next batch from pinned memory while the current one is used,
        the CPU yields the batches as they are. ``len()`` is the loader's, where it
        has one; every ``for`` over the result is a new epoch.

        :raises TypeError: ``loader`` is not iterable.
        """
        from accel.training.device_loader import DeviceLoader

        if not isinstance(loader, Iterable) or isinstance(loader, (str, bytes)):
            raise TypeError(
                f"device_loader expects an iterable of batches (a DataLoader), got "
                f"{type(loader).__name__}"
            )
        batches = self._hooks.device_loader(loader, self.device, self.batch_to_device)
        return DeviceLoader(loader, batches, f"{type(loader).__name__} -> {self.device}")


def _check_optimizer(optimizer: object) -> None:
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        hint = (
            " (a learning-rate scheduler: pass the optimizer it schedules)"
            if hasattr(optimizer, "get_last_lr")
            else ""
        )
        raise TypeError(
            f"optimizer_step expects a torch.optim.Optimizer, got {type(optimizer).__name__}{hint}"
        )
    _OPTIMIZER_CLASSES.add(type(optimizer))
