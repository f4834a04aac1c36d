"""Making optimizers follow their model's parameters across a move."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from accel._core.transaction import RestorePoint

__all__ = ["check_optimizers_hold", "retarget_moved", "retarget_optimizers"]

# Shapes shown when an optimizer holds none of the model's parameters.
_SHAPES_SHOWN = 3


def check_optimizers_hold(
    optimizers: list[torch.optim.Optimizer], model: torch.nn.Module, parameter_ids: set[int]
) -> None:
    """Refuse optimizers of which none holds any of the model's parameters.

    Such an optimizer was usually built before an earlier move replaced the
    parameters: retargeting it would change nothing, and the model would never train.
    Among several optimizers, those holding none are fine as long as one holds some:
    a caller may pass every optimizer with every model (accelerate's ``prepare(model_a,
    model_b, opt_a, opt_b)`` does), and an optimizer holding other parameters besides
    the model's is fine too.
    """
    if not optimizers:
        return
    held = [[p for group in opt.param_groups for p in group["params"]] for opt in optimizers]
    if any(id(p) in parameter_ids for params in held for p in params):
        return
    described = [
        f"{_which(position, optimizer, len(optimizers))} holds {_holding(params)}"
        for position, (optimizer, params) in enumerate(zip(optimizers, held, strict=True))
    ]
    raise ValueError(
        f"optimizer= holds none of the parameters of the model being moved "
        f"({type(model).__name__}, {len(parameter_ids)} parameters): {'; '.join(described)}. "
        f"It was probably built on parameters that an earlier move replaced: build it on "
        f"model.parameters() after that move, or pass it to every move "
        f"(model_to_device(model, optimizer=...)) so it follows the parameters."
    )


def _which(position: int, optimizer: torch.optim.Optimizer, count: int) -> str:
    name = type(optimizer).__name__
    return f"the {name} optimizer" if count == 1 else f"optimizer {position} ({name})"


def _holding(params: list[torch.Tensor]) -> str:
    if not params:
        return "no parameters at all"
    shapes = ", ".join(str(tuple(p.shape)) for p in params[:_SHAPES_SHOWN])
    more = f" and {len(params) - _SHAPES_SHOWN} more" if len(params) > _SHAPES_SHOWN else ""
    devices = ", ".join(sorted({str(p.device) for p in params}))
    plural = "s" if len(params) != 1 else ""
    return f"{len(params)} parameter{plural} (shapes {shapes}{more}; on {devices})"


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
