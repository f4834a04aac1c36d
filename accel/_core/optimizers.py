"""Making optimizers follow their model's parameters across a move."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from accel._core.transaction import RestorePoint

__all__ = ["retarget_moved", "retarget_optimizers"]


def retarget_optimizers(
    optimizers: Iterable[torch.optim.Optimizer],
    restore_point: RestorePoint,
    device: torch.device,
) -> None:
    """Point each optimizer's param groups and state at the moved parameters.

    Per-parameter state tensors move to ``device``, except a non-capturable,
    non-fused ``step`` counter, which torch keeps on the host (as
    ``Optimizer.load_state_dict`` does). Everything is computed before anything is
    changed, so a failure leaves every optimizer as it was. Parameters that are
    not part of the model are left alone.
    """
    retarget_moved(optimizers, restore_point.moved_parameters(), device)


def retarget_moved(
    optimizers: Iterable[torch.optim.Optimizer],
    moved: dict[int, Any],
    device: torch.device | None,
) -> None:
    """:func:`retarget_optimizers` from ``moved`` (``id(parameter before)`` to the
    parameter after); ``device=None`` moves state to each new parameter's device."""
    plans = [_plan(optimizer, moved, device) for optimizer in optimizers]
    for optimizer, group_params, state in plans:
        for group, params in zip(optimizer.param_groups, group_params, strict=True):
            # In place: some optimizers (LBFGS) keep a reference to this very list.
            group["params"][:] = params
        optimizer.state.clear()
        optimizer.state.update(state)


def _plan(
    optimizer: torch.optim.Optimizer, moved: dict[int, Any], device: torch.device | None
) -> tuple[torch.optim.Optimizer, list[list[Any]], dict[Any, Any]]:
    import torch

    group_params = [
        [moved.get(id(p), p) for p in group["params"]] for group in optimizer.param_groups
    ]
    keep_step_on_host = {
        id(p): not (group.get("capturable") or group.get("fused"))
        for group in optimizer.param_groups
        for p in group["params"]
    }
    state: dict[Any, Any] = {}
    for parameter, values in optimizer.state.items():
        target = moved.get(id(parameter))
        if target is None:
            state[parameter] = values
            continue
        state[target] = {
            key: (
                value.to(target.device if device is None else device)
                if isinstance(value, torch.Tensor)
                and not (key == "step" and keep_step_on_host.get(id(parameter), True))
                else value
            )
            for key, value in values.items()
        }
    return optimizer, group_params, state
