"""One walker for nested batches and checkpoints, with one set of rules.

Batch moves (:func:`accel.training.batch.move_batch`), every ``device_loader``,
checkpoints (``acc.save``, ``acc.load``) and SPMD sharding walk containers of tensors
with :func:`map_nested`, so the container a training loop receives is the same on every
accelerator. The rules:

- **mappings** (``dict`` and its subclasses: ``defaultdict`` keeps its factory,
  ``OrderedDict`` its order, a state dict its ``_metadata``; other ``Mapping`` types
  are rebuilt from a dict of their items),
- **tuples** (namedtuples rebuilt from their fields, tuple subclasses from a list),
  **lists** (subclasses keep their attributes),
- **dataclass instances**: copied, then every field set directly, so ``__init__`` and
  ``__post_init__`` do not run again, ``init=False`` fields keep their values and a
  frozen dataclass stays frozen,
- anything else (strings, numbers, sets, your own objects) passes through as it is.

An object met twice is converted once: the same tensor twice comes out as one
converted tensor twice, the same sub-container twice as one rebuilt container twice.
A container that contains itself is refused with a ``ValueError`` naming the path.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch

from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__ = ["map_nested"]

#: Values that are never containers: answered before any container check.
_ATOMS: Final = (str, bytes, int, float, complex, bool, type(None))
_UNSET: Final = object()


def map_nested(
    obj: Any,
    convert: Callable[[Any], Any],
    *,
    leaf_type: type | tuple[type, ...] | None = None,
    what: str = "batch",
) -> Any:
    """``obj`` rebuilt with ``convert(leaf)`` for every leaf in it (by default, every
    ``torch.Tensor``), containers walked by the rules above. ``obj`` is not changed.

    :param leaf_type: convert instances of this type instead of tensors.
    :param what: what ``obj`` is, for error messages (``"batch"``, ``"checkpoint"``).
    :raises ValueError: ``obj`` contains itself, or is nested deeper than Python's
        recursion limit allows.
    :raises TypeError: a container's type cannot be rebuilt from its items.
    """
    if leaf_type is None:
        leaf_type = torch.Tensor
    walker = _Walker(convert, leaf_type, what)
    try:
        return walker.walk(obj)
    except _CycleFound as found:
        raise AcceleratorValueError(_cycle_message(obj, found.container, what)) from None
    except RecursionError:
        raise AcceleratorValueError(
            f"the {what} is nested too deeply to walk (Python's recursion limit); "
            f"flatten it, or move its tensors yourself"
        ) from None


def tensors_in(obj: Any, *, what: str = "batch") -> list[Any]:
    """Every distinct tensor in ``obj``, in the order :func:`map_nested` meets them."""
    found: dict[int, Any] = {}

    def collect(tensor: Any) -> Any:
        found[id(tensor)] = tensor
        return tensor

    map_nested(obj, collect, what=what)
    return list(found.values())


class _CycleFound(Exception):
    def __init__(self, container: object) -> None:
        self.container = container


class _Walker:
    __slots__ = ("_active", "_alive", "_convert", "_leaf", "_memo", "_what")

    def __init__(
        self, convert: Callable[[Any], Any], leaf: type | tuple[type, ...], what: str
    ) -> None:
        self._convert = convert
        self._leaf = leaf
        self._what = what
        # id -> converted leaf or rebuilt container. A dict, list or tuple holds its
        # items alive while the walk runs; a Mapping or a dataclass may hand out a new
        # object per access, so ``_alive`` holds those (a freed object's id is reused).
        self._memo: dict[int, Any] = {}
        self._alive: list[Any] = []
        self._active: set[int] = set()  # containers being rebuilt: the way down

    def walk(self, value: Any) -> Any:
        if isinstance(value, self._leaf):
            found = self._memo.get(id(value))
            if found is None:  # (a leaf converted to None is converted again: harmless)
                found = self._memo[id(value)] = self._convert(value)
            return found
        if isinstance(value, _ATOMS):
            return value
        rebuild: Any
        if isinstance(value, Mapping):
            rebuild = self._mapping
        elif isinstance(value, tuple):
            rebuild = self._tuple
        elif isinstance(value, list):
            rebuild = self._list
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            rebuild = self._dataclass
        else:
            return value
        # Inline rather than a helper: every Python frame per level of nesting lowers
        # the depth we can walk before the recursion limit.
        key = id(value)
        if key in self._memo:
            return self._memo[key]
        if key in self._active:
            raise _CycleFound(value)
        self._active.add(key)
        try:
            rebuilt = self._memo[key] = rebuild(value)
        finally:
            self._active.discard(key)
        return rebuilt

    def _mapping(self, value: Mapping[Any, Any]) -> Any:
        walk = self.walk
        if type(value) is dict:
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, dict):
            # copy.copy keeps the subclass and its state (defaultdict's factory, a state
            # dict's _metadata) without calling __init__; reassigning keeps the order.
            rebuilt = copy.copy(value)
            for key, item in value.items():
                rebuilt[key] = walk(item)
            return rebuilt
        items = list(value.items())
        self._alive.append(items)
        return self._rebuild(type(value), {key: walk(item) for key, item in items})

    def _tuple(self, value: tuple[Any, ...]) -> Any:
        walk = self.walk
        items = [walk(item) for item in value]
        if type(value) is tuple:
            return tuple(items)
        if hasattr(value, "_fields"):  # namedtuple
            return self._rebuild(type(value), *items)
        return self._rebuild(type(value), items)

    def _list(self, value: list[Any]) -> Any:
        walk = self.walk
        items = [walk(item) for item in value]
        if type(value) is list:
            return items
        rebuilt = copy.copy(value)
        rebuilt[:] = items
        return rebuilt

    def _dataclass(self, value: Any) -> Any:
        # Copy, then set fields directly: no __init__/__post_init__ re-run, and frozen
        # or init=False fields work too.
        rebuilt = copy.copy(value)
        for field in dataclasses.fields(value):
            # An init=False field may be unset (or only a class attribute): set only
            # what the walk changed, so nothing appears on the copy that was not there.
            item = getattr(value, field.name, _UNSET)
            self._alive.append(item)  # (a property may build it on each access)
            walked = self.walk(item)
            if walked is not item:
                object.__setattr__(rebuilt, field.name, walked)
        return rebuilt

    def _rebuild(self, container_type: type, *arguments: Any) -> Any:
        """Call a container's constructor with its converted items, or explain why not."""
        try:
            return container_type(*arguments)
        except TypeError as exc:
            raise AcceleratorTypeError(
                f"cannot rebuild {container_type.__qualname__} (in the {self._what}) with "
                f"its moved items ({exc}); give it a constructor that takes its items as "
                f"{'tuple' if issubclass(container_type, tuple) else 'dict'}() does, or "
                f"move its tensors yourself"
            ) from exc


