"""Filling a materialized model: the default init, one module at a time, and ``load``,
copied in place (:func:`accel.training._materialize.materialize_model`'s step 2)."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel.errors import (
    AcceleratorFileNotFoundError,
    AcceleratorKeyError,
    AcceleratorTypeError,
    AcceleratorValueError,
)

__all__ = ["fill_from", "is_dtensor", "listed", "reset_every_module"]

#: Names shown in a message before the list is cut.
_SHOWN = 8


def listed(names: list[str]) -> str:
    """``names`` for a message, cut after a few."""
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


# -- the default init: each module's reset_parameters(), in module order -----------------


def reset_every_module(model: nn.Module, fresh: set[int]) -> None:
    """Each module's ``reset_parameters()`` (torch's own ``_reset_parameters()`` for
    the modules that name it so), in ``model.modules()`` order, writing only tensors
    that came from ``meta`` and that no earlier module wrote.

    Values come out as in a one-process build, where each module's constructor draws
    in that order: a tied weight keeps the values of its first module (a later module
    draws for it, as its constructor did, but its draws are dropped; after the last
    module that writes, nothing is drawn), and a sharded tensor is drawn at its full
    size, of which this rank keeps its own shard.
    """
    resetting = [
        (module, reset) for module in _children_first(model) if (reset := _reset_of(module))
    ]
    # The last module that writes a tensor no module before it wrote: the draws of the
    # modules after it would all be dropped, so they are not made (the values are the
    # same; the generator is left where the last kept draw left it).
    first_writers = set()
    claimed: set[int] = set()
    for position, (module, _) in enumerate(resetting):
        for tensor in (*module._parameters.values(), *module._buffers.values()):
            if tensor is not None and id(tensor) in fresh and id(tensor) not in claimed:
                claimed.add(id(tensor))
                first_writers.add(position)
    written: set[int] = set()
    for module, reset in resetting[: max(first_writers, default=-1) + 1]:
        own = {**module._parameters, **module._buffers}
        stand_ins = {
            name: _full_stand_in(tensor)
            for name, tensor in own.items()
            if tensor is not None
            and (id(tensor) in written or is_dtensor(tensor) or id(tensor) not in fresh)
        }
        if not stand_ins:
            reset()
        else:
            _reset_through(module, stand_ins, written)
        written.update(id(t) for t in own.values() if t is not None and id(t) in fresh)


def _reset_of(module: nn.Module) -> Callable[[], object] | None:
    """The module's ``reset_parameters()``, or torch's own ``_reset_parameters()``."""
    for name in ("reset_parameters", "_reset_parameters"):
        reset = getattr(module, name, None)
        if callable(reset):
            return reset  # type: ignore[no-any-return]
    return None


def _children_first(model: nn.Module) -> list[nn.Module]:
    """Every module once, each after its children: the order in which a one-process
    build runs their resets (a parent's ``__init__`` builds its children, then resets
    itself, as ``MultiheadAttention`` zeroes its ``out_proj.bias``)."""
    order: list[nn.Module] = []
    seen: set[int] = set()
    stack: list[tuple[nn.Module, bool]] = [(model, False)]
    while stack:
        module, children_done = stack.pop()
        if children_done:
            order.append(module)
        elif id(module) not in seen:
            seen.add(id(module))
            stack.append((module, True))
            stack.extend((child, False) for child in reversed(list(module.children())))
    return order


def _reset_through(
    module: nn.Module, stand_ins: dict[str, torch.Tensor], written: set[int]
) -> None:
    """Run ``module``'s reset on a shallow copy whose slots in ``stand_ins`` hold
    full-size tensors of their own, then copy into the module what it may keep: the
    shard of a sharded tensor no earlier module wrote."""
    double = copy.copy(module)  # its own registries below; the rest shared
    double.__dict__["_parameters"] = {
        **module._parameters,
        **_as_slots(module._parameters, stand_ins),
    }
    double.__dict__["_buffers"] = {**module._buffers, **_as_slots(module._buffers, stand_ins)}
    reset = _reset_of(double)
    assert reset is not None  # the module's own, found on the copy
    reset()
    with torch.no_grad():
        for name, real in {**module._parameters, **module._buffers}.items():
            drawn = double._parameters.get(name, double._buffers.get(name))
            if real is None or drawn is None or name not in stand_ins or id(real) in written:
                continue
            if is_dtensor(real):
                real.copy_(_shard_of(drawn, real))
            # A tensor that was not on meta kept its values: the draw is dropped.


def _as_slots(
    registry: Mapping[str, torch.Tensor | None], stand_ins: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for name, tensor in registry.items():
        if name in stand_ins and tensor is not None:
            stand_in = stand_ins[name]
            if isinstance(tensor, nn.Parameter):
                stand_in = nn.Parameter(stand_in, requires_grad=tensor.requires_grad)
            found[name] = stand_in
    return found


def is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (sharded by tensor parallelism or FSDP2)."""
    # A DTensor can only exist once torch.distributed.tensor is imported.
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _full_stand_in(tensor: torch.Tensor) -> torch.Tensor:
    """Uninitialized memory of ``tensor``'s full (global) shape, on its device."""
    if is_dtensor(tensor):
        local = tensor.to_local()  # type: ignore[attr-defined]
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=local.device)
    return torch.empty_like(tensor)


