"""Materializing a model built on ``meta``: :meth:`accel.Accelerator.materialize`.

torch's way, ``model.to_empty(device=...)``, gives every slot of a plain ``meta``
tensor a Parameter of its own (``Module._apply``), so a tied embedding and head
become two weights. Here the allocation is one transaction with the same capture,
tie keeping, check and undo as a move (:class:`~accel.tying._capture.RestorePoint`,
:class:`~accel.tying._keeping.Keeper`), then the model is filled:

1. every ``meta`` tensor allocated on the device (tensors already off ``meta`` are
   moved with their values), each tie group one Parameter again;
2. filled: ``load`` (a state dict, an ``acc.save`` file or a ``save_sharded``
   directory) copied in place, or ``init(model)``, or each module's
   ``reset_parameters()``;
3. checked: every tensor that was on ``meta`` was written (its version counter moved
   or its slot got a new tensor), none is left on ``meta``, the ties are those of
   before. Anything else is a typed error naming the tensors, the model as it was.

A sharded tensor (a DTensor, from ``parallelize_tied`` or ``fully_shard_tied``) keeps
its object through the allocation. The default init draws each module's tensors at
their full size, one module at a time, and keeps this rank's shard, so every shard
gets values of its own equal to a one-process build (torch's DTensor random ops
repeat the draws on every rank of a CPU mesh).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from accel.errors import AcceleratorTypeError, AcceleratorValueError
from accel.training._filling import fill_from, listed, reset_every_module
from accel.tying._capture import RestorePoint, SlotContents, qualified_name, transact
from accel.tying._keeping import Keeper
from accel.types import MoveContext, TieCheck

__all__ = ["Init", "Source", "materialize_model", "meta_tensor_names", "refuse_meta"]

_Model = TypeVar("_Model", bound=nn.Module)


#: What ``init=`` takes: a function that writes the model's tensors.
Init = Callable[[nn.Module], object]
#: What ``load=`` takes: a state dict, or the path of a checkpoint.
Source = Mapping[str, Any] | str | os.PathLike[str]


def materialize_model(
    model: _Model,
    device: torch.device,
    accelerator: str,
    tie_check: TieCheck,
    init: Init | None,
    load: Source | None,
) -> _Model:
    """:meth:`accel.Accelerator.materialize`: the steps of the module docstring."""
    _check_arguments(model, init, load)
    on_meta = meta_tensor_names(model)
    if not on_meta:
        raise AcceleratorValueError(
            f"materialize: {type(model).__name__} holds no tensor on meta, so there is "
            f"nothing to materialize; move it with model_to_device instead"
        )
    context = MoveContext(accelerator, device, tie_check)
    return transact(
        model,
        functools.partial(_materialize, model, context, init, load),
        functools.partial(_restored_note, device),
    )


def _materialize(
    model: _Model,
    context: MoveContext,
    init: Init | None,
    load: Source | None,
    capture: RestorePoint,
) -> _Model:
    """The steps of the module docstring, inside the transaction whose one capture is
    ``capture``."""
    before, device = capture.slots(), context.device
    # Read now: a DTensor keeps its object through the allocation, its device changed.
    empty_slots = _slots_on_meta(before)
    fresh: dict[str, torch.Tensor] = {}  # what was on meta, once allocated and re-tied
    versions: dict[int, int] = {}  # their counters before the fill

    def allocate() -> tuple[nn.Module, str]:  # 1.
        model._apply(lambda tensor: _allocated(tensor, device))  # type: ignore[no-untyped-call]
        capture.mark_moved()
        return model, ""

    def fill(model: nn.Module) -> None:  # 2., on the model re-tied
        fresh.update(_fresh_tensors(before, empty_slots))
        versions.update((id(tensor), _version(tensor)) for tensor in fresh.values())
        if load is not None:
            fill_from(model, load, device)
        elif init is not None:
            init(model)
        else:
            reset_every_module(model, set(versions))

    # Each shared tensor allocated once, where torch's own _apply does the work.
    hollow = all(type(module)._apply is _MODULE_APPLY for module, *_ in before.modules())
    filled_by = _what_filled(init, load)
    Keeper(before, context, fill, filled_by).keep(model, allocate, hollow=hollow)
    _check_written(model, fresh, versions, filled_by=filled_by)  # 3.
    return model


_MODULE_APPLY = nn.Module._apply


def meta_tensor_names(model: nn.Module) -> list[str]:
    """The qualified names of the parameters and buffers of ``model`` on ``meta``."""
    return [
        name
        for name, tensor in (*model.named_parameters(), *model.named_buffers())
        if _on_meta(tensor)
    ]


def refuse_meta(model: nn.Module, device: torch.device) -> None:
    """:raises AcceleratorValueError: ``model``, moved to ``device`` (not ``meta``),
    holds ``meta`` tensors: torch cannot copy what has no values, and its advice,
    ``to_empty``, unties the model."""
    names = meta_tensor_names(model)
    if names:
        raise AcceleratorValueError(
            f"model_to_device: {type(model).__name__} holds {len(names)} tensor"
            f"{'s' if len(names) != 1 else ''} on meta ({listed(names)}), which have no "
            f"values to move to {device}. Materialize it instead: "
            f"acc.materialize(model, init=...) allocates it on the device with its ties "
            f"kept and initializes it (or load= fills it from a checkpoint); torch's "
            f"to_empty() would untie it"
        )


def _on_meta(tensor: torch.Tensor) -> bool:
    # The device, not ``is_meta``: a DTensor on meta says False there.
    return tensor.device.type == "meta"


def _check_arguments(model: object, init: object, load: object) -> None:
    if not isinstance(model, nn.Module):
        raise AcceleratorTypeError(
            f"materialize expects a torch.nn.Module, got {type(model).__name__}"
        )
    if init is not None and load is not None:
        raise AcceleratorTypeError(
            "materialize: init= and load= were both given; load fills every tensor from "
            "the checkpoint, so nothing is left to initialize: pass one of them"
        )
    if init is not None and not callable(init):
        raise AcceleratorTypeError(
            f"materialize: init= must be a callable taking the model, got {type(init).__name__}"
        )
    if load is not None and not isinstance(load, Mapping | str | os.PathLike):
        raise AcceleratorTypeError(
            f"materialize: load= must be a state dict or the path of a checkpoint "
            f"(acc.save's file or save_sharded's directory), got {type(load).__name__}"
        )


def _allocated(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Uninitialized memory on ``device`` for a ``meta`` tensor; any other tensor moved
    there with its values."""
    if _on_meta(tensor):
        return torch.empty_like(tensor, device=device)
    return tensor.to(device)


