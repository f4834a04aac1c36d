"""One transfer for a restore: the tensors of a checkpoint that ``load_state_dict``
would copy to the device, copied there together first.

``load_state_dict`` copies a module's state one tensor at a time, and an optimizer
moves each state tensor to its parameter's device with ``.to()``. On XLA every one of
those is a synchronous upload of its own: GPT-2 small plus AdamW makes 445 of them,
most of a restore's time. torch_xla can upload a list of tensors in one call instead
(``_xla_tensors_from_aten`` under ``xm.send_cpu_data_to_device``), and a parameter
``copy_``-ed from an XLA tensor takes that tensor's buffer without another copy. The
``restore_to_device`` hook is that call; this module picks the tensors for it and
puts the device tensors where ``load_state_dict`` will look for them.

Only what ``load_state_dict`` would copy to ``device`` unchanged is picked: a module's
tensor of the same dtype and shape as the one it replaces, an optimizer's state of
its parameter's dtype (torch's own rule for the cast), never an optimizer's ``step``
(torch keeps it on the CPU unless the optimizer is fused or capturable), and only for
optimizers that load the way ``torch.optim.Optimizer`` does. Everything else is left
to ``load_state_dict`` as before.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = ["copies_host_tensors_in_place", "moved_for_restore", "restored_tensors_problem"]

_K = TypeVar("_K")

#: Moves a list of host tensors to the device together; ``None``: it does not.
Move = Callable[[list[Any]], list[Any] | None]


def moved_for_restore(
    targets: Mapping[_K, Any], entries: Mapping[_K, Any], device: torch.device, move: Move
) -> dict[_K, Any]:
    """``entries`` (the stored state of each target, by the same keys) with every
    tensor that ``load_state_dict`` would copy to ``device`` unchanged replaced by its
    copy on the device, made by one call of ``move``.

    ``targets`` are the modules (already unwrapped) and optimizers the entries will
    be loaded into; entries are shallow copies where something was replaced (a state
    dict keeps its ``_metadata``), the stored objects are left as they were. A tensor
    stored under several names (a tied weight) is moved once.
    """
    picked: dict[int, Any] = {}  # id -> host tensor, in the order met
    plans: dict[_K, Any] = {}
    for key, target in targets.items():
        plans[key] = _plan(target, entries[key], device, picked)
    if not picked:
        return dict(entries)
    moved = move(list(picked.values()))
    if moved is None:
        return dict(entries)
    by_id = dict(zip(picked, moved, strict=True))
    result = dict(entries)
    for key, plan in plans.items():
        if plan is not None:
            result[key] = plan(by_id)
    return result


# Device -> whether it copies a host tensor into one of its own in place; asked once.
_IN_PLACE_FROM_HOST: dict[torch.device, bool] = {}


def copies_host_tensors_in_place(device: torch.device) -> bool:
    """Whether ``device`` takes ``device_tensor.copy_(host_tensor)``, as
    ``load_state_dict`` does for every parameter; tried once per device on a
    one-element tensor.

    Some out-of-tree backends refuse it (``nntile``) while they move host tensors with
    ``.to()``; accel's ``restore_to_device`` fallback then moves them first. A device
    the try cannot even reach (its ``.to()`` fails too) counts as taking it: the
    load goes on as it would have, and fails there with the device's own error.
    """
    if device.type in ("cpu", "meta"):
        return True
    known = _IN_PLACE_FROM_HOST.get(device)
    if known is None:
        try:
            on_device = torch.zeros(1).to(device)
        except Exception:
            known = True
        else:
            try:
                on_device.copy_(torch.ones(1))
                known = True
            except Exception:  # its kind of refusal is the backend's own
                known = False
        _IN_PLACE_FROM_HOST[device] = known
    return known


def restored_tensors_problem(tensors: list[Any], moved: Any, *, device: torch.device) -> str | None:
    """What is wrong with ``moved`` as the device copies of ``tensors``, or ``None``
    (``moved`` is ``None``: no plugin uploads them, ``load_state_dict`` will)."""
    if moved is None:
        return None
    if not isinstance(moved, (list, tuple)) or len(moved) != len(tensors):
        got = f"{len(moved)} values" if isinstance(moved, (list, tuple)) else type(moved).__name__
        return f"returned {got} for {len(tensors)} tensors; expected a list of the device copies"
    for index, (tensor, copied) in enumerate(zip(tensors, moved, strict=True)):
        if not isinstance(copied, torch.Tensor):
            return f"returned a {type(copied).__name__} at index {index}; expected a tensor"
        if copied.device != device or copied.shape != tensor.shape or copied.dtype != tensor.dtype:
            return (
                f"returned at index {index} a {copied.dtype} tensor of shape "
                f"{tuple(copied.shape)} on {copied.device} for a {tensor.dtype} tensor of "
                f"shape {tuple(tensor.shape)} to be copied to {device}"
            )
    return None


def _plan(
    target: Any, stored: Any, device: torch.device, picked: dict[int, Any]
) -> Callable[[dict[int, Any]], Any] | None:
    """Pick ``stored``'s device-bound tensors into ``picked``; return how to rebuild
    ``stored`` around their device copies (``None``: nothing picked)."""
    if isinstance(target, nn.Module) and isinstance(stored, Mapping):
        current = target.state_dict()
        names = [
            name
            for name, value in stored.items()
            if _fits(value, current.get(name), device, same_shape=True)
        ]
        for name in names:
            picked.setdefault(id(stored[name]), stored[name])
        if not names:
            return None

        def module_entry(by_id: dict[int, Any]) -> Any:
            rebuilt: Any = copy.copy(stored)  # the same mapping type, _metadata kept
            for name in names:
                rebuilt[name] = by_id[id(stored[name])]
            return rebuilt

        return module_entry
    if isinstance(target, torch.optim.Optimizer) and _loads_as_torch_does(target):
        parameters = {
            saved_id: parameter
            for saved, group in zip(stored["param_groups"], target.param_groups, strict=True)
            for saved_id, parameter in zip(saved["params"], group["params"], strict=True)
        }
        chosen: list[tuple[Any, str]] = []
        for saved_id, entries in stored["state"].items():
            parameter = parameters.get(saved_id)
            if parameter is None or not isinstance(entries, Mapping):
                continue
            for name, value in entries.items():
                if name != "step" and _fits(value, parameter, device, same_shape=False):
                    chosen.append((saved_id, name))
                    picked.setdefault(id(value), value)
        if not chosen:
            return None

        def optimizer_entry(by_id: dict[int, Any]) -> Any:
            state = {saved_id: dict(entries) for saved_id, entries in stored["state"].items()}
            for saved_id, name in chosen:
                state[saved_id][name] = by_id[id(stored["state"][saved_id][name])]
            return {**stored, "state": state}

        return optimizer_entry
    return None


def _fits(value: Any, destination: Any, device: torch.device, *, same_shape: bool) -> bool:
    """Whether ``load_state_dict`` would copy host tensor ``value`` to ``device`` as it
    is, into (or beside) ``destination``."""
    if not (isinstance(value, torch.Tensor) and isinstance(destination, torch.Tensor)):
        return False
    if value.device.type != "cpu" or destination.device != device:
        return False
    if same_shape and value.shape != destination.shape:
        return False
    # An optimizer casts floating-point state to its parameter's dtype, and moves the
    # rest as it is (torch.optim.Optimizer._process_value_according_to_param_policy).
    if not same_shape and not destination.is_floating_point():
        return True
    return value.dtype == destination.dtype


def _loads_as_torch_does(optimizer: Any) -> bool:
    kind = type(optimizer)
    base = torch.optim.Optimizer
    return kind.load_state_dict is base.load_state_dict and (
        kind._process_value_according_to_param_policy
        is base._process_value_according_to_param_policy
    )
