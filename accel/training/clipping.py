"""Gradient clipping by total norm, the same on one device, on XLA and under FSDP2.

``torch.nn.utils.clip_grad_norm_`` on FSDP2's sharded gradients (``DTensor``) returns
a ``DTensor`` norm; here the norm is reduced to a plain tensor first, as torchtitan
does, so a loop can log it and compare it on every rank. The norm stays a tensor:
nothing waits for the device (on XLA a ``.item()`` would cut the graph).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["checked_clip_arguments", "clip_grad_norm"]


def clip_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so their total norm is at most
    ``max_norm``; return the total norm before clipping, as a tensor.

    Equal to ``torch.nn.utils.clip_grad_norm_`` on one device; with sharded
    (``DTensor``) gradients the norm is the full one, a plain tensor.
    """
    import torch

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
    import torch

    if isinstance(parameters, torch.Tensor):
        params = [parameters]
    elif isinstance(parameters, Iterable) and not isinstance(parameters, (str, bytes)):
        params = list(parameters)
        strays = sorted({type(p).__name__ for p in params if not isinstance(p, torch.Tensor)})
        if strays:
            raise TypeError(
                f"clip_grad_norm_ expects parameters (model.parameters(), or a list of "
                f"tensors); got an iterable containing {', '.join(strays)}"
            )
    else:
        raise TypeError(
            f"clip_grad_norm_ expects parameters (model.parameters(), or a list of "
            f"tensors), got {type(parameters).__name__}"
        )
    maximum = _number("max_norm", max_norm)
    if not maximum >= 0:  # also NaN
        raise ValueError(
            f"clip_grad_norm_(max_norm={max_norm!r}): the largest total norm allowed must "
            f"be >= 0 (torch would scale every gradient by a negative or NaN factor); "
            f"pass e.g. max_norm=1.0, or math.inf to measure the norm without clipping"
        )
    norm = _number("norm_type", norm_type)
    if not norm > 0:
        raise ValueError(
            f"clip_grad_norm_(norm_type={norm_type!r}): the p of the p-norm must be > 0; "
            f"pass 2.0 (the default), 1.0, or math.inf for the largest magnitude"
        )
    return params, maximum, norm


def _number(what: str, value: object) -> float:
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf  # torch accepts norm_type="inf" too
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"clip_grad_norm_({what}=...) expects a number, got {type(value).__name__} ({value!r})"
        )
    return float(value)
