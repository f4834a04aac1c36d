"""float16 loss scaling: when a loop needs a ``GradScaler``, and the step through one.

float16 has 5 exponent bits: small gradients underflow to zero unless the loss is
scaled up before ``backward()`` and the gradients scaled back before the step.
bfloat16 keeps float32's exponent range and needs no scaling, nor does float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["checked_scaler", "scaled_step"]

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


def checked_scaler(scaler: object, what: str) -> None:
    """Refuse an object that is not a loss scaler (``torch.amp.GradScaler``'s methods).

    :param what: who was handed it, for the message (``"optimizer_step(scaler=...)"``).
    :raises TypeError: ``scaler`` lacks one of the methods.
    """
    missing = [name for name in _SCALER_METHODS if not callable(getattr(scaler, name, None))]
    if missing:
        raise TypeError(
            f"{what} expects a torch.amp.GradScaler (from acc.grad_scaler()) or None, got "
            f"{type(scaler).__name__}, which has no {', '.join(missing)}"
        )
