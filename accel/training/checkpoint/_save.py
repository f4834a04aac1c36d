"""One save, top to bottom: what ``acc.save(obj, path, asynchronous=...)`` does.

:func:`save_checkpoint` is the whole pipeline, the same in both modes:

1. the pending asynchronous save first (one save at a time), and its failure;
2. on XLA, the save's step marks hidden from later draws (XLA's generator put back);
3. ``obj`` as it is stored: objects with ``state_dict()`` as their state dicts, and
   everything checked readable by ``weights_only`` loading before anything is written;
4. every rank's generators gathered into it;
5. on XLA, the pending graph run, so that tensors cross to the host as data;
6. the write, through the ``save`` hook in both modes: here, or in a background
   thread after a snapshot of every tensor (the only thing the loop waits for), on
   the process that writes (:mod:`._main_process` tells the others).

The modes differ only in step 6, and in where step 3 copies a module's tensors to the
CPU: a synchronous save through ``acc.state_dict``; an asynchronous one leaves them
where they are, because its snapshot copies every tensor once anyway.

What a step needs beyond this module has one job each and returns here: the slot of
the save in flight (:mod:`._async_save`, shared with ``save_sharded``), every rank's
generators (:mod:`._rank_generators`, shared with ``save_sharded``), the snapshot's copy
(:mod:`._snapshot`), the atomic, durable write (:mod:`._atomic`) and the main process's
word to the others (:mod:`._main_process`). ``acc.load`` mirrors it (:mod:`._load`).

``torch.save`` pickles anything, but ``torch.load(weights_only=True)`` builds only
tensors, plain values and plain containers: a checkpoint holding a module object saves
fine and then cannot be loaded. Refusing it in step 3, with the key path of the value,
keeps the previous checkpoint in place and says what to change while the run that made
the value is still there.
"""

from __future__ import annotations

import copy
import os
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.serialization
from torch import nn

from accel.errors import AcceleratorTypeError
from accel.training.checkpoint._arguments import checked_path
from accel.training.checkpoint._async_save import (
    PendingSave,
    check_asynchronous,
    one_save_at_a_time,
    save_group,
    start_background,
)
from accel.training.checkpoint._atomic import atomic_save
from accel.training.checkpoint._main_process import (
    broadcast_from_rank_0,
    in_a_job,
    is_main_process,
    written_by_main,
)
from accel.training.checkpoint._rank_generators import gathered_generators
from accel.training.checkpoint._snapshot import take_snapshot
from accel.training.step import unwrap_compiled

__all__ = ["SaveHooks", "device_state_dict", "save_checkpoint", "storable"]


class SaveHooks(Protocol):
    """What a save asks of the accelerator: the hooks of the handle's hook caller."""

    def answered_by_plugin(self, hook_name: str) -> bool: ...
    def state_dict(self, model: nn.Module) -> dict[str, Any]: ...
    def save(self, obj: Any, path: str | os.PathLike[str]) -> None: ...
    def mark_step(self, device: torch.device) -> None: ...
    def rng_state(self, device: torch.device) -> Any: ...
    def set_rng_state(self, state: Any, device: torch.device) -> None: ...


def save_checkpoint(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    asynchronous: bool,
    hooks: SaveHooks,
    device: torch.device,
) -> PendingSave | None:
    """:meth:`Accelerator.save`: the steps of the module docstring, in order."""
    checked_path("save", path)
    check_asynchronous("save", asynchronous)
    with one_save_at_a_time(), _step_marks_unseen(hooks, device):  # 1. and 2.
        stored = storable(obj, _module_state(hooks, asynchronous))  # 3.
        stored = gathered_generators(stored)  # 4. a collective: every rank saves
        hooks.mark_step(device)  # 5. a no-op on an eager device
        if not asynchronous:  # 6.
            hooks.save(stored, path)
            return None
        return _write_in_background(stored, Path(os.fspath(path)), hooks)


# -- 2. and 5.: XLA's step marks ---------------------------------------------------------


@contextmanager
def _step_marks_unseen(hooks: SaveHooks, device: torch.device) -> Iterator[None]:
    """Each step mark (the save's own, and ``state_dict``'s for every module on XLA)
    advances XLA's generator: put it back, so that a save does not show in later draws.
    Without a plugin's ``mark_step`` (an eager device) there is nothing to hide."""
    if not hooks.answered_by_plugin("mark_step"):
        yield
        return
    device_rng = hooks.rng_state(device)
    try:
        yield
    finally:
        hooks.set_rng_state(device_rng, device)


# -- 3.: what is stored ------------------------------------------------------------------

