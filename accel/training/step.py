"""The parts of a training step behind the handle's methods. Plugin authors reuse
:func:`clip_grad_norm` (the ``clip_grad_norm_`` hook's example calls it); the others are
accel's own fallbacks and integrations' helpers, outside the public API.

- **Clipping** by total norm, the same on one device, on XLA and under FSDP2:
  ``torch.nn.utils.clip_grad_norm_`` on FSDP2's sharded gradients (``DTensor``)
  returns a ``DTensor`` norm; :func:`clip_grad_norm` reduces it to a plain tensor
  first, as torchtitan does. The norm stays a tensor: nothing waits for the device.
- **Accumulation**: with DDP every ``backward()`` all-reduces; over k micro-steps that
  is k - 1 reductions too many. :func:`gradient_sync_paused` uses DDP's
  ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``, or nothing.
- **Loss scaling**: float16 has 5 exponent bits, so small gradients underflow unless
  the loss is scaled (:func:`scaled_step`); bfloat16 and float32 need no scaling.
- **Compiled models**: torch's ``OptimizedModule`` prefixes every state-dict key with
  ``_orig_mod.``; :func:`unwrap_compiled` gives the model it wraps.
- **Optimizers that follow a move someone else made** (Lightning's Fabric moves the
  module, then hands over the optimizers built on it): :func:`retarget_optimizers`::

      before = dict(model.named_parameters(remove_duplicate=False))
      model = acc.model_to_device(model)
      retarget_optimizers([optimizer], before, model)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accel._util.warn import CallerLine, caller_line, warn_at
from accel.errors import AcceleratorTypeError, AcceleratorValueError, GradientSyncWarning
from accel.training._optimizers import follow_moved_parameters

__all__ = ["clip_grad_norm"]


def clip_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so their total norm is at most
    ``max_norm``; return the total norm before clipping, as a tensor.

    Equal to ``torch.nn.utils.clip_grad_norm_`` on one device; with sharded
    (``DTensor``) gradients the norm is the full one, a plain tensor.
    """
    params = list(parameters)
    grads = [param.grad for param in params if param.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False)
    # A DTensor can only exist once torch.distributed.tensor is imported.
    if "torch.distributed.tensor" in sys.modules:
        from torch.distributed.tensor import DTensor

        if isinstance(total, DTensor):
            total = total.full_tensor()  # the partial norms of every shard, reduced
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def checked_clip_arguments(
    parameters: Iterable[torch.Tensor] | torch.Tensor, max_norm: object, norm_type: object
) -> tuple[list[torch.Tensor], float, float]:
    """``clip_grad_norm_``'s arguments as a list and two floats, or a clear error.

    :raises TypeError: ``parameters`` is not a tensor or an iterable of tensors, or a
        norm is not a number.
    :raises ValueError: ``max_norm`` is negative or NaN (torch would flip or poison
        every gradient), or ``norm_type`` is not positive.
    """
    if isinstance(parameters, torch.Tensor):
        params = [parameters]
    elif isinstance(parameters, Iterable) and not isinstance(parameters, (str, bytes)):
        params = list(parameters)
        strays = sorted({type(p).__name__ for p in params if not isinstance(p, torch.Tensor)})
        if strays:
            raise AcceleratorTypeError(
                f"clip_grad_norm_ expects parameters (model.parameters(), or a list of "
                f"tensors); got an iterable containing {', '.join(strays)}"
            )
    else:
        raise AcceleratorTypeError(
            f"clip_grad_norm_ expects parameters (model.parameters(), or a list of "
            f"tensors), got {type(parameters).__name__}"
        )
    maximum = _number("max_norm", max_norm)
    if not maximum >= 0:  # also NaN
        raise AcceleratorValueError(
            f"clip_grad_norm_(max_norm={max_norm!r}): the largest total norm allowed must "
            f"be >= 0 (torch would scale every gradient by a negative or NaN factor); "
            f"pass e.g. max_norm=1.0, or math.inf to measure the norm without clipping"
        )
    norm = _number("norm_type", norm_type)
    if not norm > 0:
        raise AcceleratorValueError(
            f"clip_grad_norm_(norm_type={norm_type!r}): the p of the p-norm must be > 0; "
            f"pass 2.0 (the default), 1.0, or math.inf for the largest magnitude"
        )
    return params, maximum, norm


