"""Tie keeping: what a transformation that unties does with its ties, written once for
every device and every transformation.

A move to or from XLA, ``meta`` or any PrivateUse1 backend (torch's rule), a module a
plugin returns in the model's place, ``materialize`` and ``parallelize_tied`` run
:meth:`Keeper.keep` inside their transaction (:func:`accel.tying._capture.transact`).
The steps are :meth:`accel.tying.TyingSnapshot.keep_through`'s (no plugin machinery);
this module adds the outcome by ``tie_check``: warn, raise, or put the ties of before
back, and the messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from accel._util.warn import warn_at_caller
from accel.errors import TyingWarning, WeightTyingError
from accel.tying import (
    TieReport,
    TyingSnapshot,
    _slot_dict,
)

if TYPE_CHECKING:
    from accel.tying._capture import SlotContents
    from accel.types import MoveContext, TieCheck

__all__ = ["Keeper", "outcome"]


@dataclass(frozen=True, slots=True)
class Keeper:
    """The ties of ``before`` (a transformation's one capture), kept through a
    transformation by :meth:`keep`, and reported by ``context.tie_check``.

    What the transformation broke or made that re-tying cannot undo is an error under
    ``"error"``, a warning under ``"warn"`` (the model then keeps the ties of before,
    with their values), nothing under ``"off"``; the same for what ``settle`` (which
    ``settler`` names) changed afterwards.
    """

    before: SlotContents
    context: MoveContext
    #: What runs once the model is re-tied: the post-move hooks, a materialize's fill.
    settle: Callable[[nn.Module], object] | None = None
    settler: str = "A post_move_hook"

    def keep(
        self, model: nn.Module, move: Callable[[], tuple[nn.Module, str]], *, hollow: bool = False
    ) -> nn.Module:
        """``move()``, a transformation that unties (or returns a module in the model's
        place), with the ties of before kept: :meth:`TyingSnapshot.keep_through`."""
        return TyingSnapshot.keep_through(model, self.before, move, self, hollow=hollow)

    def moved(
        self, snapshot: TyingSnapshot, moved: nn.Module, report: TieReport, mover: str
    ) -> None:
        """After the move and the model's ``tie_weights()``, before ``settle``.

        :param mover: the plugin whose ``model_to_device`` moved it, as messages name
            it; ``""``: torch did (accel's fallback, ``model.to``, or materialize's
            allocation).
        """
        what = outcome(report, self.context.tie_check)
        if what != "error" and not report.kept_as_before:
            # The move goes ahead: with the ties of before, whatever made the new ones (a
            # plugin's move tying slots re-tying cannot separate), and with their values.
            kept = _separate_appeared(moved, snapshot, self.before)
            report = replace(report, kept_as_before=kept)
        # Pre-move hooks ran before the snapshot (what they did is the truth), post-move
        # hooks are checked apart (settled), and re-tying undoes what a move unties:
        # what is left came from the model's own tie_weights() (the message says so) or
        # from the move itself, which a plugin's move hook did if one answered.
        blame = ""
        if mover and not report.tie_weights_undone:
            blame = (
                f"The ties were changed by the model_to_device hook of {mover}, in a way "
                f"re-tying the groups of before cannot undo. Report this to the plugin's authors."
            )
        _tell(what, report, self.context.device, blame=blame)

    def settled(self, snapshot: TyingSnapshot, moved: nn.Module, report: TieReport) -> None:
        """After ``settle`` (every ``post_move_hook``, or what the settler names): the
        ties kept are still the model's. Ties it broke or made are reported by
        ``tie_check`` like the move's, and under ``"warn"`` and ``"off"`` put back as
        they were."""
        what = outcome(report, self.context.tie_check)
        if what != "error" and not report.ok:
            snapshot.retie()
            kept = snapshot.check(moved).ok or _separate_appeared(moved, snapshot, self.before)
            report = replace(report, kept_as_before=kept)
        note = f"{self.settler} changed the ties after accel had kept them."
        _tell(what, report, self.context.device, note=note)


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
    held = before.tensors()
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


def format_tie_failure(report: TieReport, device: object, *, raised: bool = True) -> str:
    """Explain a failed :class:`TieReport`: counts, groups, what accel did, what to do.

    :param raised: the text is a :class:`~accel.WeightTyingError`'s; ``False``: a
        :class:`~accel.TyingWarning`'s, the move having gone ahead.
    """
    what = {(True, False): "tied weights came apart", (False, True): "new ties appeared"}.get(
        (bool(report.broken), bool(report.appeared)), "tied weights changed"
    )
    lines = [
        f"{what} moving the model to {device}. "
        f"Layer count: [Before: {report.count_before} After: {report.count_after}]"
    ]
    if report.broken:
        lines.append("Groups no longer tied (each was one tensor before the move):")
        lines.extend(f"  - {group.kind}s {', '.join(group.names)}" for group in report.broken)
    if report.appeared:
        lines.append("Groups newly tied (separate tensors before the move, one tensor after it):")
        lines.extend(f"  - {group.kind}s {', '.join(group.names)}" for group in report.appeared)
    if not report.broken and not report.appeared:
        lines.append(
            "Every remembered group is tied and no new tie appeared, but the model now has a "
            "different number of unique parameters: something created or dropped parameters "
            "during the move."
        )
    if report.tie_weights_undone:
        lines.append(
            "accel re-tied the groups it found before the move, then called the model's "
            "tie_weights(), which changed them; a move never changes which tensors are tied, "
            "so accel undid what tie_weights() changed."
        )
    elif report.tie_weights_called:
        lines.append(
            "accel re-tied the groups it found before the move and called the model's "
            "tie_weights(), which changed nothing."
        )
    else:
        lines.append("accel re-tied the groups it found before the move.")
    if report.appeared and report.tie_weights_called:
        lines.append(
            "A new tie usually means a checkpoint saved untied was loaded with a config that "
            "ties (such as tie_word_embeddings=True): load it with the config its weights "
            "were saved with, or tie the weights yourself before the move if you want them "
            "tied (that replaces the trained weights of the tied-to slots)."
        )
    if report.broken:
        lines.append(
            "If the model's tie_weights() unties weights on purpose, or replaces them, fix it."
        )
    if raised:
        lines.append(
            "To move anyway, keeping the ties the model had before the move, pass "
            "tie_check='warn' (or 'off') to get_accelerator()."
        )
    elif report.kept_as_before:
        lines.append(
            "The move went ahead: the model keeps the ties and values it had before the "
            "move. Pass tie_check='off' to get_accelerator() to silence this warning."
        )
    else:
        lines.append(
            "The move went ahead, but accel could not bring the model back to the ties it "
            "had before the move: it has the ties above. Pass tie_check='error' to "
            "get_accelerator() to have such a move undone instead."
        )
    return "\n".join(lines)
