"""Checkpoints that load anywhere: tensors on the CPU, shared tensors kept shared;
and putting a loaded checkpoint back into the objects of a training run.

``model.state_dict()`` on an accelerator returns device tensors, and moving them to
the CPU one by one turns a tied weight (GPT-2's embedding and output layer) into two
independent copies: ``torch.save`` then stores it twice and loading it no longer
shows the tie. Here each distinct tensor crosses to the CPU once and every name
that held it gets the same CPU tensor.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist
from torch import nn

from accel.errors import (
    AcceleratorFileNotFoundError,
    AcceleratorKeyError,
    AcceleratorOSError,
    AcceleratorTypeError,
    AcceleratorValueError,
)
from accel.training.checkpoint._atomic import atomic_save
from accel.training.checkpoint._restoring import Move, moved_for_restore
from accel.training.nested import map_nested
from accel.training.step import unwrap_compiled

if TYPE_CHECKING:
    import torch

__all__ = ["cpu_state_dict", "is_main_process", "load_checkpoint", "save_on_main_process"]


def cpu_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """``model.state_dict()`` with every tensor on the CPU, shared tensors shared.

    Keys, order and non-tensor entries (``get_extra_state``) are as in
    ``model.state_dict()``; the tensors are detached.
    """
    # keep_vars: the Parameter objects themselves, so a tie is one object under two keys
    # (plain state_dict() detaches each slot into a new tensor object).
    state = model.state_dict(keep_vars=True)
    return to_cpu(state)  # type: ignore[no-any-return]


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in it (in dicts, lists, tuples, dataclasses) on the CPU.

    A tensor met several times is copied once and the copies stay one object;
    tensors already on the CPU are detached, not copied.
    """
    return map_tensors(obj, lambda tensor: tensor.detach().to("cpu"))


def map_tensors(
    obj: Any, convert_tensor: Callable[[Any], Any], leaf_type: type | None = None
) -> Any:
    """``obj`` rebuilt with ``convert_tensor(t)`` for every tensor ``t`` in it.

    Walks containers by the rules of :mod:`accel.training.nested` (the walker batch
    moves use too): mappings keep their type and state (a state dict's ``_metadata``),
    dataclasses are copied without re-running ``__init__``; other values pass
    through. Each distinct tensor object is converted once, so a tensor shared stays
    shared.

    :param leaf_type: convert instances of this type instead of tensors.
    :raises ValueError: ``obj`` contains itself.
    """

    return map_nested(obj, convert_tensor, leaf_type=leaf_type, what="checkpoint")


def is_main_process() -> bool:
    """Rank 0 of an initialised :mod:`torch.distributed` group, or any lone process."""

    if not dist.is_available() or not dist.is_initialized():
        return True
    return dist.get_rank() == 0


# -- the save hook's fallback write (the rest of a save: _save.py) --------------------


def save_on_main_process(obj: Any, path: str | os.PathLike[str]) -> None:
    """:func:`~accel.training.checkpoint._atomic.atomic_save` on the main process of an initialised
    :mod:`torch.distributed` group (or in a lone process); every rank returns once the
    file is complete, and raises if the main process could not write it."""

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        atomic_save(obj, path)
        return
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            atomic_save(obj, path)
        except BaseException as exc:  # the others wait for word of it, whatever it is
            failure = exc
    outcome = [None if failure is None else f"{type(failure).__name__}: {failure}"]
    dist.broadcast_object_list(outcome, src=0)  # also the barrier: the file is complete
    if failure is not None:
        raise failure
    if outcome[0] is not None:
        raise AcceleratorOSError(
            f"save: the main process (rank 0) could not write the checkpoint "
            f"{os.fspath(path)!r}: {outcome[0]}"
        )


# -- loading ----------------------------------------------------------------------------


