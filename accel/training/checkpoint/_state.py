"""State dicts that load anywhere: tensors on the CPU, shared tensors kept shared
(the ``state_dict`` hook's fallback).

``model.state_dict()`` on an accelerator returns device tensors, and moving them to
the CPU one by one turns a tied weight (GPT-2's embedding and output layer) into two
independent copies: ``torch.save`` then stores it twice and loading it no longer
shows the tie. Here each distinct tensor crosses to the CPU once and every name
that held it gets the same CPU tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accel.errors import AcceleratorTypeError
from accel.training.nested import map_nested

__all__ = ["cpu_state_dict", "map_tensors", "to_cpu"]


def cpu_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """``model.state_dict()`` with every tensor on the CPU, shared tensors shared.

    Keys, order and non-tensor entries (``get_extra_state``) are as in
    ``model.state_dict()``; the tensors are detached.
    """
    # keep_vars: the Parameter objects themselves, so a tie is one object under two keys
    # (plain state_dict() detaches each slot into a new tensor object).
    state = model.state_dict(keep_vars=True)
    return to_cpu(state)  # type: ignore[no-any-return]


def checked_state_dict_model(model: object) -> None:
    """The handle's check of what ``acc.state_dict`` is given.

    :raises TypeError: ``model`` is not a module (other objects go to ``save()``).
    """
    if not isinstance(model, torch.nn.Module):
        raise AcceleratorTypeError(
            f"state_dict expects a torch.nn.Module, got {type(model).__name__}; use "
            f"save() for other objects"
        )


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
