"""Tie keeping: the work around a move that unties, written once.

Applied by the handle on every move to an accelerator whose spec declares
``unties_weights=True`` (the built-in ``tpu`` does, and so may any vendor's), and
by the TPU plugin's cross-cutting tie guard on other moves that untie (a model
leaving XLA, a move to ``meta``, torch's overwrite mode). Whichever begins a move
first keeps it, once: the snapshot lives in the move's ``context.notes``.

The tying logic itself is :mod:`accel.tying` (no plugin machinery); this module adds
what a move needs around it: hollowing out the duplicate slots, and the outcome by
``tie_check``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Final, Literal

from accel.errors import TyingWarning, WeightTyingError
from accel.tying import TieReport, TyingSnapshot, empty_duplicate_slots, format_tie_failure

if TYPE_CHECKING:
    import torch
    from torch import nn

    from accel.types import MoveContext, TieCheck

__all__ = ["begin_kept_move", "finish_kept_move", "outcome"]

_NOTES_KEY: Final = "accel.tie_keeping"


def begin_kept_move(model: nn.Module, context: MoveContext) -> None:
    """Before the move: remember the ties, then hollow out the duplicate slots.

    Does nothing if this move is already kept (the guard and the handle both see
    ``tpu`` moves).
    """
    if _NOTES_KEY in context.notes:
        return
    snapshot = TyingSnapshot.capture(model)
    context.notes[_NOTES_KEY] = snapshot
    # Each shared tensor then crosses to the device once, not once per slot: on a
    # GPT-2-sized model that is the difference between matching a bare move and
    # copying the embedding twice. A failed move restores the slots.
    empty_duplicate_slots(list(snapshot.groups))


def finish_kept_move(
    model: nn.Module, device: torch.device, context: MoveContext, *, stacklevel: int = 3
) -> None:
    """After the move: re-tie, run the model's ``tie_weights()``, keep the ties the
    model had before the move, and report by ``context.tie_check`` (see :func:`outcome`).

    :param stacklevel: of a :class:`TyingWarning`, passed to :func:`warnings.warn`
        (1 is this function).
    """
    snapshot: TyingSnapshot | None = context.notes.pop(_NOTES_KEY, None)
    if snapshot is None:
        return  # not a kept move, or already finished
    report = snapshot.finish_move(model)
    what = outcome(report, context.tie_check)
    if what == "ok":
        return
    if what == "warn":
        message = format_tie_failure(report, device, raised=False)
        warnings.warn(message, TyingWarning, stacklevel=stacklevel)
        return
    raise WeightTyingError(
        format_tie_failure(report, device),
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
