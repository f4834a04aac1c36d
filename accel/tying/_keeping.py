"""Tie keeping: the work around a move that unties, written once.

Applied by the handle on every move that enters or leaves the device type of an
accelerator whose spec declares ``unties_weights=True`` (the built-in ``tpu`` does,
and so does every PrivateUse1 backend's plugin that says so), and by the TPU
plugin's cross-cutting tie guard on other moves that untie (a model leaving XLA, a
move to ``meta``, torch's overwrite mode). Whichever begins a move first keeps it,
once: the snapshot lives in the move's ``context.notes``.

The tying logic itself is :mod:`accel.tying` (no plugin machinery); this module adds
what a move needs around it: hollowing out the duplicate slots, and the outcome by
``tie_check``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Final, Literal

import torch
from torch import nn

from accel._util.walk import each_module
from accel._util.warn import warn_at_caller
from accel.errors import TyingWarning, WeightTyingError
from accel.tying import TieReport, TyingSnapshot, empty_duplicate_slots, format_tie_failure
from accel.tying._slots import SlotContents

if TYPE_CHECKING:
    from accel.types import MoveContext, TieCheck

__all__ = [
    "MOVED_BY_NOTE",
    "begin_kept_move",
    "finish_kept_move",
    "holds_a_tensor_on",
    "outcome",
]

_NOTES_KEY: Final = "accel.tie_keeping"
#: The key in a move's ``context.notes`` under which the hook caller names who
#: answered ``model_to_device``, so that a tying error can name that plugin.
MOVED_BY_NOTE: Final = "accel.moved_by"


def holds_a_tensor_on(model: nn.Module, device_types: Collection[str]) -> bool:
    """Whether a parameter or buffer of ``model`` is on one of ``device_types`` (a walk
    of the model: callers ask only when such a device type is in use)."""
    return any(
        tensor is not None and tensor.device.type in device_types
        for module in each_module(model)
        for slots in (module._parameters, module._buffers)
        for tensor in slots.values()
    )


def begin_kept_move(model: nn.Module, context: MoveContext) -> None:
    """Before the move: remember the ties, then hollow out the duplicate slots.

    Does nothing if this move is already kept (the guard and the handle both see
    ``tpu`` moves).
    """
    if _NOTES_KEY in context.notes:
        return
    snapshot = TyingSnapshot.capture(model)
    # References to every slot's tensor (no copies), to take a tie apart that a
    # plugin's move makes (see _separate_appeared).
    context.notes[_NOTES_KEY] = (snapshot, SlotContents(model))
    # Each shared tensor then crosses to the device once, not once per slot: on a
    # GPT-2-sized model that is the difference between matching a bare move and
    # copying the embedding twice. A failed move restores the slots.
    empty_duplicate_slots(list(snapshot.groups))


def finish_kept_move(model: nn.Module, device: torch.device, context: MoveContext) -> None:
    """After the move: re-tie, run the model's ``tie_weights()``, keep the ties the
    model had before the move, and report by ``context.tie_check`` (see :func:`outcome`).
    A :class:`TyingWarning` points at the user's line, however deep the call.
    """
    kept: tuple[TyingSnapshot, SlotContents] | None = context.notes.pop(_NOTES_KEY, None)
    if kept is None:
        return  # not a kept move, or already finished
    snapshot, before = kept
    report = snapshot.finish_move(model)
    what = outcome(report, context.tie_check)
    if what != "error" and not report.kept_as_before:
        # The move goes ahead: with the ties of before, whatever made the new ones (a
        # plugin's move tying slots re-tying cannot separate), and with their values.
        report = replace(report, kept_as_before=_separate_appeared(model, snapshot, before))
    if what == "ok":
        return
    if what == "warn":
        message = _blaming(format_tie_failure(report, device, raised=False), report, context)
        warn_at_caller(message, TyingWarning)
        return
    raise WeightTyingError(
        _blaming(format_tie_failure(report, device), report, context),
        count_before=report.count_before,
        count_after=report.count_after,
        broken_groups=[group.names for group in report.broken],
        appeared_groups=[group.names for group in report.appeared],
    )


def _blaming(message: str, report: TieReport, context: MoveContext) -> str:
    """``message`` naming the plugin whose move changed the ties, where it was a plugin's.

    Pre-move hooks ran before the snapshot (what they did is the truth), post-move hooks
    run after the check, and re-tying undoes what a move unties: what is left came from
    the model's own ``tie_weights()`` (the message says so) or from the move itself.
    """
    mover = context.notes.get(MOVED_BY_NOTE)
    if mover is None or report.tie_weights_undone:
        return message
    first, _, rest = message.partition("\n")
    return (
        f"{first}\nThe ties were changed by the model_to_device hook of {mover}, in a way "
        f"re-tying the groups of before cannot undo. Report this to the plugin's authors."
        f"\n{rest}"
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
    held = {
        (id(module), name, kind): tensor
        for module, parameters, buffers, _ in before.modules()
        for kind, slots in (("parameter", parameters), ("buffer", buffers))
        for name, tensor in slots.items()
        if tensor is not None
    }
    for group in appeared:
        shared = group.tensors()[0]
        if shared is None:
            continue
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
            slots = module._parameters if kind == "parameter" else module._buffers
            slots[name] = back  # type: ignore[assignment]
    return snapshot.check(model).ok