# Exact types only: a subclass pickles as its own class, which weights_only refuses.
_MAPPINGS = (dict, OrderedDict, Counter)
_SEQUENCES = (list, tuple)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray)


def _module_state(hooks: SaveHooks, asynchronous: bool) -> Callable[[nn.Module], dict[str, Any]]:
    # A synchronous save writes what acc.state_dict gives (on the CPU, a tie once). An
    # asynchronous one, without a plugin's state_dict, keeps the model's own tensors:
    # the snapshot copies them once, rather than copying the CPU copies again.
    if asynchronous and not hooks.answered_by_plugin("state_dict"):
        return device_state_dict
    return lambda model: hooks.state_dict(unwrap_compiled(model))


def device_state_dict(model: nn.Module) -> dict[str, Any]:
    """``model``'s state dict as its tensors are (the snapshot copies them once); a tied
    weight is one Parameter under both names. Of a compiled model, the plain model's."""
    return unwrap_compiled(model).state_dict(keep_vars=True)


def storable(obj: Any, module_state: Callable[[nn.Module], dict[str, Any]]) -> Any:
    """``obj`` as it is stored: an object with ``state_dict()`` (a module, an optimizer,
    an LR scheduler, a grad scaler), at the top or anywhere in dicts, lists and tuples,
    becomes its state dict, a module's through ``module_state``; the rest is kept.

    Containers on the way to such an object are shallow copies (a state dict keeps its
    ``_metadata``) and an object met twice is converted once, so what was shared (a
    self-reference included) stays shared; where there is none, ``obj`` itself comes
    back. Then everything must be something ``weights_only`` loading reads back.

    :raises TypeError: a value ``acc.load`` could not read; the message gives its path.
    """
    memo: dict[int, Any] = {}
    found = False

    def convert(value: Any) -> Any:
        nonlocal found
        key = id(value)
        if key in memo:
            return memo[key]
        if callable(getattr(value, "state_dict", None)) and not isinstance(value, type):
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
    stored = stored if found else obj
    _check_loadable(stored)
    return stored


def _check_loadable(obj: Any) -> None:
    """Raise unless ``torch.load(weights_only=True)`` can read back all of ``obj``."""
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


# -- 6., asynchronous: the snapshot, then the write in a thread --------------------------


def _write_in_background(stored: Any, target: Path, hooks: SaveHooks) -> PendingSave:
    """Snapshot ``stored`` and write it in a thread: with the ``save`` hook of a plugin
    (given the CPU snapshot, on the process that writes), or with
    :func:`~accel.training.checkpoint._atomic.atomic_save`.

    In a distributed job rank 0 alone takes the snapshot and writes; every rank hears
    its word (:func:`~accel.training.checkpoint._main_process.written_by_main`) over
    the gloo group of the saves, never the loop's communicator.
    """
    if not in_a_job():
        return start_background(target, *_snapshot_and_writer(stored, target, hooks))
    main = is_main_process()
    # The other ranks take no snapshot: they only wait for rank 0's word.
    write, snapshot = _snapshot_and_writer(stored, target, hooks) if main else (_nothing, None)
    tell = broadcast_from_rank_0(save_group())

    def write_on_main(payload: Any) -> None:
        box = [payload]  # the only reference: the snapshot is freed once written
        del payload
        written_by_main(lambda: write(box.pop()), target, main=main, tell=tell)

    return start_background(target, write_on_main, snapshot)


def _snapshot_and_writer(
    stored: Any, target: Path, hooks: SaveHooks
) -> tuple[Callable[[Any], None], Any]:
    """How the snapshot is written, and the snapshot."""
    if hooks.answered_by_plugin("save"):  # it may keep what it is given: memory of its own
        snapshot, _ = take_snapshot(stored)
        return lambda copy: hooks.save(copy, target), snapshot
    snapshot, owned = _snapshot_into_spare(stored)
    return lambda copy: _write(copy, target, owned), snapshot


def _nothing(_: Any) -> None:
    """What a rank other than 0 writes (written_by_main never calls it there)."""


#: The storages of the last snapshot accel wrote itself, free once its write ended:
#: the next snapshot copies into them (see accel.training.checkpoint._snapshot).
_spare: list[torch.UntypedStorage] = []


def _snapshot_into_spare(stored: Any) -> tuple[Any, list[torch.UntypedStorage]]:
    global _spare
    spare, _spare = _spare, []
    return take_snapshot(stored, spare)  # what it did not reuse is freed on return


def _write(snapshot: Any, target: Path, owned: list[torch.UntypedStorage]) -> None:
    global _spare
    try:
        atomic_save(snapshot, target)
    finally:
        del snapshot  # nothing else holds the copies: their storages are free again
        _spare = owned
