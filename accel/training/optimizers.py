"""Optimizers that follow their model across a move someone else made.

:meth:`accel.Accelerator.model_to_device` re-points optimizers itself when given
them (``optimizer=``). Code that moves a model before it has the optimizers in hand
(Lightning's Fabric moves the module, then hands over the optimizers built on it)
records the parameters before the move and re-points the optimizers afterwards::

    before = dict(model.named_parameters(remove_duplicate=False))
    model = acc.model_to_device(model)
    ...
    accel.training.optimizers.retarget_optimizers([optimizer], before, model)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["retarget_optimizers"]


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
    from accel._core.optimizers import retarget_moved

    now = dict(model.named_parameters(remove_duplicate=False))
    moved = {
        id(parameter): now[name]
        for name, parameter in before.items()
        if name in now and now[name] is not parameter
    }
    retarget_moved(list(optimizers), moved, device)
