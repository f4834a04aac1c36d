"""Finding, restoring and checking tied (shared) parameters and buffers.

A tie is one tensor object in several ``(module, name)`` slots, such as an embedding
weight reused by the output layer. A move to or from XLA, ``meta`` or a PrivateUse1
device gives every slot a Parameter of its own (torch's ``Module._apply``). This module
remembers the ties before such a move and puts back exactly those; it knows nothing
about plugins or devices:

>>> snapshot = TyingSnapshot.capture(model)         # doctest: +SKIP
>>> model = model.to(xla_device)                    # doctest: +SKIP
>>> snapshot.finish_move(model).ok                  # doctest: +SKIP
True

:meth:`TyingSnapshot.finish_move` re-ties, lets the model's own ``tie_weights()``
run, and undoes it if it changed which tensors are tied; the :class:`TieReport` it
returns names the groups that came apart and the groups that appeared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, cast

import torch
from torch import nn

from accel.tying._capture import (
    ModuleSlots,
    Path,
    SlotContents,
    counterparts,
    live_slots,
    qualified_name,
)

__all__ = [
    "TieReport",
    "TiedGroup",
    "TyingSnapshot",
    "count_unique_parameters",
    "find_tied_parameters",
    "retie",
]

SlotKind = Literal["parameter", "buffer"]


@dataclass(frozen=True)
class TiedGroup:
    """Slots that held one and the same tensor object when the group was found."""

    #: ``"parameter"`` if any slot is a parameter slot, else ``"buffer"``.
    kind: SlotKind
    #: Qualified names of the slots, in module order, e.g. ``("embed.weight", "head.weight")``.
    names: tuple[str, ...]
    #: The ``(module, attribute, slot kind)`` triples behind :attr:`names`. A tensor
    #: registered both as a parameter and as a buffer has slots of both kinds.
    slots: tuple[tuple[nn.Module, str, SlotKind], ...] = field(repr=False, compare=False)

    def tensors(self) -> list[torch.Tensor | None]:
        """The tensors now in each slot."""
        return [_slot_dict(module, kind).get(name) for module, name, kind in self.slots]

    def is_tied(self) -> bool:
        """Whether every slot holds the same object again (compared with ``is``)."""
        first, *rest = self.tensors()
        return first is not None and all(t is first for t in rest)

    def source_slot(self) -> tuple[nn.Module, str, SlotKind]:
        """The slot whose tensor :func:`retie` shares: the first parameter slot, so
        a tensor that is also a buffer stays a Parameter, else the first slot."""
        return next((slot for slot in self.slots if slot[2] == "parameter"), self.slots[0])


def _slot_dict(module: nn.Module, kind: SlotKind) -> dict[str, torch.Tensor | None]:
    # The modules' own registries: reading them directly skips the per-call
    # overhead of named_parameters() and sees every slot, duplicates included.
    return module._parameters if kind == "parameter" else module._buffers  # type: ignore[return-value]


def find_tied_parameters(model: nn.Module, *, buffers: bool = True) -> list[TiedGroup]:
    """Return every group of slots sharing one tensor, parameter groups first.

    A submodule registered under two names is visited once: its parameters live in
    one slot, which any move keeps, so it is not a tie.
    """
    return _scan(model, buffers)[0]


# A slot during the scan: (module, attribute, kind, path of the module).
_Slot = tuple["nn.Module", str, SlotKind, Path]


def _scan(model: nn.Module, buffers: bool) -> tuple[list[TiedGroup], int]:
    """One pass over the model's live slots: its tied groups and its unique parameter count."""
    return _scan_entries(live_slots(model), buffers)