def _slots_on_meta(before: SlotContents) -> set[tuple[int, str]]:
    """``(id(registry), attribute)`` of every slot of ``before`` holding a ``meta`` tensor."""
    return {
        (id(registry), name)
        for _, _, parameters, buffers, _ in before.modules()
        for registry in (parameters, buffers)
        for name, tensor in registry.items()
        if tensor is not None and _on_meta(tensor)
    }


def _fresh_tensors(
    before: SlotContents, empty_slots: set[tuple[int, str]]
) -> dict[str, torch.Tensor]:
    """First qualified name -> tensor now, for every tensor that was on ``meta``."""
    fresh: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for module, path, parameters, buffers, _ in before.modules():
        for registry, live in ((parameters, module._parameters), (buffers, module._buffers)):
            for name in registry:
                now = live.get(name)
                if (id(registry), name) in empty_slots and now is not None and id(now) not in seen:
                    seen.add(id(now))
                    fresh[qualified_name(path, name)] = now
    return fresh


def _check_written(
    model: nn.Module,
    fresh: dict[str, torch.Tensor],
    versions: dict[int, int],
    *,
    filled_by: str,
) -> None:
    """:raises AcceleratorValueError: a tensor that was on ``meta`` is still there, or
    still holds the memory the allocation gave it, never written."""
    slots = dict((*model.named_parameters(), *model.named_buffers()))
    still_meta = [name for name, tensor in slots.items() if _on_meta(tensor)]
    if still_meta:
        raise AcceleratorValueError(
            f"materialize: {listed(still_meta)} {'are' if len(still_meta) > 1 else 'is'} "
            f"still on meta after {filled_by}; it must allocate every tensor it replaces "
            f"on the model's device"
        )
    unwritten = [
        name
        for name, tensor in fresh.items()
        if slots.get(name) is tensor and _version(tensor) == versions[id(tensor)]
    ]
    if unwritten:
        raise AcceleratorValueError(
            f"materialize: {filled_by} wrote no values into {listed(unwritten)}, which "
            f"would train on uninitialized memory. Pass an init= that sets "
            f"{'them' if len(unwritten) > 1 else 'it'} (a buffer computed in __init__, such "
            f"as a rotary cache, is computed again there), give the module a "
            f"reset_parameters(), or build {'them' if len(unwritten) > 1 else 'it'} off "
            f"meta so the value is kept"
        )


def _version(tensor: torch.Tensor) -> int:
    """A count that any write into ``tensor`` moves: a DTensor's own counter and its
    local shard's, as DCP writes into the shard alone."""
    local = getattr(tensor, "_local_tensor", None)
    return int(tensor._version) + (int(local._version) if local is not None else 0)


def _what_filled(init: object, load: object) -> str:
    if load is not None:
        return "load="
    if init is not None:
        return f"init= ({getattr(init, '__qualname__', type(init).__name__)})"
    return "the modules' reset_parameters()"


def _restored_note(device: torch.device, unrestored: list[str]) -> str:
    kept = f"; these kept the values written since: {listed(unrestored)}" if unrestored else ""
    return (
        f"accel: materializing the model on {device} failed; the model was restored as it "
        f"was before (its tensors on meta, its ties as they were){kept}."
    )
