"""accel inside Hugging Face Accelerate: ``prepare`` with ties kept on TPU.

On XLA, ``Accelerator().prepare(model, optimizer)`` moves the model with
``model.to(device)``, which gives every slot of a tied weight its own copy, and then
re-points the optimizer by parameter *name*. A tied weight is listed under its first
name only, so the output layer's copy (``head.weight`` in a GPT-2-style model) is in
no optimizer and silently never trains. Moving the model with accel first keeps the
tie and the optimizer whole; ``prepare`` then finds everything in place::

    from accelerate import Accelerator
    from accel.integrations.accelerate import prepare

    model, optimizer = prepare(Accelerator(), model, optimizer)

This module imports neither torch_xla nor Accelerate itself; it needs only the
``accelerator`` object you already have (``pip install 'accelerate>=1.0'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

import accel
from accel.errors import AcceleratorValueError

if TYPE_CHECKING:
    from accelerate import Accelerator as AccelerateAccelerator

__all__ = ["move_for_prepare", "prepare"]


def prepare(
    accelerator: AccelerateAccelerator,
    *args: Any,
    device_placement: Sequence[bool] | None = None,
    registry: accel.AcceleratorRegistry | None = None,
) -> Any:
    """``accelerator.prepare(*args)``, with the models moved by accel first on XLA.

    Returns exactly what Accelerate's ``prepare`` returns. Off XLA nothing changes:
    CPU and GPU moves keep ties by themselves.

    :param device_placement: as in Accelerate: per argument, whether to move it
        (default: the Accelerate accelerator's ``device_placement``).
    :param registry: the accel registry to take the ``tpu`` accelerator from.
    :raises accel.WeightTyingError: a tie came apart in the move (the model is
        restored as it was).
    """
    moved = move_for_prepare(
        accelerator, *args, device_placement=device_placement, registry=registry
    )
    placement = None if device_placement is None else list(device_placement)
    return accelerator.prepare(*moved, device_placement=placement)


def move_for_prepare(
    accelerator: AccelerateAccelerator,
    *args: Any,
    device_placement: Sequence[bool] | None = None,
    registry: accel.AcceleratorRegistry | None = None,
) -> list[Any]:
    """Move the models among ``args`` to ``accelerator.device`` with accel, when that
    device is XLA, re-pointing every optimizer among ``args``; return ``args``.

    For code that calls ``accelerator.prepare`` itself (a Trainer subclass, say):
    ``accelerator.prepare(*move_for_prepare(accelerator, model, optimizer))``.
    """
    if device_placement is not None and len(device_placement) != len(args):
        raise AcceleratorValueError(
            f"device_placement has {len(device_placement)} entries for {len(args)} "
            f"objects to prepare; give one per object, or None to use the accelerator's "
            f"device_placement ({accelerator.device_placement})"
        )
    device = torch.device(accelerator.device)
    if device.type != "xla":
        return list(args)
    placements = (
        [bool(accelerator.device_placement)] * len(args)
        if device_placement is None
        else [bool(place) for place in device_placement]
    )
    handle = accel.get_accelerator("tpu") if registry is None else registry.get_accelerator("tpu")
    if handle.device != device:
        handle = handle.for_index(device.index or 0)
    optimizers = [arg for arg in args if isinstance(arg, torch.optim.Optimizer)]
    return [
        handle.model_to_device(arg, optimizer=optimizers)
        if place and isinstance(arg, torch.nn.Module)
        else arg
        for arg, place in zip(args, placements, strict=True)
    ]