def _scan_entries(entries: Iterable[ModuleSlots], buffers: bool) -> tuple[list[TiedGroup], int]:
    """The tied groups and unique parameter count of the modules' slots in ``entries``.

    Per slot it does one dict operation; qualified names are built only for slots
    that turn out to be tied.
    """
    # tensor id -> its one slot; once seen in a second slot, the list of its slots.
    # The list replaces the slot under the same key, so the groups keep the order in
    # which their tensors were first seen; most tensors never need a list.
    slots_by_tensor: dict[int, _Slot | list[_Slot]] = {}
    remember = slots_by_tensor.setdefault

    # Two loops written out, not a helper per registry: a call per module, or a tuple
    # of registries built per module, is a large share of a scan's cost.
    parameter_count = 0  # tensors first seen in a parameter slot (buffers: see below)
    tied = False
    for module, path, parameters, module_buffers, _ in entries:
        if parameters:
            for name, tensor in parameters.items():
                if tensor is not None:
                    slot: _Slot = (module, name, "parameter", path)
                    seen = remember(id(tensor), slot)
                    if seen is slot:
                        parameter_count += 1
                    elif type(seen) is list:
                        seen.append(slot)
                    else:
                        slots_by_tensor[id(tensor)] = [seen, slot]  # type: ignore[list-item]
                        tied = True
        if buffers and module_buffers:
            for name, tensor in module_buffers.items():
                if tensor is not None:
                    slot = (module, name, "buffer", path)
                    seen = remember(id(tensor), slot)
                    if type(seen) is list:
                        seen.append(slot)
                    elif seen is not slot:
                        slots_by_tensor[id(tensor)] = [seen, slot]  # type: ignore[list-item]
                        tied = True
    groups = []
    for found in slots_by_tensor.values() if tied else ():
        if type(found) is not list:
            continue
        is_parameter = any(slot[2] == "parameter" for slot in found)
        # A parameter first seen in a buffer slot (rare) was not counted above.
        parameter_count += is_parameter and found[0][2] == "buffer"
        groups.append(
            TiedGroup(
                "parameter" if is_parameter else "buffer",
                tuple(qualified_name(path, name) for _, name, _, path in found),
                tuple((module, name, kind) for module, name, kind, _ in found),
            )
        )
    groups.sort(key=lambda group: group.kind != "parameter")
    return groups, parameter_count


def retie(groups: list[TiedGroup]) -> None:
    """Put each group's source tensor (see :meth:`TiedGroup.source_slot`) into every
    other slot of the group."""
    _fill_duplicate_slots(groups, empty=False)


def empty_duplicate_slots(groups: list[TiedGroup]) -> None:
    """Set every slot of each group to ``None`` except its source slot.

    Done just before a move that unties, so each shared tensor crosses to the
    device once instead of once per slot; :func:`retie` afterwards fills the
    emptied slots with the source slot's moved tensor. ``None`` (rather than
    deleting the key) keeps every module's parameter order.
    """
    _fill_duplicate_slots(groups, empty=True)


def _fill_duplicate_slots(groups: list[TiedGroup], *, empty: bool) -> None:
    """Put ``None`` (``empty``) or the source slot's tensor into each group's other slots."""
    for group in groups:
        source_module, source_name, source_kind = source = group.source_slot()
        shared = None if empty else _slot_dict(source_module, source_kind)[source_name]
        for slot in group.slots:
            if slot is not source:  # the source keeps its tensor
                _slot_dict(slot[0], slot[2])[slot[1]] = shared


def count_unique_parameters(model: nn.Module) -> int:
    """The number of distinct Parameter objects in ``model`` (its "layer count")."""
    # Not the scan's count: the scan names every tied slot, which makes it 1.4x (GPT-2)
    # to 3.7x (ALBERT) slower for a count alone.
    return len(
        {
            id(parameter)
            for _, _, parameters, _, _ in live_slots(model)
            for parameter in parameters.values()
            if parameter is not None
        }
    )


@dataclass(frozen=True)
class TieReport:
    """How a model's ties compare with a :class:`TyingSnapshot` (see its ``check``)."""

    count_before: int
    count_after: int
    #: Remembered groups whose slots no longer hold one object.
    broken: tuple[TiedGroup, ...]
    #: Groups of slots that hold one object now but held different objects in the
    #: snapshot: a tie the model did not have. Names are the whole group as it is now.
    appeared: tuple[TiedGroup, ...] = ()
    #: Whether the model's ``tie_weights()`` ran (see :meth:`TyingSnapshot.finish_move`).
    tie_weights_called: bool = False
    #: Whether what ``tie_weights()`` changed was undone, because it changed the ties.
    tie_weights_undone: bool = False
    #: Whether the model, once :meth:`TyingSnapshot.finish_move` is done, has exactly
    #: the snapshot's ties and unique parameter count again (true when :attr:`ok`, and
    #: when undoing what ``tie_weights()`` changed brought the model back).
    kept_as_before: bool = False

    @property
    def ok(self) -> bool:
        """The same ties as in the snapshot, and the same number of unique parameters."""
        return not self.broken and not self.appeared and self.count_before == self.count_after