def _cycle_message(root: Any, container: object, what: str) -> str:
    inner = _path_back_to(root, container, what)
    where = f": {inner} is {_path_to(root, container, what)} again" if inner else ""
    return (
        f"the {what} contains itself{where} (a {type(container).__name__} nested inside "
        f"itself); a {what} must be a tree of containers, so break the cycle"
    )


def _path_to(root: Any, target: object, what: str) -> str:
    """The path from ``root`` down to ``target`` (first found), as Python would index it."""
    return _search(root, target, what, set()) or what


def _path_back_to(root: Any, container: object, what: str) -> str | None:
    """The path of a place inside ``container`` (reached from ``root``) that holds
    ``container`` again. Only run once a cycle is known, so it may be slow."""
    inside = _path_to(root, container, what)
    for step, child in _children(container):
        found = _search(child, container, inside + step, set())
        if found is not None:
            return found
    return None


def _search(value: Any, target: object, path: str, seen: set[int]) -> str | None:
    if value is target:
        return path
    if id(value) in seen:
        return None
    seen.add(id(value))
    for step, child in _children(value):
        found = _search(child, target, path + step, seen)
        if found is not None:
            return found
    return None


def _children(value: Any) -> list[tuple[str, Any]]:
    """The (path step, item) pairs of a container, by the walker's rules."""
    if isinstance(value, _ATOMS):
        return []
    if isinstance(value, Mapping):
        return [(f"[{key!r}]", item) for key, item in value.items()]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return [(f".{name}", item) for name, item in zip(value._fields, value, strict=False)]
    if isinstance(value, (tuple, list)):
        return [(f"[{index}]", item) for index, item in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            (f".{field.name}", getattr(value, field.name))
            for field in dataclasses.fields(value)
            if hasattr(value, field.name)
        ]
    return []