def load_checkpoint(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True)``, tensors on the CPU, with errors that say
    what the file is.

    :raises FileNotFoundError: there is no file at ``path``.
    :raises pickle.UnpicklingError: the file asks to run or build something that
        ``weights_only`` refuses (it is never run).
    :raises ValueError: the file is not a checkpoint (torn, or not ``torch.save``'s).
    """

    name = os.fspath(path)
    if not os.path.isfile(name):
        raise AcceleratorFileNotFoundError(
            2,
            f"load: there is no checkpoint file at {name!r}"
            + (" (a directory)" if os.path.isdir(name) else "")
            + "; check the path, or find the newest one with "
            "accel.training.checkpoint._retention.latest_checkpoint(directory)",
            name,
        )
    try:
        return torch.load(name, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = re.search(r"Unsupported (?:global|class): (?:GLOBAL )?([\w.]+)", str(exc))
        if refused is None:  # not a refusal: bytes the unpickler cannot read at all
            raise _not_a_checkpoint(name, exc) from exc
        raise pickle.UnpicklingError(
            f"load refused {name!r}: it asks to build {refused.group(1)}, which "
            f"weights_only loading does not allow, and nothing in it was run. Load only "
            f"checkpoints written by acc.save (tensors, numbers, strings, containers); if "
            f"you trust this file, allow its types with torch.serialization.add_safe_globals"
        ) from exc
    except Exception as exc:  # a torn file fails anywhere in the unpickler: KeyError, ...
        raise _not_a_checkpoint(name, exc) from exc


def restore_into(
    stored: Any,
    state: Any,
    path: str,
    *,
    device: torch.device | None = None,
    move: Move | None = None,
) -> dict[str, Any]:
    """Load ``stored[key]`` into every value of ``state`` with ``load_state_dict``, in
    place; return the stored entries that were not loaded into anything.

    ``state`` may also be one object with ``load_state_dict`` (what ``acc.save(model,
    path)`` stored is the model's state dict): it gets all of ``stored``, and ``{}``
    comes back. A compiled model (``torch.compile``) is loaded through the model it
    wraps, as :meth:`Accelerator.state_dict` saved it.

    Everything is checked before anything changes: a missing key, a module whose keys
    or shapes differ or an optimizer whose parameter groups differ leaves every object
    as it was.

    With ``move`` (the ``restore_to_device`` hook), the tensors ``load_state_dict``
    would copy to ``device`` unchanged are copied there first, in one call of ``move``
    (:mod:`accel.training.checkpoint._restoring`).

    :raises KeyError: a key of ``state`` is not in the file.
    :raises ValueError: the file holds no dict, or a module's keys or shapes differ, or
        an optimizer's parameter groups.
    """
    if not isinstance(state, Mapping):  # one object, saved on its own
        _check_entry(None, state, stored, path)
        target = _target(state)
        if move is not None and device is not None:
            stored = moved_for_restore({None: target}, {None: stored}, device, move)[None]
        target.load_state_dict(stored)
        return {}
    if not isinstance(stored, Mapping):
        raise AcceleratorValueError(
            f"load: {path!r} holds a {type(stored).__name__}, not a dict of entries, so "
            f"there is nothing to restore state into; call acc.load({path!r}) without state"
        )
    targets = {key: value for key, value in state.items() if hasattr(value, "load_state_dict")}
    # Every key, plain values too: a resume that silently lacks its "step" starts over.
    missing = [key for key in state if key not in stored]
    if missing:
        raise AcceleratorKeyError(
            f"load: {path!r} has no entry {', '.join(map(repr, missing))} to restore; it "
            f"has {', '.join(map(repr, stored)) or 'no entries'}. Save the same keys you "
            f"load, or leave that key out of state"
        )
    for key, target in targets.items():
        _check_entry(key, target, stored[key], path)

    # Modules first: an optimizer puts its state on its parameters' device.
    order = sorted(targets, key=lambda key: not isinstance(targets[key], nn.Module))
    loaded = {key: stored[key] for key in targets}
    if move is not None and device is not None:
        unwrapped = {key: _target(target) for key, target in targets.items()}
        loaded = moved_for_restore(unwrapped, loaded, device, move)
    for key in order:
        _target(targets[key]).load_state_dict(loaded[key])
    return {key: value for key, value in stored.items() if key not in targets}


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


def _not_a_checkpoint(name: str, exc: BaseException) -> ValueError:
    return AcceleratorValueError(
        f"load: {name!r} is not a checkpoint torch can read ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}): a file cut short, or "
        f"not written by acc.save or torch.save. acc.save never leaves a torn file; load "
        f"an older checkpoint (accel.training.checkpoint._retention.latest_checkpoint)"
    )


def checked_path(operation: str, path: object) -> None:
    """:raises TypeError: ``path`` is neither a str nor an ``os.PathLike``."""
    if not isinstance(path, (str, os.PathLike)):
        raise AcceleratorTypeError(
            f"{operation} expects a file path (str or os.PathLike), got {type(path).__name__}"
        )


def checked_state(state: object) -> None:
    """:raises TypeError: ``state`` of ``load(path, state)`` is neither a dict nor one
    object with ``load_state_dict``."""
    if not (state is None or isinstance(state, Mapping) or hasattr(state, "load_state_dict")):
        raise AcceleratorTypeError(
            f"load(path, state) expects state to be a dict of the objects to restore "
            f"(model, optimizer, ...) or one object with load_state_dict, got "
            f"{type(state).__name__}"
        )
