"""Optimizers that follow a move: the ones passed to ``model_to_device``, checked by
:func:`check_optimizers_hold`, then pointed at the moved parameters by
:func:`follow_moved_parameters` (which ``accel.training.step.retarget_optimizers`` runs
for a move someone else made)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__: list[str] = []


def follow_moved_parameters(
    optimizers: Iterable[torch.optim.Optimizer],
    moved: dict[int, Any],
    device: torch.device | None,
) -> None:
    """Point each optimizer's param groups and state at the moved parameters.

    ``moved`` maps ``id(parameter before)`` to the parameter after. Per-parameter state
    tensors move to ``device`` (``None``: each new parameter's device), except a
    non-capturable, non-fused ``step`` counter, which torch keeps on the host (as
    ``Optimizer.load_state_dict`` does). Everything is computed before anything is
    changed, so a failure leaves every optimizer as it was. Parameters not in ``moved``
    are left alone.
    """
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


def as_optimizer_list(
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
) -> list[torch.optim.Optimizer]:
    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    expected = "optimizer= must be a torch.optim.Optimizer, an iterable of them, or None"
    if isinstance(optimizer, (torch.nn.Module, str, bytes)) or not isinstance(optimizer, Iterable):
        raise AcceleratorTypeError(f"{expected}; got {type(optimizer).__name__}")
    optimizers = list(optimizer)
    for item in optimizers:
        if not isinstance(item, torch.optim.Optimizer):
            raise AcceleratorTypeError(
                f"{expected}; got an iterable containing {type(item).__name__}"
            )
    return optimizers


# Shapes shown when an optimizer holds none of the model's parameters.
_SHAPES_SHOWN = 3


def check_optimizers_hold(
    optimizers: list[torch.optim.Optimizer], model: nn.Module, parameter_ids: set[int]
) -> None:
    """Refuse ``optimizers`` (at least one) if none holds any of the model's parameters.

    Such an optimizer was usually built before an earlier move replaced the
    parameters: retargeting it would change nothing, and the model would never train.
    Among several optimizers, those holding none are fine as long as one holds some:
    a caller may pass every optimizer with every model (accelerate's ``prepare(model_a,
    model_b, opt_a, opt_b)`` does), and an optimizer holding other parameters besides
    the model's is fine too.
    """
    held = [[p for group in opt.param_groups for p in group["params"]] for opt in optimizers]
    if any(id(p) in parameter_ids for params in held for p in params):
        return
    described = [
        f"{_which(position, optimizer, len(optimizers))} holds {_holding(params)}"
        for position, (optimizer, params) in enumerate(zip(optimizers, held, strict=True))
    ]
    raise AcceleratorValueError(
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