@dataclass(frozen=True)
class TyingSnapshot:
    """The tied groups and unique parameter count of a model, taken before a move."""

    groups: tuple[TiedGroup, ...]
    parameter_count: int

    @classmethod
    def capture(cls, model: nn.Module) -> TyingSnapshot:
        groups, parameter_count = _scan(model, buffers=True)
        return cls(tuple(groups), parameter_count)

    @classmethod
    def _of_slots(cls, slots: SlotContents) -> TyingSnapshot:
        """The snapshot of the model whose slots ``slots`` captured (no second walk)."""
        groups, parameter_count = _scan_entries(slots.modules(), buffers=True)
        return cls(tuple(groups), parameter_count)

    def retie(self) -> None:
        """Re-tie every remembered group (see :func:`retie`)."""
        retie(list(self.groups))

    def check(self, model: nn.Module) -> TieReport:
        """Compare the ties ``model`` has now with the snapshot's.

        A remembered group is *broken* when its slots no longer hold one object; a
        group has *appeared* when slots that held different objects in the snapshot
        now share one. One pass over the model, plus one over the snapshot's slots.
        """
        groups_now, count_now = _scan(model, buffers=True)
        broken = tuple(group for group in self.groups if not group.is_tied())
        # Slots are matched by module identity and attribute, not by name: a module
        # registered under two paths is one module.
        owner = {
            (id(module), name, kind): index
            for index, group in enumerate(self.groups)
            for module, name, kind in group.slots
        }
        appeared = []
        for group in groups_now:
            # A slot in no remembered group held a tensor of its own: key it apart.
            owners = {
                owner.get((id(module), name, kind), ~position)
                for position, (module, name, kind) in enumerate(group.slots)
            }
            if len(owners) > 1:
                appeared.append(group)
        return TieReport(self.parameter_count, count_now, broken, tuple(appeared))

    def finish_move(self, model: nn.Module) -> TieReport:
        """After the move: re-tie, let the model re-tie itself, keep the snapshot's ties.

        1. Re-tie every remembered group (the slots' contents are then the truth:
           the moved tensors, with the values they had before the move).
        2. Call the model's own ``tie_weights()``, if it has one, as Hugging Face
           models expect.
        3. Compare with the snapshot. If ``tie_weights()`` left ties that differ (a
           group came apart, or slots that were separate now share one tensor, as
           when a checkpoint saved untied is loaded with a config that ties), every
           slot gets back the object it held after step 1, so a move never changes
           which tensors are tied nor any value.

        Returns the report of step 3, before any undoing: what ``tie_weights()``
        would have made of the model.
        """
        return cast(TieReport, self._finished(model, exact=False))  # compared: not exact

    def _finished(self, model: nn.Module, *, exact: bool) -> TieReport | None:
        """:meth:`finish_move`; ``None`` without comparing where the ties are those of
        the snapshot by construction: ``exact`` (torch's own move of the hollowed-out
        model, which gives each remaining slot a tensor of its own) and no slot changed
        by ``tie_weights()``."""
        self.retie()
        tie_weights = getattr(model, "tie_weights", None)
        after_retie = None  # the slots tie_weights() found, where the model has one
        if callable(tie_weights):
            after_retie = SlotContents(model)
            tie_weights()
        if exact and (after_retie is None or not after_retie.restore(only_look=True)):
            return None
        report = replace(self.check(model), tie_weights_called=after_retie is not None)
        if report.ok or after_retie is None:
            return replace(report, kept_as_before=report.ok)
        undone = after_retie.restore()
        # Checked again, not assumed: tie_weights() may have done what slots cannot undo.
        kept = undone and self.check(model).ok
        return replace(report, tie_weights_undone=undone, kept_as_before=kept)

    @classmethod
    def keep_through(
        cls,
        model: nn.Module,
        before: SlotContents,
        move: Callable[[], tuple[nn.Module, str]],
        keeper: TieKeeper,
        *,
        hollow: bool,
        retie: bool = True,
    ) -> nn.Module:
        """A transformation of ``model`` with the ties of ``before`` kept; returns what
        ``move`` returned.

        1. The groups of ``before`` (the transformation's one capture); with ``hollow``,
           each group's duplicate slots emptied, so each shared tensor crosses once
           (only where torch's own ``Module._apply`` moves the model).
        2. ``move()`` transforms the model, returning the result and who moved it (a
           plugin's name, ``""`` for torch); a module returned in the model's place is
           re-tied on its counterparts' slots (:func:`counterparts`).
        3. :meth:`finish_move`, reported to ``keeper.moved``, unless the ties are those
           of before by construction (:meth:`_finished`). Without ``retie``, only
           checked (FSDP2 sets its own parameters into its slots at every step).
        4. ``keeper.settle(moved)`` (the post-move hooks, a materialize's fill), then
           the check, reported to ``keeper.settled``: one check, unless something but
           torch's own ``_apply`` moved the model or ``tie_weights()`` changed a slot
           (then step 3 compares too, so each is told apart).
        """
        snapshot, settle = cls._of_slots(before), keeper.settle
        if hollow:
            empty_duplicate_slots(list(snapshot.groups))
        moved, mover = move()
        if isinstance(moved, torch.jit.ScriptModule):
            if settle is not None:
                settle(moved)  # TorchScript holds its slots itself: none to read or re-tie
            return moved
        if moved is not model:
            snapshot = snapshot._rebased(before, counterparts(before, moved))
        # With nothing to settle, the check after the move is the one check.
        exact = hollow and moved is model and settle is not None
        report = snapshot._finished(moved, exact=exact) if retie else snapshot.check(moved)
        if report is not None:
            keeper.moved(snapshot, moved, report, mover)
        if settle is not None:
            settle(moved)
            keeper.settled(snapshot, moved, snapshot.check(moved))
        return moved

    def _rebased(self, before: SlotContents, found: dict[int, nn.Module]) -> TyingSnapshot:
        """The groups pointing at the slots of the module that replaced the captured
        one (``found``: see :func:`counterparts`). A slot whose module has no
        counterpart holds nothing, so its group reports broken. The captured model's
        modules the replacement does not hold get back what was hollowed out for the
        move: the model the caller passed stays as it was."""
        held = before.tensors()
        missing = nn.Module()  # stands for a module the replacement lacks
        # Slots that stay empty whatever re-tying puts in them: such a group stays broken.
        missing.__dict__["_parameters"] = missing.__dict__["_buffers"] = _AlwaysEmpty()
        groups = []
        for group in self.groups:
            slots = []
            for module, name, kind in group.slots:
                now = found.get(id(module), missing)
                if now is not module:
                    _slot_dict(module, kind)[name] = held[(id(module), name, kind)]
                slots.append((now, name, kind))
            groups.append(replace(group, slots=tuple(slots)))
        return replace(self, groups=tuple(groups))


class TieKeeper(Protocol):
    """What :meth:`TyingSnapshot.keep_through` reports to (:class:`accel.tying._keeping.Keeper`:
    warn, raise or put back, by ``tie_check``), and what it settles with."""

    @property
    def settle(self) -> Callable[[nn.Module], object] | None: ...

    def moved(
        self, snapshot: TyingSnapshot, moved: nn.Module, report: TieReport, mover: str
    ) -> None: ...

    def settled(self, snapshot: TyingSnapshot, moved: nn.Module, report: TieReport) -> None: ...


class _AlwaysEmpty(dict[str, "torch.Tensor | None"]):
    """A module's slot registry that holds nothing, whatever is put in it."""

    def __setitem__(self, key: str, value: torch.Tensor | None) -> None:
        pass
