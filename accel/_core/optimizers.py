"""Making optimizers follow their model's parameters across a move."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.errors import AcceleratorValueError

if TYPE_CHECKING:
    import torch

__all__ = ["check_optimizers_hold"]

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
