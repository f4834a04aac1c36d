"""Whether a checkpoint fits the objects of ``acc.load(path, state)``, decided before
anything is restored: every key of ``state`` in the file, each module's keys and shapes,
each optimizer's parameter groups and parameter-shaped state. A load that does not fit
raises here, and leaves every object as it was."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import torch
from torch import nn

from accel.errors import AcceleratorKeyError, AcceleratorValueError
from accel.training.step import unwrap_compiled

__all__ = ["Fitted", "fitted"]


class Fitted(NamedTuple):
    """What a load restores, by the keys of ``state`` (``None`` for one object saved on
    its own)."""

    #: The objects ``load_state_dict`` is called on (a compiled model's plain model).
    targets: dict[Any, Any]
    #: The stored state of each, by the same keys.
    entries: dict[Any, Any]
    #: The stored entries restored into nothing, returned to the caller.
    remainder: dict[Any, Any]


def fitted(stored: Any, state: Any, path: str) -> Fitted:
    """The targets of ``state`` with ``load_state_dict`` and their stored entries, once
    everything is checked to fit.

    ``state`` may be one object with ``load_state_dict`` (what ``acc.save(model, path)``
    stored is the model's state dict): it gets all of ``stored``, and nothing remains.

    :raises KeyError: a key of ``state`` is not in the file (plain values too).
    :raises ValueError: the file holds no dict, or a module's keys or shapes differ, or
        an optimizer's parameter groups or state shapes.
    """
    if not isinstance(state, Mapping):  # one object, saved on its own
        _check_entry(None, state, stored, path)
        return Fitted({None: _target(state)}, {None: stored}, {})
    if not isinstance(stored, Mapping):
        raise AcceleratorValueError(
            f"load: {path!r} holds a {type(stored).__name__}, not a dict of entries, so "
            f"there is nothing to restore state into; call acc.load({path!r}) without state"
        )
    # Every key, plain values too: a resume that silently lacks its "step" starts over.
    missing = [key for key in state if key not in stored]
    if missing:
        raise AcceleratorKeyError(
            f"load: {path!r} has no entry {', '.join(map(repr, missing))} to restore; it "
            f"has {', '.join(map(repr, stored)) or 'no entries'}. Save the same keys you "
            f"load, or leave that key out of state"
        )
    targets = {key: value for key, value in state.items() if hasattr(value, "load_state_dict")}
    for key, target in targets.items():
        _check_entry(key, target, stored[key], path)
    return Fitted(
        {key: _target(target) for key, target in targets.items()},
        {key: stored[key] for key in targets},
        {key: value for key, value in stored.items() if key not in targets},
    )


def _target(value: Any) -> Any:
    # A compiled model's own state_dict() prefixes every key with "_orig_mod."; the
    # checkpoint (acc.state_dict) has the plain model's keys.
    return unwrap_compiled(value) if isinstance(value, nn.Module) else value


def _check_entry(key: str | None, target: Any, stored: Any, path: str) -> None:
    if isinstance(target, nn.Module):
        _check_module_state(key, _target(target), stored, path)
    elif isinstance(target, torch.optim.Optimizer):
        _check_optimizer_state(key, target, stored, path)


def _check_module_state(key: str | None, module: Any, stored: Any, path: str) -> None:
    entry, slot = _where(key, path), "state" if key is None else f"state[{key!r}]"
    if not isinstance(stored, Mapping):
        raise AcceleratorValueError(
            f"load: {entry} is a {type(stored).__name__}, not a state dict, so it cannot "
            f"be loaded into the {type(module).__name__} of {slot}"
        )
    current = module.state_dict()
    absent = [name for name in current if name not in stored]
    unexpected = [name for name in stored if name not in current]
    if absent or unexpected:
        raise AcceleratorValueError(
            f"load: {entry} does not fit the {type(module).__name__} of {slot}: missing "
            f"{absent or 'nothing'}, unexpected {unexpected or 'nothing'}; build the model "
            f"as it was when saved"
        )
    for name, tensor in current.items():
        saved = stored[name]
        tensors = isinstance(tensor, torch.Tensor) and isinstance(saved, torch.Tensor)
        if tensors and saved.shape != tensor.shape:
            raise AcceleratorValueError(
                f"load: parameter {name!r} of {entry} has shape {tuple(saved.shape)}, but "
                f"the model's has shape {tuple(tensor.shape)}; build the model with the "
                f"configuration it was saved with"
            )


#: Optimizer state entries shaped like their parameter (Adam's moments, SGD's momentum,
#: RMSprop's and Adagrad's sums, Rprop's steps): cheap to check before loading. Others
#: (Adafactor's factored rows, scalar steps) have shapes of their own.
_PARAMETER_SHAPED: Final = frozenset(
    {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer",
     "square_avg", "grad_avg", "acc_delta", "sum", "prev", "step_size", "ax"}
)  # fmt: skip


def _check_optimizer_state(key: str | None, optimizer: Any, stored: Any, path: str) -> None:
    """What ``Optimizer.load_state_dict`` would refuse (or get wrong) only after the
    model was restored: the groups, their sizes, the parameter-shaped state."""

    entry, kind = _where(key, path), type(optimizer).__name__
    slot = "state" if key is None else f"state[{key!r}]"
    groups = stored.get("param_groups") if isinstance(stored, Mapping) else None
    if not isinstance(groups, list) or not isinstance(stored.get("state"), Mapping):
        raise AcceleratorValueError(
            f"load: {entry} is not an optimizer's state dict (no 'state' and "
            f"'param_groups'), so it cannot be loaded into the {kind} of {slot}; save "
            f"the optimizer itself under that key"
        )
    ours = optimizer.param_groups
    if len(groups) != len(ours):
        raise AcceleratorValueError(
            f"load: {entry} holds {len(groups)} parameter group(s), but the {kind} of "
            f"{slot} has {len(ours)}; build the optimizer with the parameter groups it "
            f"was saved with"
        )
    for index, (saved, group) in enumerate(zip(groups, ours, strict=True)):
        count = len(saved.get("params", ())) if isinstance(saved, Mapping) else -1
        if count != len(group["params"]):
            raise AcceleratorValueError(
                f"load: parameter group {index} of {entry} has {count} parameter(s), but "
                f"that group of the {kind} of {slot} has {len(group['params'])}; build the "
                f"optimizer with the parameter groups it was saved with"
            )
    parameters = {
        saved_id: parameter
        for saved, group in zip(groups, ours, strict=True)
        for saved_id, parameter in zip(saved["params"], group["params"], strict=True)
    }
    for saved_id, entries in stored["state"].items():
        parameter = parameters.get(saved_id)
        if parameter is None or not isinstance(entries, Mapping):
            continue
        for name, value in entries.items():  # in the state's order: the first one named
            tensor = isinstance(value, torch.Tensor) and name in _PARAMETER_SHAPED
            if tensor and value.shape != parameter.shape:
                raise AcceleratorValueError(
                    f"load: optimizer state {name!r} of parameter {saved_id!r} in {entry} "
                    f"has shape {tuple(value.shape)}, but that parameter of the {kind} of "
                    f"{slot} has shape {tuple(parameter.shape)}; build the model and "
                    f"optimizer with the configuration they were saved with"
                )


def _where(key: str | None, path: str) -> str:
    return f"{path!r}" if key is None else f"entry {key!r} of {path!r}"
