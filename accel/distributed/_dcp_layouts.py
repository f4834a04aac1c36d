"""Which layout a DCP checkpoint has, and what :func:`load_sharded` asks DCP for.

DCP stores a checkpoint as flat entries named by their dotted paths
(``model.0.weight``, ``optimizer.state.0.exp_avg``, ``step``) and loads only the
entries it is given, by the same names. Two layouts reach :func:`load_sharded`:

- accel's own (:func:`save_sharded`): the module and each optimizer under their keys
  of ``state``, in :mod:`torch.distributed.checkpoint.state_dict`'s form (optimizer
  state keyed by parameter name), and every plain value under ``accel.plain`` (under
  XLA SPMD, whose planner does not flatten them, as one entry ``accel.plain``);
- one written by ``torch.distributed.checkpoint.save`` without accel (torchtitan's,
  torch's recipes): the same keys, but the plain values at the top level beside them,
  and the optimizer's state either in that form or in ``optimizer.state_dict()``'s
  (keyed by parameter number); a module may be stored through its own
  ``state_dict()`` (a ``DistributedDataParallel``'s, prefixed ``module.``).

Here each plain value of ``state`` is matched to the entries the checkpoint holds
before DCP runs; the module's and the optimizers' entries are checked by the load
planner (:class:`CheckedLoadPlanner`), with DCP's own flattened names. An entry that
is not there becomes an :class:`AcceleratorKeyError` naming it, where DCP would raise
its ``CheckpointException``, a ``BaseException`` that ``except Exception`` lets through.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Final

from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException

from accel.errors import AcceleratorError, AcceleratorKeyError, AcceleratorValueError

__all__ = [
    "PLAIN",
    "CheckedLoadPlanner",
    "check_plain_loaded",
    "lift_plain_values",
    "own_forms_saved",
    "readable_failure",
]

#: The entry under which :func:`save_sharded` stores the plain values, as one object.
PLAIN: Final = "accel.plain"
_SHOWN: Final = 5  # missing entries named in a message; the count says the rest


def lift_plain_values(app_state: dict[str, Any], saved: Collection[str], path: str) -> list[str]:
    """Move each plain placeholder of ``app_state[PLAIN]`` that the checkpoint holds
    at the top level (DCP without accel) to ``app_state`` itself; return their keys.
    One stored under ``accel.plain`` (accel's layout) stays; where the plain values
    were stored as one object (torch_xla's SPMD planner does not flatten them), all
    stay, and :func:`check_plain_loaded` checks them once loaded.

    :raises AcceleratorKeyError: the checkpoint holds a plain value in neither place.
    """
    if PLAIN in saved:
        return []
    lifted = []
    for key in list(app_state[PLAIN]):
        if _holds(saved, f"{PLAIN}.{key}"):
            continue
        if key not in app_state and _holds(saved, str(key)):
            app_state[key] = app_state[PLAIN].pop(key)
            lifted.append(key)
            continue
        raise _no_plain_entry(key, saved, path)
    return lifted


def check_plain_loaded(
    asked: Collection[str], loaded: Mapping[str, Any], saved: Collection[str], path: str
) -> None:
    """:raises AcceleratorKeyError: a plain value asked for is not among those loaded
    (stored as one object, they replace the placeholders whole)."""
    for key in asked:
        if key not in loaded:
            raise _no_plain_entry(key, saved, path)


def _no_plain_entry(key: str, saved: Collection[str], path: str) -> AcceleratorKeyError:
    return AcceleratorKeyError(
        f"load_sharded: the checkpoint at {path!r} has no entry for state[{key!r}] "
        f"(neither {f'{PLAIN}.{key}'!r}, where save_sharded stores it, nor {key!r}, "
        f"where torch.distributed.checkpoint.save does); it holds entries for "
        f"{_holdings(saved)}: drop {key!r} from state, or load a checkpoint that has it"
    )


def own_forms_saved(
    app_state: dict[str, Any], objects: Mapping[str, Any], saved: Collection[str]
) -> list[str]:
    """For each key of ``objects`` (the module, the optimizers) whose entries the
    checkpoint lacks in :mod:`~torch.distributed.checkpoint.state_dict`'s form but
    holds in the object's own ``state_dict()`` form (an optimizer's state by parameter
    number, a wrapped module's prefixed names), put that form in ``app_state``; return
    those keys: their objects load it with their own ``load_state_dict``."""
    chosen = []
    for key, value in objects.items():
        if _missing({key: app_state[key]}, saved):
            own = value.state_dict()
            if not _missing({key: own}, saved):
                app_state[key] = own
                chosen.append(key)
    return chosen


class CheckedLoadPlanner:
    """Mixed into a DCP load planner: where DCP cannot plan the load because entries
    are missing (its ``RuntimeError``, inside the ``CheckpointException`` it raises),
    raise :class:`AcceleratorKeyError` naming them and the keys of ``state`` they
    belong to. The entries are DCP's own flattened names (``self.mappings``), checked
    after DCP has picked the naming of the checkpoint's torch version."""

    mappings: Any
    metadata: Any

    def create_local_plan(self) -> Any:
        try:
            return super().create_local_plan()  # type: ignore[misc]
        except Exception as error:
            saved = self.metadata.state_dict_metadata
            missing = [name for name in self.mappings if name not in saved]
            if not missing:
                raise
            raise _missing_entries(missing, self.mappings, saved) from error


def readable_failure(exception: CheckpointException, path: str | os.PathLike[str]) -> Exception:
    """What :func:`load_sharded` raises for DCP's ``exception``: accel's own error where a
    rank raised one (a missing entry), else an :class:`AcceleratorValueError` carrying
    the first rank's failure (a tensor of another shape, an unreadable file)."""
    failures = [failure[0] for _, failure in sorted(exception.failures.items())]
    for failure in failures:
        if isinstance(failure, AcceleratorError):
            return failure
    first = failures[0] if failures else exception
    return AcceleratorValueError(
        f"load_sharded: DCP could not read the checkpoint at {os.fspath(path)!r} into "
        f"state: {type(first).__name__}: {first}; load it into the objects it was saved "
        f"from (the same shapes and names)"
    )


def _missing(entries: dict[str, Any], saved: Collection[str]) -> bool:
    flat, _ = flatten_state_dict(entries)
    return any(name not in saved for name in flat)


def _missing_entries(
    missing: list[str], mappings: Mapping[str, tuple[Any, ...]], saved: Collection[str]
) -> AcceleratorKeyError:
    owners: dict[str, list[str]] = {}
    for name in missing:
        owners.setdefault(_state_key(mappings[name]), []).append(name)
    key, names = next(iter(owners.items()))
    total = sum(1 for path in mappings.values() if _state_key(path) == key)
    shown = ", ".join(map(repr, names[:_SHOWN])) + (", ..." if len(names) > _SHOWN else "")
    rest = list(owners)[1:]
    others = f" (and entries of {', '.join(map(repr, rest))})" if rest else ""
    return AcceleratorKeyError(
        f"load_sharded: the checkpoint lacks {len(names)} of its {total} entries for "
        f"state[{key!r}]: {shown}{others}; it holds entries for {_holdings(saved)}: load "
        f"it into the objects it was saved from (the same modules, the same parameter names)"
    )


def _state_key(path: tuple[Any, ...]) -> str:
    """The key of ``state`` that DCP's flattened ``path`` belongs to."""
    return str(path[1] if path[0] == PLAIN and len(path) > 1 else path[0])


def _holds(saved: Collection[str], name: str) -> bool:
    prefix = f"{name}."
    return name in saved or any(entry.startswith(prefix) for entry in saved)


def _holdings(saved: Collection[str]) -> str:
    """The keys of a ``state`` the checkpoint has entries for, in either layout."""
    return ", ".join(map(repr, sorted(set(_top_level(saved))))) or "nothing"


def _top_level(saved: Collection[str]) -> Iterator[str]:
    for entry in saved:
        if entry == PLAIN:
            yield PLAIN  # the plain values as one object
        elif entry.startswith(f"{PLAIN}."):
            yield entry[len(PLAIN) + 1 :].split(".", 1)[0]
        else:
            yield entry.split(".", 1)[0]
