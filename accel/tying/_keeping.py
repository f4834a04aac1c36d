"""Tie keeping: the work around a move that unties, written once for every device.

The move transaction (:mod:`accel._core.moving`) runs it on every move that torch's
rule says unties: to or from XLA, ``meta`` or any PrivateUse1 backend. The tying
logic itself is :mod:`accel.tying` (no plugin machinery); this module adds what a
move needs around it: hollowing out the duplicate slots, finishing the ties on the
module the move returned, and the outcome by ``tie_check``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from accel._util.warn import warn_at_caller
from accel.errors import TyingWarning, WeightTyingError
from accel.tying import (
    TieReport,
    TyingSnapshot,
    _slot_dict,
    empty_duplicate_slots,
    format_tie_failure,
)
from accel.tying._capture import SlotContents, counterparts

if TYPE_CHECKING:
    from accel.types import MoveContext, TieCheck

__all__ = ["KeptMove", "outcome"]


class KeptMove:
    """The ties of one move that unties: remembered from the move's capture, then
    kept on the module the move returns."""

    __slots__ = ("_before", "_snapshot")

    def __init__(self, before: SlotContents, *, hollow: bool) -> None:
        """Before the move (after every ``pre_move_hook``): the tie groups, derived from
        ``before``, the move's one capture.

        :param hollow: empty the duplicate slots, so each shared tensor crosses to the
            device once, not once per slot (on a GPT-2-sized model, the difference
            between matching a bare move and copying the embedding twice). Only where
            torch's ``Module.to`` moves the model: a plugin's own move must see it whole.
            A failed move restores the slots.
        """
        self._before = before
        #: The groups, on the module the move returned once :meth:`finish` ran.
        self._snapshot = TyingSnapshot._of_slots(before)
        if hollow:
            empty_duplicate_slots(list(self._snapshot.groups))

    def finish(
        self,
        model: nn.Module,
        moved: nn.Module,
        device: torch.device,
        context: MoveContext,
        mover: str,
    ) -> None:
        """After the move: re-tie ``moved`` (``model`` itself, or the module a plugin
        returned in its place), run its ``tie_weights()``, keep the ties of before, and
        report by ``context.tie_check`` (see :func:`outcome`).

        :param mover: the plugin whose ``model_to_device`` moved it, as messages name
            it; ``""``: accel's fallback (torch's ``model.to``) did.
        """
        if moved is not model:
            self._snapshot = self._rebased(counterparts(self._before, moved))
        report = self._snapshot.finish_move(moved)
        what = outcome(report, context.tie_check)
        if what != "error" and not report.kept_as_before:
            # The move goes ahead: with the ties of before, whatever made the new ones (a
            # plugin's move tying slots re-tying cannot separate), and with their values.
            kept = _separate_appeared(moved, self._snapshot, self._before)
            report = replace(report, kept_as_before=kept)
        # Pre-move hooks ran before the snapshot (what they did is the truth), post-move
        # hooks are checked apart (still_held), and re-tying undoes what a move unties:
        # what is left came from the model's own tie_weights() (the message says so) or
        # from the move itself, which a plugin's move hook did if one answered.
        blame = ""
        if mover and not report.tie_weights_undone:
            blame = (
                f"The ties were changed by the model_to_device hook of {mover}, in a way "
                f"re-tying the groups of before cannot undo. Report this to the plugin's authors."
            )
        _tell(what, report, device, blame=blame)

    def _rebased(self, found: dict[int, nn.Module]) -> TyingSnapshot:
        """The groups pointing at the slots of the module that replaced the captured
        one (``found``: see :func:`counterparts`). A slot whose module has no
        counterpart holds nothing, so its group reports broken. The captured model's
        modules the replacement does not hold get back what was hollowed out for the
        move: the model the caller passed stays as it was."""
        held = _captured_tensors(self._before)
        missing = nn.Module()  # stands for a module the replacement lacks
        # Slots that stay empty whatever re-tying puts in them: such a group stays broken.
        missing.__dict__["_parameters"] = missing.__dict__["_buffers"] = _AlwaysEmpty()
        groups = []
        for group in self._snapshot.groups:
            slots = []
            for module, name, kind in group.slots:
                now = found.get(id(module), missing)
                if now is not module:
                    _slot_dict(module, kind)[name] = held[(id(module), name, kind)]
                slots.append((now, name, kind))
            groups.append(replace(group, slots=tuple(slots)))
        return replace(self._snapshot, groups=tuple(groups))

    def still_held(
        self,
        moved: nn.Module,
        device: torch.device,
        context: MoveContext,
        changer: str = "A post_move_hook",
    ) -> None:
        """After every ``post_move_hook`` (or what ``changer`` names): the ties kept are
        still the model's. Ties it broke or made are reported by ``context.tie_check``
        like the move's, and under ``"warn"`` and ``"off"`` put back as they were."""
        report = self._snapshot.check(moved)
        what = outcome(report, context.tie_check)
        if what != "error" and not report.ok:
            self._snapshot.retie()
            kept = self._snapshot.check(moved).ok or _separate_appeared(
                moved, self._snapshot, self._before
            )
            report = replace(report, kept_as_before=kept)
        _tell(what, report, device, note=f"{changer} changed the ties after accel had kept them.")