def _number(what: str, value: object) -> float:
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf  # torch accepts norm_type="inf" too
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AcceleratorTypeError(
            f"clip_grad_norm_({what}=...) expects a number, got {type(value).__name__} ({value!r})"
        )
    return float(value)


def gradient_sync_paused(model: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
    """A context in which ``backward()`` does not reduce ``model``'s gradients across
    processes (``enabled=False``: a context that changes nothing, for the last
    micro-step)."""
    if not enabled:
        return nullcontext()
    no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel (and FSDP1)
    if callable(no_sync):
        return no_sync()  # type: ignore[no-any-return]
    if callable(getattr(model, "set_requires_gradient_sync", None)):  # FSDP2's fully_shard
        return _fsdp2_without_sync(model)
    if dist.is_available() and dist.is_initialized():
        # Nothing to skip on a plain module, unless it is the one a DDP wrapper wraps
        # (``ddp.module``): that one's backward() all-reduces all the same.
        return _watching_for_a_wrapper(model, caller_line())
    return nullcontext()


@contextmanager
def _watching_for_a_wrapper(model: nn.Module, caller: CallerLine | None) -> Iterator[None]:
    """Warn, once, at the caller's line, if a DDP forward runs ``model`` in the block."""

    def check(module: nn.Module, args: Any) -> None:
        active = getattr(DistributedDataParallel, "_get_active_ddp_module", lambda: None)()
        if active is not None and active.module is model:
            handle.remove()
            warn_at(
                caller,
                f"acc.no_sync() was given the {type(model).__name__} that a "
                f"{type(active).__name__} wraps (its .module), so backward() still "
                f"all-reduces the gradients on every micro-step (the results are right, "
                f"the saving is lost). Pass the wrapper itself: acc.no_sync(ddp, ...), "
                f"the model wrap_data_parallel() returned, not its .module.",
                GradientSyncWarning,
            )

    handle = model.register_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def _fsdp2_without_sync(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        # FSDP2 has no getter: the next backward outside the block syncs, as with DDP.
        model.set_requires_gradient_sync(True)


_SCALER_METHODS = ("scale", "unscale_", "step", "update")


def scaled_step(
    optimizer: torch.optim.Optimizer, scaler: Any, closure: Callable[[], Any] | None = None
) -> Any:
    """``scaler.step(optimizer)`` then ``scaler.update()``; what the step returned
    (``None`` where the scaler skipped it for gradients that overflowed). A closure
    reaches the optimizer only through a disabled scaler (torch refuses it otherwise).
    """
    result = scaler.step(optimizer) if closure is None else scaler.step(optimizer, closure)
    scaler.update()
    return result


def step_optimizer(
    optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None, scaler: Any
) -> Any:
    """The step itself, as the ``optimizer_step`` fallback and the TPU plugin take it:
    :func:`scaled_step` with a ``scaler``, else ``optimizer.step(closure)`` (without the
    argument when there is no closure: an optimizer's ``step`` need not take one)."""
    if scaler is not None:
        return scaled_step(optimizer, scaler, closure)
    return optimizer.step() if closure is None else optimizer.step(closure)


def checked_scaler(scaler: object, what: str) -> None:
    """Refuse an object that is not a loss scaler (``torch.amp.GradScaler``'s methods).

    :param what: who was handed it, for the message (``"optimizer_step(scaler=...)"``).
    :raises TypeError: ``scaler`` lacks one of the methods.
    """
    missing = _missing_scaler_methods(scaler)
    if missing:
        raise AcceleratorTypeError(
            f"{what} expects a torch.amp.GradScaler (from acc.grad_scaler()) or None, got "
            f"{type(scaler).__name__}, which has no {', '.join(missing)}"
        )


def scaler_problem(scaler: object) -> str | None:
    """What is wrong with a ``grad_scaler`` hook's answer, or ``None``."""
    missing = _missing_scaler_methods(scaler)
    if missing:
        return f"returned {type(scaler).__name__}, not a GradScaler (no {', '.join(missing)})"
    return None


def _missing_scaler_methods(scaler: object) -> list[str]:
    return [name for name in _SCALER_METHODS if not callable(getattr(scaler, name, None))]


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (through any number of compilations), or
    ``model`` itself when it is not a compiled module."""
    # Only torch._dynamo makes compiled modules: without it imported there is none, and
    # importing it here would cost every checkpoint a second.
    if "torch._dynamo" in sys.modules:
        from torch._dynamo.eval_frame import OptimizedModule

        while isinstance(model, OptimizedModule):
            model = model._orig_mod
    return model


def retarget_optimizers(
    optimizers: Iterable[torch.optim.Optimizer],
    before: Mapping[str, torch.nn.Parameter],
    model: nn.Module,
    device: torch.device | None = None,
) -> None:
    """Point ``optimizers``, built on ``before``'s parameters, at ``model``'s now.

    Each parameter is matched by the name it had in ``before``; a tied parameter
    (several names, one object) maps to the one object those names hold now. Param
    groups change in place and per-parameter state moves with its parameter, except a
    non-capturable, non-fused ``step`` counter, which torch keeps on the host.
    Parameters that were not in ``before`` are left alone; nothing changes if any
    optimizer cannot be planned.

    :param before: ``dict(model.named_parameters(remove_duplicate=False))`` taken
        before the move.
    :param device: where per-parameter state goes; ``None``: its parameter's device.
    """
    now = dict(model.named_parameters(remove_duplicate=False))
    moved = {
        id(parameter): now[name]
        for name, parameter in before.items()
        if name in now and now[name] is not parameter
    }
    follow_moved_parameters(list(optimizers), moved, device)


# -- the handle's argument checks, each a clear TypeError/ValueError naming the call ----

# Optimizer classes already checked: one set lookup per optimizer_step, not an isinstance.
_OPTIMIZER_CLASSES: set[type] = set()


def checked_step_arguments(optimizer: object, closure: object, scaler: object) -> None:
    """Refuse what :meth:`accel.Accelerator.optimizer_step` cannot step.

    :raises TypeError: ``optimizer`` is not a ``torch.optim.Optimizer``, ``closure`` is
        neither ``None`` nor callable, or ``scaler`` is no scaler.
    :raises ValueError: both ``closure`` and an enabled ``scaler``.
    """
    if type(optimizer) not in _OPTIMIZER_CLASSES:
        if not isinstance(optimizer, torch.optim.Optimizer):
            hint = (
                " (a learning-rate scheduler: pass the optimizer it schedules)"
                if hasattr(optimizer, "get_last_lr")
                else ""
            )
            raise AcceleratorTypeError(
                f"optimizer_step expects a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}{hint}"
            )
        _OPTIMIZER_CLASSES.add(type(optimizer))
    if closure is not None and not callable(closure):
        raise AcceleratorTypeError(
            f"optimizer_step(closure=...) expects a callable that re-evaluates the "
            f"model and returns the loss, or None; got {type(closure).__name__}"
        )
    if scaler is None:
        return
    checked_scaler(scaler, "optimizer_step(scaler=...)")
    if closure is not None and getattr(scaler, "is_enabled", lambda: True)():
        raise AcceleratorValueError(
            "optimizer_step: a closure cannot be combined with an enabled GradScaler "
            "(torch's scaler.step() does not support closures); step without the "
            "closure, or pass scaler=None"
        )


def checked_no_sync_arguments(model: object, enabled: object) -> None:
    """:raises TypeError: ``model`` is not a module, or ``enabled`` not a bool."""
    if not isinstance(model, nn.Module):
        raise AcceleratorTypeError(
            f"no_sync expects the model being trained (a torch.nn.Module, e.g. the "
            f"DistributedDataParallel wrapper), got {type(model).__name__}"
        )
    if not isinstance(enabled, bool):
        raise AcceleratorTypeError(
            f"no_sync(enabled=...) expects a bool, got {type(enabled).__name__}"
        )


def checked_seed(seed: object) -> None:
    """:raises TypeError: not an int. :raises ValueError: outside torch's range."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise AcceleratorTypeError(f"manual_seed expects an int seed, got {type(seed).__name__}")
    if not -(2**63) <= seed < 2**64:
        raise AcceleratorValueError(
            f"manual_seed: seed {seed} is outside torch's range [-2**63, 2**64); "
            f"reduce it, e.g. seed % 2**63"
        )


def checked_loader(loader: object) -> None:
    """:raises TypeError: ``loader`` is not an iterable of batches."""
    if not isinstance(loader, Iterable) or isinstance(loader, (str, bytes)):
        raise AcceleratorTypeError(
            f"device_loader expects an iterable of batches (a DataLoader), got "
            f"{type(loader).__name__}"
        )


def checked_device_index(index: object) -> None:
    """:raises ValueError: ``index`` is not a device index (an int >= 0)."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise AcceleratorValueError(
            f"for_index expects a device index (an int >= 0), got {index!r}"
        )
