"""Reducing gradients across XLA replicas once per step, before clipping when a loop clips.

torch_xla's recipe reduces in the step (``xm.optimizer_step``); a loop that clips
before the step would clip each replica's own, unreduced gradients. So
``acc.clip_grad_norm_`` reduces the gradients it clips and records them here, and the
step reduces only the ones not recorded. A record is trusted only while its gradient
is the same tensor at the same version: a later ``backward()`` or ``zero_grad()``
changes it in place (bumping the version) or replaces it, and it is reduced again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["reduce_for_clipping", "reduce_for_step"]

# id(parameter) -> (its gradient as reduced and clipped, that gradient's version)
_REDUCED: dict[int, tuple[torch.Tensor, int]] = {}


def reduce_for_clipping(parameters: Iterable[torch.Tensor]) -> None:
    """All-reduce (mean) the gradients of ``parameters`` across replicas, once."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    world = xr.world_size()
    if world <= 1:
        return
    grads = [p.grad for p in parameters if p.grad is not None and not _was_reduced(p)]
    if grads:
        xm.all_reduce(xm.REDUCE_SUM, grads, scale=1.0 / world)


def note_reduced(parameters: Iterable[torch.Tensor]) -> None:
    """Record the gradients of ``parameters`` as reduced, as they are now (clipped)."""
    import torch_xla.runtime as xr

    if xr.world_size() <= 1:
        return
    for param in parameters:
        if param.grad is not None:
            _REDUCED[id(param)] = (param.grad, param.grad._version)


def reduce_for_step(optimizer: torch.optim.Optimizer) -> None:
    """Reduce the optimizer's gradients across replicas, except those clipping reduced."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if not _REDUCED:
        xm.reduce_gradients(optimizer)  # torch_xla's own: only with several replicas
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None and not _was_reduced(p)]
    for param in params:
        _REDUCED.pop(id(param), None)
    world = xr.world_size()
    if grads and world > 1:
        xm.all_reduce(xm.REDUCE_SUM, grads, scale=1.0 / world)


def _was_reduced(param: torch.Tensor) -> bool:
    record = _REDUCED.get(id(param))
    return record is not None and record[0] is param.grad and record[1] == param.grad._version