def _captured_tensors(before: SlotContents) -> dict[tuple[int, str, str], torch.Tensor]:
    """``(id(module), attribute, slot kind)`` -> the tensor in that slot in ``before``."""
    return {
        (id(module), name, kind): tensor
        for module, _, parameters, buffers, _ in before.modules()
        for kind, slots in (("parameter", parameters), ("buffer", buffers))
        for name, tensor in slots.items()
        if tensor is not None
    }


def _tell(
    what: Literal["ok", "warn", "error"],
    report: TieReport,
    device: torch.device,
    *,
    blame: str = "",
    note: str = "",
) -> None:
    """Warn or raise as ``what`` says, with :func:`format_tie_failure`'s text, ``blame``
    (the plugin whose move changed the ties) after its first line and ``note`` at its
    end. A :class:`TyingWarning` points at the user's line, however deep the call."""
    if what == "ok":
        return
    first, _, rest = format_tie_failure(report, device, raised=what == "error").partition("\n")
    message = "\n".join(part for part in (first, blame, rest, note) if part)
    if what == "warn":
        warn_at_caller(message, TyingWarning)
        return
    raise WeightTyingError(
        message,
        count_before=report.count_before,
        count_after=report.count_after,
        broken_groups=[group.names for group in report.broken],
        appeared_groups=[group.names for group in report.appeared],
    )


class _AlwaysEmpty(dict[str, "torch.Tensor | None"]):
    """A module's slot registry that holds nothing, whatever is put in it."""

    def __setitem__(self, key: str, value: torch.Tensor | None) -> None:
        pass


def outcome(report: TieReport, tie_check: TieCheck) -> Literal["ok", "warn", "error"]:
    """What a kept move does with ``report``.

    Ties that appeared (the model's ``tie_weights()`` tying slots that held separate
    tensors, as a checkpoint saved untied and loaded with a config that ties does),
    which accel undid so the model is exactly as before: a warning, under every mode
    but ``"off"``, as transformers itself only warns and keeps the weights untied.
    Anything else that differs, a group come apart included: an error under
    ``"error"``, a warning under ``"warn"``.
    """
    if report.ok or tie_check == "off":
        return "ok"
    if report.appeared and not report.broken and report.kept_as_before:
        return "warn"
    return "warn" if tie_check == "warn" else "error"


def _separate_appeared(model: nn.Module, snapshot: TyingSnapshot, before: SlotContents) -> bool:
    """Give the slots of every tie that appeared the tensors they held before the move
    (``before``), on the device the move put them on, shared as they were shared then;
    return whether the model then has exactly the snapshot's ties.

    A tensor on that device already (moved in place) goes back itself; one the move
    left behind (it built new tensors, as to XLA) comes back as a copy on the device,
    with the values it has kept.
    """
    appeared = snapshot.check(model).appeared
    if not appeared:
        return False  # what differs is no new tie (reported as it is)
    held = _captured_tensors(before)
    for group in appeared:
        shared = group.tensors()[0]
        assert shared is not None  # found in the live slots just now; groups are disjoint
        again: dict[int, torch.Tensor] = {}  # id(tensor before) -> what goes back
        for module, name, kind in group.slots:
            original = held.get((id(module), name, kind))
            if original is None:
                continue  # a slot the move added: nothing to give back
            back = again.get(id(original))
            if back is None:
                back = original
                if original.device != shared.device:
                    with torch.no_grad():
                        back = original.detach().to(shared.device, copy=True)
                    if isinstance(original, nn.Parameter):
                        back = nn.Parameter(back, requires_grad=original.requires_grad)
                again[id(original)] = back
            _slot_dict(module, kind)[name] = back
    return snapshot.check(model).ok
