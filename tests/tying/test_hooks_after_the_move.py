"""A post_move_hook runs after accel kept the ties of an untying move: a hook that then
breaks or makes a tie is reported by ``tie_check``, as the move itself would be."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import accel
from helpers.fakes import FakeAccelerator
from helpers.models import TiedLM
from helpers.registries import isolated_registry


class UntiesTheHead:
    """A cross-cutting plugin whose post_move_hook gives the head a weight of its own."""

    @accel.hookimpl
    def post_move_hook(self, model: nn.Module) -> None:
        head = getattr(model, "head", None)
        if head is not None and head.weight.device.type == "meta":
            head.weight = nn.Parameter(head.weight.detach().clone())


def _meta_registry() -> accel.AcceleratorRegistry:
    # A move to meta unties as a move to XLA does (torch's rule), so accel keeps the ties.
    return isolated_registry(FakeAccelerator("metadev", device="meta"), UntiesTheHead())


def test_a_post_move_hook_that_breaks_a_tie_is_an_error_and_the_model_is_restored() -> None:
    model = TiedLM()
    embed = model.embed.weight
    with pytest.raises(accel.WeightTyingError, match="post_move_hook") as raised:
        _meta_registry().get_accelerator("metadev").model_to_device(model)
    assert ("embed.weight", "head.weight") in raised.value.broken_groups
    assert model.embed.weight is embed and model.head.weight is embed
    assert embed.device.type == "cpu"


def test_under_warn_the_move_goes_on_with_a_tying_warning() -> None:
    acc = _meta_registry().get_accelerator("metadev", tie_check="warn")
    with pytest.warns(accel.TyingWarning, match="post_move_hook"):
        moved = acc.model_to_device(TiedLM())
    assert moved.embed.weight.device.type == "meta"


def test_a_move_that_keeps_ties_by_itself_does_not_check_after_the_hooks() -> None:
    # CPU -> CPU: torch keeps every Parameter, accel enters no tying code, so a hook's
    # change is the hook's own business (and costs the move nothing).
    registry = isolated_registry(UntiesTheHead())
    model = TiedLM()
    moved = registry.get_accelerator("cpu").model_to_device(model)
    assert moved.head.weight is moved.embed.weight  # the hook acts only on meta
    assert torch.equal(moved.embed.weight, model.embed.weight)
