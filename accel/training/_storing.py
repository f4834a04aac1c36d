"""What :meth:`Accelerator.save` stores: objects with ``state_dict()`` as their state
dicts, wherever they sit in the saved object, and a check that ``acc.load`` (which reads
with ``weights_only=True``) can read everything back, made before anything is written.

``torch.save`` pickles anything, but ``torch.load(weights_only=True)`` builds only
tensors, plain values and plain containers: a checkpoint holding a module object saves
fine and then cannot be loaded. Refusing it at save time, with the key path of the
value, keeps the previous checkpoint in place and says what to change while the run
that made the value is still there.
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.serialization
from torch import nn

from accel.errors import AcceleratorTypeError

__all__ = ["check_loadable", "convert_stateful"]

# Exact types only: a subclass pickles as its own class, which weights_only refuses.
_MAPPINGS = (dict, OrderedDict, Counter)
_SEQUENCES = (list, tuple)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray)


def convert_stateful(
    obj: Any,
    module_state: Callable[[Any], dict[str, Any]],
    has_state: Callable[[Any], bool],
) -> Any:
    """``obj`` with every object that ``has_state`` in it (at the top, or in dicts,
    lists and tuples) replaced by its state dict, a module's through ``module_state``.

    Where there is none, ``obj`` itself comes back. Otherwise the containers are
    shallow copies (a state dict keeps its ``_metadata``) and an object met twice is
    converted once, so what was shared (a self-reference included) stays shared.
    """

    memo: dict[int, Any] = {}
    found = False

    def convert(value: Any) -> Any:
        nonlocal found
        key = id(value)
        if key in memo:
            return memo[key]
        if has_state(value):
            found = True
            memo[key] = module_state(value) if isinstance(value, nn.Module) else value.state_dict()
        elif type(value) in _MAPPINGS:
            rebuilt = memo[key] = copy.copy(value)  # registered first: a cycle comes back here
            for name, item in value.items():
                rebuilt[name] = convert(item)
        elif type(value) is list:
            items: list[Any] = []
            memo[key] = items
            items.extend(convert(item) for item in value)
        elif type(value) is tuple:
            memo[key] = tuple(convert(item) for item in value)
        else:
            return value
        return memo[key]

    stored = convert(obj)
    return stored if found else obj


def check_loadable(obj: Any) -> None:
    """Raise unless ``torch.load(weights_only=True)`` can read back all of ``obj``.

    :raises TypeError: a value of a type weights_only does not build; the message
        gives its key path (``obj['models']['a']``).
    """

    safe = tuple(
        entry[0] if isinstance(entry, tuple) else entry
        for entry in torch.serialization.get_safe_globals()
    )
    # Exact types: numpy.float64 is a float and an IntEnum an int, but both pickle as
    # their own classes.
    leaves = {*_PLAIN, torch.Size, torch.dtype, torch.device, torch.layout, *safe}
    seen: set[int] = set()
    pending: list[tuple[str, Any]] = [("", obj)]
    while pending:
        path, value = pending.pop()
        if type(value) in leaves or isinstance(value, torch.Tensor):
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        if type(value) in _MAPPINGS:
            pending.extend((f"{path}[{name!r}]", item) for name, item in value.items())
            # The keys are pickled too: an object of a class of its own as a key fails alike.
            pending.extend((f"{path}[{name!r}] (the key itself)", name) for name in value)
        elif type(value) in (*_SEQUENCES, set):
            pending.extend((f"{path}[{index}]", item) for index, item in enumerate(value))
        else:
            raise AcceleratorTypeError(_refusal(path, value))


def _refusal(path: str, value: Any) -> str:
    where = f"obj{path}" if path else "the object itself"
    kind = type(value)
    return (
        f"save(obj, path): {where} is a {kind.__module__}.{kind.__qualname__}, which "
        f"acc.load could not read back (it loads with weights_only=True: tensors, "
        f"numbers, strings, None, torch dtypes and devices, and dicts, lists, tuples and "
        f"sets of them). Nothing was written. Store it as one of those (an object with "
        f"state_dict() is stored as its state dict), or allow its type for saving and "
        f"loading with torch.serialization.add_safe_globals"
    )
