"""Checkpoints that load anywhere: tensors on the CPU, shared tensors kept shared.

``model.state_dict()`` on an accelerator returns device tensors, and moving them to
the CPU one by one turns a tied weight (GPT-2's embedding and output layer) into two
independent copies: ``torch.save`` then stores it twice and loading it no longer
shows the tie. Here each distinct tensor crosses to the CPU once and every name
that held it gets the same CPU tensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["cpu_state_dict", "is_main_process", "map_tensors", "to_cpu"]


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

    Walks mappings, lists, tuples, namedtuples and dataclasses; other values pass
    through. Each distinct tensor object is converted once.

    :param leaf_type: convert instances of this type instead of tensors.
    """
    import torch

    leaf = torch.Tensor if leaf_type is None else leaf_type
    memo: dict[int, Any] = {}

    def convert(value: Any) -> Any:
        if isinstance(value, leaf):
            key = id(value)
            found = memo.get(key)
            if found is None:
                found = memo[key] = convert_tensor(value)
            return found
        if isinstance(value, Mapping):
            converted = {key: convert(item) for key, item in value.items()}
            if type(value) is dict:
                return converted
            try:
                rebuilt: Any = type(value)(converted)  # type: ignore[call-arg]  # OrderedDict etc.
            except TypeError:
                return converted
            if hasattr(value, "_metadata"):  # state_dict's OrderedDict carries versions
                rebuilt._metadata = value._metadata
            return rebuilt
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(convert(item) for item in value))
        if isinstance(value, (list, tuple)):
            return type(value)(convert(item) for item in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {
                field.name: convert(getattr(value, field.name))
                for field in dataclasses.fields(value)
                if field.init
            }
            return dataclasses.replace(value, **changes)
        return value

    return convert(obj)


def is_main_process() -> bool:
    """Rank 0 of an initialised :mod:`torch.distributed` group, or any lone process."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return True
    return dist.get_rank() == 0
