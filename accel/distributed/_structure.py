"""What tensor parallelism and FSDP2 change in a model besides its slots, put back when
they fail.

``parallelize_module`` registers forward hooks on the modules of its plan;
``fully_shard`` also gives each module it shards a class of its own, registers its
state under the module (in the module's ``__dict__`` and in torch's table of
composable states) and state-dict hooks. A capture of slots
(:class:`~accel.tying._capture.RestorePoint`) cannot undo those, and a model half
sharded that way refuses the next ``fully_shard``. :class:`ModuleStructure` keeps each
module's class and the contents of its instance dictionary (references, never copies
of tensors); :meth:`ModuleStructure.restore` puts them back.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from torch import nn
from torch.distributed import _composable_state

__all__ = ["ModuleStructure", "changed_in_place"]

# Restored by the capture of slots, object for object; left to it here.
_SLOTS = frozenset({"_parameters", "_buffers", "_modules"})


class ModuleStructure:
    """Every module's class and instance dictionary at one moment; dictionaries in it
    (the hook tables) are copied one level deep, so hooks registered since are dropped."""

    __slots__ = ("_saved", "_stated")

    def __init__(self, model: nn.Module) -> None:
        self._saved = [
            (module, type(module), _copied(module.__dict__)) for module in model.modules()
        ]
        states = _composable_states()
        #: The modules that had a composable state already: theirs stay.
        self._stated = {id(module) for module, _, _ in self._saved if module in states}

    def restore(self) -> None:
        """Put every module's class, attributes and hook tables back; forget the
        composable states (FSDP2's) registered for modules since."""
        for module, cls, saved in self._saved:
            if type(module) is not cls:
                module.__class__ = cls
            live = module.__dict__
            for name in [name for name in live if name not in saved]:
                del live[name]
            for name, value in saved.items():
                if name in _SLOTS:
                    continue
                if isinstance(value, _Contents):
                    live[name] = value.put_back()  # the same table, its entries of before
                else:
                    live[name] = value
        states = _composable_states()
        for module, _, _ in self._saved:
            if id(module) not in self._stated:
                states.pop(module, None)


class _Contents:
    """A dictionary of a module and what it held: restored into the same object, which
    hook handles refer to."""

    __slots__ = ("held", "table")

    def __init__(self, table: dict[Any, Any]) -> None:
        self.table = table
        self.held = dict(table)

    def put_back(self) -> dict[Any, Any]:
        table, held = self.table, self.held
        # Compared with `is` (hooks and tensors have no useful ==): unchanged, untouched.
        if len(table) != len(held) or any(table.get(k, self) is not v for k, v in held.items()):
            table.clear()
            table.update(held)
        return table


def _copied(attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        name: _Contents(value) if isinstance(value, dict) and name not in _SLOTS else value
        for name, value in attributes.items()
    }


def _composable_states() -> MutableMapping[nn.Module, Any]:
    """torch's table of composable states, which ``fully_shard`` fills and refuses to
    fill twice for one module (private, hence read defensively: empty if it moved)."""
    table = getattr(_composable_state, "_module_state_mapping", None)
    return {} if table is None else table


def changed_in_place(unrestored: list[str]) -> str:
    """The end of a failed split's note: the tensors whose values were changed in place
    (which a restore cannot put back), if any."""
    if not unrestored:
        return ""
    return f"; these kept values written in place since: {', '.join(unrestored)}"
