"""The handle :func:`accel.get_accelerator` returns."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, final

from accel._core.transaction import RestorePoint
from accel.errors import PluginError
from accel.training.batch import move_batch
from accel.types import AcceleratorSpec, MoveContext, TieCheck, checked_tie_check

if TYPE_CHECKING:
    import torch
    from torch import nn

    from accel._core.dispatch import AcceleratorHooks
    from accel.training.device_loader import DeviceLoader
    from accel.training.memory import MemoryStats

__all__ = ["Accelerator"]

_Model = TypeVar("_Model", bound="nn.Module")
_Batch = TypeVar("_Batch")
# Optimizer classes already checked: one set lookup per optimizer_step, not an isinstance
# against a lazily imported torch class.
_OPTIMIZER_CLASSES: set[type] = set()


@final
class Accelerator:
    """One selected accelerator and device: moves models and batches there.

    Obtain it from :func:`accel.get_accelerator` or
    :meth:`AcceleratorRegistry.get_accelerator`; every operation runs the hooks of
    this accelerator's plugin and of cross-cutting plugins, never another
    accelerator's.
    """

    __slots__ = ("_hooks", "_tie_check", "device", "index", "spec")

    def __init__(
        self,
        hooks: AcceleratorHooks,
        spec: AcceleratorSpec,
        *,
        index: int | None,
        device: torch.device,
        tie_check: TieCheck = "error",
    ) -> None:
        self._hooks = hooks
        #: What the plugin declared: name, aliases, priority, description.
        self.spec = spec
        #: The device index asked for (``None``: the accelerator's default device).
        self.index = index
        #: The :class:`torch.device` models and batches move to, e.g. ``xla:0``.
        self.device = device
        self._tie_check: TieCheck = tie_check

    @property
    def name(self) -> str:
        """Canonical accelerator name, e.g. ``"tpu"`` (also when selected as ``"xla"``)."""
        return self.spec.name

    @property
    def tie_check(self) -> TieCheck:
        """What a move does when tied weights came apart.

        ``"error"`` (default) raises :class:`accel.WeightTyingError` and restores the
        model; ``"warn"`` warns and keeps the moved model with the ties and values it
        had before the move; ``"off"`` does the same silently. Only moves that can untie
        weights (to or from XLA, to ``meta``, torch's overwrite mode) check at all.
        """
        return self._tie_check

    @tie_check.setter
    def tie_check(self, value: TieCheck) -> None:
        self._tie_check = checked_tie_check(value)

    def __repr__(self) -> str:
        return f"Accelerator(name={self.name!r}, device={str(self.device)!r})"

    def is_available(self) -> bool:
        """Whether the accelerator can still be used (asks its plugin again)."""
        return self._hooks.availability().available

    def device_count(self) -> int:
        """How many devices of this accelerator the process can use."""
        return self._hooks.device_count() if self.is_available() else 0

    def for_index(self, index: int) -> Accelerator:
        """The same accelerator on device ``index`` (as ``get_accelerator("NAME:INDEX")``).

        :raises accel.AcceleratorUnavailableError: ``index`` is beyond :meth:`device_count`.
        """
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"for_index expects a device index (an int >= 0), got {index!r}")
        device = self._hooks.device(index, requested=f"{self.name}:{index}")
        return Accelerator(
            self._hooks, self.spec, index=index, device=device, tie_check=self._tie_check
        )

    @property
    def distributed_backend(self) -> str:
        """The :mod:`torch.distributed` backend for this accelerator, e.g. ``"nccl"``."""
        return self._hooks.query("distributed_backend", str)

    def model_to_device(
        self,
        model: _Model,
        *,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    ) -> _Model:
        """Move ``model`` to :attr:`device` through the plugins' hooks and return it.

        Runs ``pre_move_hook``, ``model_to_device`` and ``post_move_hook`` (the TPU
        plugin re-ties and validates tied weights there). If any step fails, the
        model is restored exactly as it was (same objects, devices, values, ties and
        gradients) and the exception is re-raised with a note saying so.

        A torch_xla ``MpModelWrapper`` (used when processes are forked) is accepted
        too: its wrapped model moves under the wrapper's lock, as the wrapper's own
        ``to()`` would move it, and that model is returned.

        :param optimizer: optimizer(s) built on the model's parameters; their
            parameter groups and state are remapped to the moved parameters.
        """
        from torch import nn

        wrapped = _mp_model_wrapper_parts(model)
        if wrapped is not None:
            module, lock = wrapped
            with lock:  # forked processes share the wrapped model's pages: one at a time
                return self.model_to_device(module, optimizer=optimizer)  # type: ignore[return-value]
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model_to_device expects a torch.nn.Module, got {type(model).__name__}; "
                f"use batch_to_device for tensors and containers of tensors"
            )
        optimizers = _as_optimizer_list(optimizer)
        restore_point = RestorePoint(model)
        context = MoveContext(self.name, self.device, self._tie_check)
        hook_args: dict[str, Any] = {"model": model, "device": self.device, "context": context}
        try:
            self._hooks.call("pre_move_hook", **hook_args)
            moved = self._hooks.call("model_to_device", **hook_args)
            if not isinstance(moved, nn.Module):
                raise PluginError(
                    f"hook 'model_to_device' for accelerator {self.name!r} returned "
                    f"{type(moved).__name__}, not a torch.nn.Module, from "
                    f"{self._hooks.answerers('model_to_device')}. "
                    f"Report this to the plugin's authors."
                )
            self._hooks.call("post_move_hook", model=moved, device=self.device, context=context)
            if optimizers:
                from accel._core.optimizers import retarget_optimizers

                retarget_optimizers(optimizers, restore_point, self.device)
        except BaseException as exc:
            restore_point.restore()
            if hasattr(exc, "add_note"):
                exc.add_note(
                    f"accel: moving the model to {self.device} failed; the model was "
                    "restored as it was before the move."
                )
            raise
        return moved  # type: ignore[return-value]

    def batch_to_device(self, batch: Any) -> Any:
        """Move every tensor in ``batch`` (nested dicts, lists, tuples, namedtuples,
        dataclasses) to :attr:`device`, keeping container types; other values pass
        through unchanged.
        """
        if self._hooks.only_fallback("batch_to_device"):
            # No plugin moves batches differently: skip the hook machinery (a few µs
            # a call, which adds up over a training loop's small batches).
            return move_batch(batch, self.device)
        return self._hooks.call("batch_to_device", batch=batch, device=self.device)

    # -- the training step ------------------------------------------------------

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
                _add_note(
                    exc,
                    f"accel: raised in optimizer_step for accelerator {self.name!r} "
                    f"(accel's built-in step, {type(optimizer).__name__}.step); the model "
                    f"and optimizer are as the optimizer left them.",
                )
                raise
        try:
            return self._hooks.call(
                "optimizer_step", optimizer=optimizer, closure=closure, device=self.device
            )
        except Exception as exc:
            _add_note(
                exc,
                f"accel: optimizer_step for accelerator {self.name!r} failed; the model "
                f"and optimizer are as the optimizer left them.",
            )
            raise

    def mark_step(self) -> None:
        """End a step: on XLA, cut the pending lazy graph and run it; elsewhere nothing."""
        if self._hooks.only_fallback("mark_step"):
            return
        self._hooks.call("mark_step", device=self.device)

    def synchronize(self) -> None:
        """Block until the device has finished the work queued on it so far."""
        if self._hooks.only_fallback("synchronize"):
            return
        self._hooks.call("synchronize", device=self.device)

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
        self._hooks.call("manual_seed", seed=seed, device=self.device)

    def autocast(self, dtype: torch.dtype | None = None) -> AbstractContextManager[Any]:
        """A context manager running its block in mixed precision on this accelerator.

        ``dtype`` defaults to the accelerator's preferred low-precision type: bfloat16
        on TPU and CPU, on CUDA bfloat16 where the GPU supports it and float16
        otherwise, float16 on MPS. Uses ``torch.autocast``.

        :raises ValueError: the device cannot autocast to ``dtype`` (torch itself would
            only warn and run the block in full precision).
        """
        context = self._hooks.call("autocast", device=self.device, dtype=dtype)
        if not (hasattr(context, "__enter__") and hasattr(context, "__exit__")):
            raise PluginError(
                f"hook 'autocast' for accelerator {self.name!r} returned "
                f"{type(context).__name__}, not a context manager, from "
                f"{self._hooks.answerers('autocast')}. Report this to the plugin's authors."
            )
        return context  # type: ignore[no-any-return]

    def memory_stats(self) -> MemoryStats:
        """This device's memory: ``allocated_bytes``, ``peak_allocated_bytes``,
        ``total_bytes``, the same keys on every accelerator; a value the runtime does not
        report is ``None``. On the CPU: the process's resident memory and the RAM.
        """
        from accel.training.memory import checked_memory_stats

        result = self._hooks.call("memory_stats", device=self.device)
        return checked_memory_stats(result, self.name, self._hooks.answerers("memory_stats"))

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
        batches = self._hooks.call(
            "device_loader", loader=loader, device=self.device, move=self.batch_to_device
        )
        if not isinstance(batches, Iterable):
            raise PluginError(
                f"hook 'device_loader' for accelerator {self.name!r} returned "
                f"{type(batches).__name__}, not an iterable, from "
                f"{self._hooks.answerers('device_loader')}. Report this to the plugin's "
                f"authors."
            )
        return DeviceLoader(loader, batches, f"{type(loader).__name__} -> {self.device}")

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        """``model``'s state dict with every tensor on the CPU; a tensor the model holds
        under several names (a tied weight) is one CPU tensor under all of them, so
        ``torch.save`` stores it once and ``load_state_dict`` restores the tie.
        """
        from torch import nn

        if not isinstance(model, nn.Module):
            raise TypeError(
                f"state_dict expects a torch.nn.Module, got {type(model).__name__}; use "
                f"save() for other objects"
            )
        return self._hooks.query("state_dict", dict, model=model)

    def save(self, obj: Any, path: str | os.PathLike[str]) -> None:
        """Write ``obj`` to ``path`` with ``torch.save``, its tensors on the CPU (shared
        tensors stay shared); in a distributed job only the main process writes.

        Pass :meth:`state_dict`'s result, or any dict/list of tensors and values (an
        optimizer's ``state_dict()``).
        """
        from accel.training.checkpoint import to_cpu

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"save expects a file path (str or os.PathLike), got {type(path).__name__}"
            )
        self.mark_step()  # XLA: run what is pending, so tensors cross as data
        self._hooks.call("save", obj=to_cpu(obj), path=path)


def _mp_model_wrapper_parts(obj: object) -> tuple[nn.Module, Any] | None:
    """The model and lock inside torch_xla's ``MpModelWrapper``, else ``None``.

    Recognised by its class, without importing torch_xla; the attributes are the ones
    its own ``to()`` uses (stable across torch_xla releases).
    """
    cls = type(obj)
    if cls.__name__ != "MpModelWrapper" or not cls.__module__.startswith("torch_xla"):
        return None
    module, lock = getattr(obj, "_model", None), getattr(obj, "_lock", None)
    if module is None or lock is None:
        raise TypeError(
            f"model_to_device got a torch_xla MpModelWrapper without the _model/_lock "
            f"attributes accel knows ({cls.__module__}); move its model yourself with "
            f"model_to_device(wrapper._model) or pass the model unwrapped"
        )
    return module, lock


def _as_optimizer_list(
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
) -> list[torch.optim.Optimizer]:
    import torch

    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    expected = "optimizer= must be a torch.optim.Optimizer, an iterable of them, or None"
    if isinstance(optimizer, (torch.nn.Module, str, bytes)) or not isinstance(optimizer, Iterable):
        raise TypeError(f"{expected}; got {type(optimizer).__name__}")
    optimizers = list(optimizer)
    for item in optimizers:
        if not isinstance(item, torch.optim.Optimizer):
            raise TypeError(f"{expected}; got an iterable containing {type(item).__name__}")
    return optimizers


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


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(note)
