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
from accel.training.batch import BatchMover

if TYPE_CHECKING:
    import torch
    from torch import nn

    from accel._core.hooks import AcceleratorHooks
    from accel.training.device_loader import DeviceLoader
    from accel.training.memory import MemoryStats

__all__ = ["HandleBase", "TrainingStepMethods"]

_Batch = TypeVar("_Batch")
_Compiled = TypeVar("_Compiled", bound=Callable[..., Any])
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
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], Any] | None = None,
        *,
        scaler: torch.amp.GradScaler | None = None,
    ) -> Any:
        """Step ``optimizer`` as this accelerator needs; return what the step returns.

        On XLA this reduces gradients across replicas when several processes train
        (torch_xla's own reduction; not again for gradients :meth:`clip_grad_norm_`
        reduced), steps, and marks the step, so a loop compiles a bounded number of
        graphs. Elsewhere it is ``optimizer.step(closure)``. With ``scaler`` (from
        :meth:`grad_scaler`) the step is ``scaler.step(optimizer)`` then
        ``scaler.update()``, inside the same reduction and mark.

        :raises TypeError: ``optimizer`` is not a ``torch.optim.Optimizer``,
            ``closure`` is neither ``None`` nor callable, or ``scaler`` is no scaler.
        :raises ValueError: both ``closure`` and an enabled ``scaler``.
        """
        if type(optimizer) not in _OPTIMIZER_CLASSES:
            _check_optimizer(optimizer)
        if closure is not None and not callable(closure):
            raise TypeError(
                f"optimizer_step(closure=...) expects a callable that re-evaluates the "
                f"model and returns the loss, or None; got {type(closure).__name__}"
            )
        if scaler is not None:
            _check_scaler(scaler, closure)
        if self._hooks.only_fallback("optimizer_step"):
            # No plugin steps differently: skip the hook machinery (a few µs a step).
            try:
                if scaler is not None:
                    return _scaled_step(optimizer, scaler, closure)
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
            return self._hooks.optimizer_step(optimizer, closure, self.device, scaler)
        except Exception as exc:
            add_note(
                exc,
                f"accel: optimizer_step for accelerator {self.name!r} failed; the model "
                f"and optimizer are as the optimizer left them.",
            )
            raise

    def clip_grad_norm_(
        self,
        parameters: Iterable[torch.Tensor] | torch.Tensor,
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Scale the gradients of ``parameters`` so their total ``norm_type``-norm is at
        most ``max_norm``; return the norm before clipping, as a tensor (no host sync).

        Equal to ``torch.nn.utils.clip_grad_norm_`` on one device; with FSDP2's sharded
        gradients the norm is the whole model's. On XLA with several replicas the
        gradients are reduced across replicas first (so every replica clips the same,
        reduced gradients) and :meth:`optimizer_step` does not reduce them again. With a
        float16 ``scaler``, call ``scaler.unscale_(optimizer)`` first.

        :raises TypeError: ``parameters`` holds something other than tensors, or a norm
            is not a number.
        :raises ValueError: ``max_norm`` is negative or NaN, or ``norm_type`` is not
            positive.
        """
        from accel.training.clipping import checked_clip_arguments

        params, maximum, norm = checked_clip_arguments(parameters, max_norm, norm_type)
        return self._hooks.clip_grad_norm_(params, maximum, norm, self.device)

    # Users call it on the handle: a call without max_norm then says
    # "Accelerator.clip_grad_norm_() missing 1 required positional argument: 'max_norm'",
    # not the name of this internal method group (Accelerator inherits it unchanged).

    def no_sync(self, model: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """A context in which ``backward()`` does not all-reduce ``model``'s gradients:
        the micro-steps of gradient accumulation. ``enabled=False`` (the last micro-step)
        changes nothing, so one ``with`` serves every micro-step.

        DDP's ``no_sync()``; FSDP2's ``set_requires_gradient_sync(False)`` (set back to
        ``True`` on exit); on XLA, where gradients are reduced only in
        :meth:`clip_grad_norm_` and :meth:`optimizer_step`, and for a plain model,
        nothing to skip.

        :raises TypeError: ``model`` is not a module, or ``enabled`` not a bool.
        """
        from torch import nn

        if not isinstance(model, nn.Module):
            raise TypeError(
                f"no_sync expects the model being trained (a torch.nn.Module, e.g. the "
                f"DistributedDataParallel wrapper), got {type(model).__name__}"
            )
        if not isinstance(enabled, bool):
            raise TypeError(f"no_sync(enabled=...) expects a bool, got {type(enabled).__name__}")
        return self._hooks.no_sync(model, enabled, self.device)

    def grad_scaler(
        self, dtype: torch.dtype | str | None = None, **options: Any
    ) -> torch.amp.GradScaler | None:
        """A ``torch.amp.GradScaler`` for this device where training in ``dtype`` (by
        default the accelerator's :meth:`autocast` type) needs loss scaling, float16;
        ``None`` for bfloat16 and float32. ``options`` go to the scaler
        (``init_scale=``, ``growth_interval=``, ...). Pass the result to
        :meth:`optimizer_step` as ``scaler=``; ``None`` there means no scaling, so one
        loop serves both.

        :raises ValueError: the device cannot autocast to ``dtype``.
        """
        import torch

        from accel.training.precision import requested_dtype

        chosen = requested_dtype(dtype)
        if chosen is None:
            # The accelerator's default, as its autocast hook chooses it.
            context = self._hooks.autocast(self.device, None)
            chosen = getattr(context, "fast_dtype", None)
        elif chosen is not torch.float32:
            self._hooks.autocast(self.device, chosen)  # the same refusal as autocast()
        if chosen is not torch.float16:
            return None
        return self._hooks.grad_scaler(self.device, options)

    def compile(self, model: _Compiled, **options: Any) -> _Compiled:
        """``torch.compile(model, **options)`` with this accelerator's backend (the
        ``compile_backend`` hook: inductor on the CPU and CUDA, ``openxla`` on TPU);
        ``backend=`` in ``options`` overrides it. The compiled module shares the
        model's parameters, so ties stay tied, and :meth:`state_dict` of it has the
        plain model's keys (no ``_orig_mod.`` prefix).

        :raises TypeError: ``model`` is neither a module nor a callable.
        """
        import torch

        if not callable(model):
            raise TypeError(
                f"compile expects a torch.nn.Module or a function, got {type(model).__name__}"
            )
        backend = options.pop("backend", None)
        if backend is None:
            backend = self._hooks.compile_backend(self.device)
        return torch.compile(model, backend=backend, **options)  # type: ignore[return-value]

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

    def autocast(
        self, dtype: torch.dtype | str | None = None, *, enabled: bool = True
    ) -> AbstractContextManager[Any]:
        """A context manager running its block in mixed precision on this accelerator.

        ``dtype`` defaults to the accelerator's preferred low-precision type: bfloat16
        on TPU and CPU, on CUDA bfloat16 where the GPU supports it and float16
        otherwise, float16 on MPS. Uses ``torch.autocast``. A dtype may be given by
        name (``"bfloat16"``).

        ``enabled=False``, or ``dtype=torch.float32``, runs the block in full
        precision, also inside an enclosing ``autocast`` block (a loss computed in
        float32); that needs no plugin, so it asks no hook.

        :raises ValueError: the device cannot autocast to ``dtype`` (torch itself would
            only warn and run the block in full precision).
        """
        import torch

        from accel.training.precision import full_precision, requested_dtype

        chosen = requested_dtype(dtype)
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast(enabled=...) expects a bool, got {type(enabled).__name__}")
        if not enabled or chosen is torch.float32:
            return full_precision(self.device)
        return self._hooks.autocast(self.device, chosen)

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
        # No plugin moves batches: the hook gets move_batch itself, which it may skip for
        # a batch it already put on the device (XLA).
        only_fallback = self._hooks.only_fallback("batch_to_device")
        move = BatchMover(self.device) if only_fallback else self.batch_to_device
        batches = self._hooks.device_loader(loader, self.device, move)
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


def _check_scaler(scaler: object, closure: object) -> None:
    from accel.training.scaling import checked_scaler

    checked_scaler(scaler, "optimizer_step(scaler=...)")
    if closure is not None and getattr(scaler, "is_enabled", lambda: True)():
        raise ValueError(
            "optimizer_step: a closure cannot be combined with an enabled GradScaler "
            "(torch's scaler.step() does not support closures); step without the "
            "closure, or pass scaler=None"
        )


def _scaled_step(
    optimizer: torch.optim.Optimizer, scaler: Any, closure: Callable[[], Any] | None
) -> Any:
    from accel.training.scaling import scaled_step

    return scaled_step(optimizer, scaler, closure)
