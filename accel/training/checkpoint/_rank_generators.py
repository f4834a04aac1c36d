"""Every rank's generators in one checkpoint, and each rank's own back on resume.

In a :mod:`torch.distributed` job only one process writes a checkpoint (rank 0 for
``acc.save``; for ``save_sharded`` DCP keeps one copy of the plain values), so the
``acc.rng_state()`` stored in it used to be one rank's. Ranks that draw differently
(dropout seeded per rank, a per-rank data order) then resumed with another rank's
generators. Here, when a job of several ranks saves, every value shaped like
``acc.rng_state()`` (a dict of exactly ``"python"``, ``"numpy"``, ``"torch"`` and
``"device"``) is gathered from every rank and stored as one record::

    {"accel.rank_generators": (rank 0's state, rank 1's state, ...)}

and loading replaces each record by the loading rank's own state. On another world
size, rank ``r`` gets saved rank ``r``'s state where there is one; a rank beyond the
saved ones gets rank 0's (its draws then repeat rank 0's), and every rank warns that
the world size changed (:class:`~accel.errors.RankGeneratorsWarning`, at the caller's
line). A lone process (no group) is rank 0 of a world of one.

The gather is ``all_gather_object`` (every rank ends with the same record: DCP may
keep any rank's copy of a plain value), a few kilobytes per rank per save.
"""

from __future__ import annotations

import copy
from collections.abc import Container, Mapping
from typing import Any, Final

import torch.distributed as dist

from accel._util.warn import warn_at_caller
from accel.errors import RankGeneratorsWarning
from accel.training.checkpoint._main_process import check_object_collectives
from accel.training.checkpoint._rng import RNG_KEYS

__all__ = ["RECORD_KEY", "gathered_generators", "own_generators", "record_placeholders"]

#: The one key of a stored record of every rank's generator states.
RECORD_KEY: Final = "accel.rank_generators"

_Path = tuple[Any, ...]


def gathered_generators(obj: Any) -> Any:
    """``obj`` with each ``acc.rng_state()`` value in it replaced by the record of
    every rank's value at the same place; ``obj`` itself outside a job of several
    ranks. Collective: every rank must call it (``acc.save`` and ``save_sharded``
    are called on every rank). A rank without a value where another has one is
    stored as ``None``, and gets rank 0's back."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    if dist.get_backend() == "xla":
        return obj  # torch_xla's backend has no object collectives: the master's, as before
    check_object_collectives("save")
    found = {path: _at(obj, path) for path in _rng_paths(obj)}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, found)
    # Each rank rebuilds its own object (for save_sharded, every rank's plain values
    # are written); the paths are rank 0's where the ranks agree, as they should.
    # A tuple: DCP pickles it whole, where it would flatten a list of dicts.
    records = {path: {RECORD_KEY: tuple(states.get(path) for states in everyone)} for path in found}
    return _replaced(obj, records)


def own_generators(obj: Any, rank: int | None = None, world_size: int | None = None) -> Any:
    """``obj`` with each record :func:`gathered_generators` stored replaced by this
    rank's state (``rank`` and ``world_size`` default to the job's, 0 and 1 without
    a group). On another world size than the saved one it warns, and a rank that was
    not saved gets rank 0's state.
    """
    paths = _record_paths(obj)
    if not paths:
        return obj
    if rank is None or world_size is None:
        grouped = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if grouped else 0
        world_size = dist.get_world_size() if grouped else 1
    chosen = {}
    for path in paths:
        states = _at(obj, path)[RECORD_KEY]
        own = states[rank] if rank < len(states) else None
        if len(states) != world_size or own is None:
            message = _resharded(len(states), world_size, rank, own is None)
            warn_at_caller(message, RankGeneratorsWarning)
        # Rank 0's, or the first saved rank's where rank 0 had none at this place.
        chosen[path] = own if own is not None else next(s for s in states if s is not None)
    return _replaced(obj, chosen)


def record_placeholders(plain: Any, saved: Container[str], prefix: str) -> Any:
    """``plain`` (the placeholders of a sharded load) with each ``acc.rng_state()``
    value that was saved as a record replaced by a placeholder for the record.

    DCP loads only the keys it is given, named by their dotted paths: ``saved`` holds
    the checkpoint's, ``prefix`` is the path of ``plain`` itself. A checkpoint saved
    by one process holds the plain state, and keeps that placeholder.
    """
    records = {
        path: {RECORD_KEY: ()}
        for path in _rng_paths(plain)
        if ".".join(map(str, (prefix, *path, RECORD_KEY))) in saved
    }
    return _replaced(plain, records) if records else plain


def _resharded(saved: int, world_size: int, rank: int, fallback: bool) -> str:
    mine = (
        f"rank {rank} was not saved, so it gets rank 0's generators (its random draws "
        f"repeat rank 0's); reseed it (acc.manual_seed(seed + rank)) if the ranks must "
        f"draw differently"
        if fallback
        else f"rank {rank} gets its own"
    )
    return (
        f"load: the checkpoint holds the random generators of {saved} rank(s), but this "
        f"job has {world_size}: {mine}. Draws after this resume differ from an "
        f"uninterrupted run of {saved} rank(s)"
    )


def _is_rng_state(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == set(RNG_KEYS)


def _is_record(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and list(value) == [RECORD_KEY]
        and isinstance(value[RECORD_KEY], (list, tuple))
        and bool(value[RECORD_KEY])
    )


def _rng_paths(obj: Any) -> list[_Path]:
    return _paths(obj, _is_rng_state)


def _record_paths(obj: Any) -> list[_Path]:
    return _paths(obj, _is_record)


def _paths(obj: Any, wanted: Any) -> list[_Path]:
    """Where in ``obj`` (through dicts, lists and tuples) the values ``wanted`` are."""
    found: list[_Path] = []
    seen: set[int] = set()
    pending: list[tuple[_Path, Any]] = [((), obj)]
    while pending:
        path, value = pending.pop()
        if wanted(value):
            found.append(path)
            continue
        if id(value) in seen:
            continue  # shared, or a cycle: walked once
        if isinstance(value, dict):
            seen.add(id(value))
            pending.extend(((*path, key), item) for key, item in value.items())
        elif type(value) in (list, tuple):
            seen.add(id(value))
            pending.extend(((*path, index), item) for index, item in enumerate(value))
    return found


def _at(obj: Any, path: _Path) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _replaced(obj: Any, values: dict[_Path, Any]) -> Any:
    """``obj`` with the value at each path replaced; the containers on those paths are
    shallow copies (a state dict keeps its ``_metadata``), the rest is shared."""
    if () in values:
        return values[()]
    tree: dict[Any, Any] = {}
    for path, value in values.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = _Leaf(value)
    return _rebuilt(obj, tree)


class _Leaf:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _rebuilt(container: Any, tree: dict[Any, Any]) -> Any:
    if isinstance(container, dict):
        rebuilt: Any = copy.copy(container)
    else:
        rebuilt = list(container)
    for key, below in tree.items():
        rebuilt[key] = below.value if isinstance(below, _Leaf) else _rebuilt(container[key], below)
    return tuple(rebuilt) if type(container) is tuple else rebuilt