def _shard_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``full``, laid out as the DTensor ``like``: every rank holds
    the same full tensor, so the shard is cut locally, without communication."""
    # Only called with a DTensor, so torch.distributed.tensor is loaded already.
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh, placements = like.device_mesh, like.placements  # type: ignore[attr-defined]
    replicated = distribute_tensor(
        full.detach(), mesh, [Replicate()] * mesh.ndim, src_data_rank=None
    )
    return replicated.redistribute(mesh, placements)


# -- load: a state dict or a checkpoint, copied in place ---------------------------------


def fill_from(
    model: nn.Module, load: Mapping[str, Any] | str | os.PathLike[str], device: torch.device
) -> None:
    """Copy ``load`` into the model's tensors in place, each tensor once (a tie group
    read under the first of its names the source has).

    :raises KeyError: a tensor of the model's state dict is under none of its names.
    """
    if isinstance(load, Mapping):
        _copy_in(model, _model_entry(load, "the state dict given"), device)
        return
    path = Path(os.fspath(load))
    if path.is_dir():
        _load_dcp(model, path)
        return
    if not path.is_file():
        raise AcceleratorFileNotFoundError(
            2, f"materialize: load= names no checkpoint: nothing at {str(path)!r}", str(path)
        )
    # Mapped, not read: the file's pages are read as each tensor is copied, never a
    # full copy of the model in host memory.
    stored = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    _copy_in(model, _model_entry(stored, repr(str(path))), device)


def _model_entry(stored: Any, where: str) -> Mapping[str, Any]:
    if isinstance(stored, Mapping) and isinstance(stored.get("model"), Mapping):
        return stored["model"]  # type: ignore[no-any-return]
    if not isinstance(stored, Mapping):
        raise AcceleratorTypeError(
            f"materialize: {where} holds a {type(stored).__name__}, not a state dict nor "
            f"a dict with a 'model' entry"
        )
    return stored


def tensor_groups(model: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """Each distinct tensor of ``model``'s state dict with every name it has there."""
    groups: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), ([], tensor))[0].append(name)
    return list(groups.values())


def _copy_in(model: nn.Module, source: Mapping[str, Any], device: torch.device) -> None:
    groups = tensor_groups(model)
    missing = [names for names, _ in groups if not any(name in source for name in names)]
    if missing:
        shown = listed([" = ".join(names) for names in missing])
        raise AcceleratorKeyError(
            f"materialize: load= has no entry for {shown}; nothing was loaded. Pass the "
            f"model's full state dict (acc.state_dict(model) of the trained model)"
        )
    chosen = [(next(name for name in names if name in source), tensor) for names, tensor in groups]
    misfits = [
        f"{name} {_shape_of(source[name])} (the model's is {tuple(tensor.shape)})"
        for name, tensor in chosen
        if not isinstance(source[name], torch.Tensor) or source[name].shape != tensor.shape
    ]
    if misfits:
        raise AcceleratorValueError(
            f"materialize: load= does not fit the model: {listed(misfits)}; nothing was "
            f"loaded. Load the checkpoint of this model's configuration"
        )
    with torch.no_grad():
        for name, tensor in chosen:
            value = source[name]
            if is_dtensor(tensor):
                tensor.copy_(_shard_of(value.to(tensor.to_local().device), tensor))  # type: ignore[attr-defined]
            else:
                tensor.copy_(value.to(device))


def _shape_of(value: object) -> str:
    return (
        str(tuple(value.shape))
        if isinstance(value, torch.Tensor)
        else f"is a {type(value).__name__}"
    )


def _load_dcp(model: nn.Module, path: Path) -> None:
    """Load a DCP directory (``save_sharded``'s, or DCP's own) into the model in place:
    under ``"model."`` where it has that entry, else at the top level."""
    from torch.distributed.checkpoint import state_dict_loader
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    if not (path / ".metadata").is_file():
        raise AcceleratorFileNotFoundError(
            2,
            f"materialize: load= names a directory that holds no sharded checkpoint (no "
            f".metadata in {str(path)!r}); pass save_sharded's directory or acc.save's file",
            str(path),
        )
    saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    groups = tensor_groups(model)
    prefix = "model." if any(key.startswith("model.") for key in saved) else ""
    request: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    misfits: list[str] = []
    for names, tensor in groups:
        found = next((name for name in names if prefix + name in saved), None)
        if found is None:
            missing.append(" = ".join(names))
        elif (size := getattr(saved[prefix + found], "size", tensor.shape)) != tensor.shape:
            misfits.append(f"{found} {tuple(size)} (the model's is {tuple(tensor.shape)})")
        else:
            request[found] = tensor.detach() if not is_dtensor(tensor) else tensor
    if missing:
        raise AcceleratorKeyError(
            f"materialize: the checkpoint at {str(path)!r} has no entry for "
            f"{listed(missing)}; nothing was loaded"
        )
    if misfits:
        raise AcceleratorValueError(
            f"materialize: the checkpoint at {str(path)!r} does not fit the model: "
            f"{listed(misfits)}; nothing was loaded"
        )
    into: dict[str, Any] = {"model": request} if prefix else request
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with torch.no_grad():
            state_dict_loader.load(into, checkpoint_id=str(path))
    except CheckpointException as error:  # a BaseException: never let it through
        raise AcceleratorValueError(
            f"materialize: DCP could not read the checkpoint at {str(path)!r} into the "
            f"model (a tensor of another shape?): {error}"
        ) from error
    # DCP copies into the tensors given; a plain tensor's detach() shares its counter.
