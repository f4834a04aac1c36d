"""accel.tying on its own: finding, re-tying and comparing ties, with no plugin involved.

Moves here are `module.to()` on the CPU in torch's overwrite mode, which builds a new
Parameter for every slot exactly like a move to or from XLA. The same code running
inside real moves (to `meta`, the CPU in overwrite mode, and XLA) is tested in
tests/plugins/test_tpu_moves.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel.tying import (
    SlotContents,
    TyingSnapshot,
    count_unique_parameters,
    find_tied_parameters,
    retie,
)
from accel.tying._keeping import format_tie_failure
from helpers.models import (
    ALL_MODELS,
    NoParameters,
    OwnTieWeights,
    SharedBuffer,
    SharedSubmodule,
    SwapsTies,
    ThreeWayTie,
    TiedLM,
    TiesOnTieWeights,
    UntiesOnPurpose,
)


def _partition(model: nn.Module) -> set[tuple[str, ...]]:
    return {group.names for group in find_tied_parameters(model)}


# -- the tying module on its own ------------------------------------------------


def test_finds_the_embedding_head_tie() -> None:
    groups = find_tied_parameters(TiedLM())
    assert [(g.kind, g.names) for g in groups] == [("parameter", ("embed.weight", "head.weight"))]


def test_finds_a_three_way_tie_across_modulelist_and_moduledict() -> None:
    (group,) = find_tied_parameters(ThreeWayTie())
    assert group.names == ("shared.weight", "blocks.1.weight", "heads.out.weight")


def test_a_shared_buffer_is_a_group_and_can_be_excluded() -> None:
    model = SharedBuffer()
    assert [(g.kind, g.names) for g in find_tied_parameters(model)] == [
        ("buffer", ("a.table", "b.table"))
    ]
    assert find_tied_parameters(model, buffers=False) == []


def test_a_submodule_registered_twice_is_not_a_tie() -> None:
    assert find_tied_parameters(SharedSubmodule()) == []


def test_untied_models_have_no_groups() -> None:
    assert find_tied_parameters(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == []
    assert find_tied_parameters(NoParameters()) == []


def test_counts_unique_parameters() -> None:
    assert count_unique_parameters(TiedLM()) == 3  # shared weight, body weight + bias
    assert count_unique_parameters(ThreeWayTie()) == 2
    assert count_unique_parameters(SharedSubmodule()) == 4
    assert count_unique_parameters(NoParameters()) == 0


def test_overwrite_mode_really_unties_and_retie_puts_it_back(overwrite_mode: None) -> None:
    model = TiedLM()
    groups = find_tied_parameters(model)
    model.to(torch.float64)
    assert model.head.weight is not model.embed.weight, "the premise: conversion unties"
    assert count_unique_parameters(model) == 4
    retie(groups)
    assert model.head.weight is model.embed.weight
    assert count_unique_parameters(model) == 3
    assert model.embed.weight.dtype == torch.float64


def test_retie_uses_the_first_slots_object() -> None:
    model = ThreeWayTie()
    groups = find_tied_parameters(model)
    replacement = nn.Parameter(torch.zeros(4, 4))
    model.shared.weight = replacement
    model.blocks[1].weight = nn.Parameter(torch.ones(4, 4))
    retie(groups)
    assert model.blocks[1].weight is replacement
    assert model.heads["out"].weight is replacement


def test_snapshot_check_reports_broken_groups_and_counts() -> None:
    model = TiedLM()
    snapshot = TyingSnapshot.capture(model)
    assert snapshot.check(model).ok
    model.head.weight = nn.Parameter(model.embed.weight.detach().clone())
    report = snapshot.check(model)
    assert not report.ok
    assert (report.count_before, report.count_after) == (3, 4)
    assert [group.names for group in report.broken] == [("embed.weight", "head.weight")]


def _reference_groups(model: nn.Module) -> list[tuple[str, tuple[str, ...]]]:
    """The obvious implementation over named_modules(), to check the fast one against."""
    by_tensor: dict[int, list[tuple[str, str]]] = {}
    for prefix, module in model.named_modules():
        for kind, slots in (("parameter", module._parameters), ("buffer", module._buffers)):
            for name, tensor in slots.items():
                if tensor is not None:
                    qualified = f"{prefix}.{name}" if prefix else name
                    by_tensor.setdefault(id(tensor), []).append((kind, qualified))
    groups = [
        ("parameter" if any(k == "parameter" for k, _ in s) else "buffer", tuple(n for _, n in s))
        for s in by_tensor.values()
        if len(s) > 1
    ]
    return sorted(groups, key=lambda group: group[0] != "parameter")


def _diamond() -> nn.Module:
    # One block reachable through two paths, the deeper one first in module order, and
    # ties inside and outside it: names must follow named_modules() exactly.
    shared = nn.Linear(2, 2)
    root = nn.Module()
    root.left = nn.Sequential(nn.Linear(2, 2), shared)
    root.right = shared
    root.head = nn.Linear(2, 2)
    root.head.weight = shared.weight
    root.left[0].register_buffer("scale", torch.ones(1))
    root.head.register_buffer("scale", root.left[0].scale)
    return root


@pytest.mark.parametrize("name", [*sorted(ALL_MODELS), "diamond"])
def test_single_pass_scan_matches_the_obvious_implementation(name: str) -> None:
    model = _diamond() if name == "diamond" else ALL_MODELS[name]()
    found = [(group.kind, group.names) for group in find_tied_parameters(model)]
    assert sorted(found) == sorted(_reference_groups(model))
    assert count_unique_parameters(model) == len(list(model.parameters()))
    assert TyingSnapshot.capture(model).parameter_count == count_unique_parameters(model)


def test_diamond_names_follow_module_order() -> None:
    groups = {group.names for group in find_tied_parameters(_diamond())}
    assert ("left.1.weight", "head.weight") in groups
    assert ("left.0.scale", "head.scale") in groups


# -- comparing with a snapshot: groups that came apart and groups that appeared ------


def test_check_names_a_tie_that_appeared() -> None:
    model = TiesOnTieWeights()
    snapshot = TyingSnapshot.capture(model)
    assert snapshot.groups == () and snapshot.check(model).ok
    model.tie_weights()
    report = snapshot.check(model)
    assert not report.ok
    assert report.broken == ()
    assert [(g.kind, g.names) for g in report.appeared] == [
        ("parameter", ("embed.weight", "head.weight"))
    ]
    assert (report.count_before, report.count_after) == (2, 1)


def test_check_names_a_group_that_grew() -> None:
    model = ThreeWayTie()
    snapshot = TyingSnapshot.capture(model)
    model.blocks[0].weight = model.shared.weight
    report = snapshot.check(model)
    assert report.broken == ()
    assert [g.names for g in report.appeared] == [
        ("shared.weight", "blocks.0.weight", "blocks.1.weight", "heads.out.weight")
    ]


def test_check_sees_a_new_buffer_tie_the_parameter_count_cannot() -> None:
    model = SharedBuffer()
    model.c = nn.Module()
    model.c.register_buffer("own", torch.zeros(2))
    snapshot = TyingSnapshot.capture(model)
    model.c.own = model.a.table
    report = snapshot.check(model)
    assert report.count_before == report.count_after
    assert [(g.kind, g.names) for g in report.appeared] == [
        ("buffer", ("a.table", "b.table", "c.own"))
    ]
    assert not report.ok


def test_check_reports_a_group_split_in_two_as_broken_only() -> None:
    model = ThreeWayTie()
    snapshot = TyingSnapshot.capture(model)
    other = nn.Parameter(torch.zeros(4, 4))
    model.blocks[1].weight = other
    model.heads["out"].weight = other
    report = snapshot.check(model)
    assert [g.names for g in report.broken] == [
        ("shared.weight", "blocks.1.weight", "heads.out.weight")
    ]
    assert report.appeared == ()


def test_check_reports_both_kinds_at_once() -> None:
    model = SwapsTies()
    snapshot = TyingSnapshot.capture(model)
    model.tie_weights()
    report = snapshot.check(model)
    assert [g.names for g in report.broken] == [
        ("shared.weight", "blocks.1.weight", "heads.out.weight")
    ]
    assert [g.names for g in report.appeared] == [("blocks.0.weight", "heads.out.weight")]
    assert report.count_before == report.count_after == 2  # the count alone would miss it
    assert not report.ok


def test_slot_contents_restore_puts_the_same_objects_back() -> None:
    model = ThreeWayTie()
    model.register_buffer("scale", torch.ones(1))
    objects = dict(model.named_parameters(remove_duplicate=False))
    scale = model.scale
    contents = SlotContents(model)
    assert contents.restore() is False  # nothing changed, nothing to put back
    model.blocks[1].weight = nn.Parameter(torch.zeros(4, 4))
    model.scale = torch.zeros(1)
    model.register_parameter("extra", nn.Parameter(torch.ones(1)))
    model.heads["new"] = nn.Linear(1, 1)
    assert contents.restore() is True
    assert dict(model.named_parameters(remove_duplicate=False)) == objects
    assert model.scale is scale
    assert "new" not in model.heads


# -- finishing a move: re-tie, the model's tie_weights(), never a change of ties ---


def _moved_in_overwrite_mode(model: nn.Module) -> TyingSnapshot:
    """Capture, then convert so that every slot gets a Parameter of its own."""
    snapshot = TyingSnapshot.capture(model)
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)
    return snapshot


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_finish_move_reties_every_model(name: str) -> None:
    model = ALL_MODELS[name]()
    partition, count = _partition(model), count_unique_parameters(model)
    snapshot = _moved_in_overwrite_mode(model)
    report = snapshot.finish_move(model)
    assert report.ok
    assert report.tie_weights_called is (name == "own_tie_weights")
    assert not report.tie_weights_undone
    assert _partition(model) == partition
    assert count_unique_parameters(model) == count


def test_finish_move_keeps_what_tie_weights_does_when_the_ties_stay_the_same() -> None:
    replaced: list[tuple[nn.Parameter, nn.Parameter]] = []

    class RetiesWithANewObject(OwnTieWeights):
        def tie_weights(self) -> None:
            self.tie_weights_calls += 1
            shared = nn.Parameter(self.encoder.weight.detach().clone())
            replaced.append((self.encoder.weight, shared))
            self.encoder.weight = shared
            self.decoder.weight = shared

    model = RetiesWithANewObject()
    snapshot = _moved_in_overwrite_mode(model)
    report = snapshot.finish_move(model)
    assert report.ok and report.tie_weights_called and not report.tie_weights_undone
    assert model.tie_weights_calls == 2
    # The ties are the same, so nothing is undone: the model's own new object stands.
    after_retie, chosen = replaced[-1]
    assert chosen is not after_retie
    assert model.encoder.weight is chosen and model.decoder.weight is chosen


@pytest.mark.parametrize("model_class", [TiesOnTieWeights, UntiesOnPurpose, SwapsTies])
def test_finish_move_undoes_a_tie_weights_that_changes_the_ties(
    model_class: type[nn.Module],
) -> None:
    model = model_class()
    partition = _partition(model)
    values = _values(model)
    snapshot = _moved_in_overwrite_mode(model)
    report = snapshot.finish_move(model)
    assert not report.ok
    assert report.tie_weights_called and report.tie_weights_undone
    assert report.broken or report.appeared
    # The model keeps exactly the ties it had, and every value.
    assert _partition(model) == partition
    for name, value in model.state_dict().items():
        assert torch.equal(value, values[name].to(value.dtype)), name


def test_finish_move_reports_what_tie_weights_would_have_made() -> None:
    model = SwapsTies()
    snapshot = _moved_in_overwrite_mode(model)
    report = snapshot.finish_move(model)
    assert [g.names for g in report.broken] == [
        ("shared.weight", "blocks.1.weight", "heads.out.weight")
    ]
    assert [g.names for g in report.appeared] == [("blocks.0.weight", "heads.out.weight")]


def test_finish_move_without_tie_weights_reports_a_failed_retie() -> None:
    model = TiedLM()
    snapshot = _moved_in_overwrite_mode(model)
    snapshot.groups[0].slots[0][0]._parameters["weight"] = None  # the source slot emptied
    report = snapshot.finish_move(model)
    assert not report.ok and not report.tie_weights_called
    assert [g.names for g in report.broken] == [("embed.weight", "head.weight")]


# -- the failure message -------------------------------------------------------------


def _report_after_tie_weights(model: nn.Module) -> str:
    snapshot = _moved_in_overwrite_mode(model)
    return format_tie_failure(snapshot.finish_move(model), "xla:0")


def test_message_for_a_group_that_came_apart() -> None:
    message = _report_after_tie_weights(UntiesOnPurpose())
    first, *rest = message.splitlines()
    assert first == (
        "tied weights came apart moving the model to xla:0. Layer count: [Before: 3 After: 4]"
    )
    assert "Groups no longer tied (each was one tensor before the move):" in rest
    assert "  - parameters embed.weight, head.weight" in rest
    assert "Groups newly tied" not in message
    assert "accel undid what tie_weights() changed" in message
    assert "pass tie_check='warn' (or 'off')" in message


def test_message_for_a_tie_that_appeared() -> None:
    message = _report_after_tie_weights(TiesOnTieWeights())
    first, *rest = message.splitlines()
    assert first == "new ties appeared moving the model to xla:0. Layer count: [Before: 2 After: 1]"
    assert "Groups newly tied (separate tensors before the move, one tensor after it):" in rest
    assert "  - parameters embed.weight, head.weight" in rest
    assert "Groups no longer tied" not in message
    assert "tie_word_embeddings=True" in message
    assert "pass tie_check='warn' (or 'off')" in message


def test_message_for_both_kinds() -> None:
    message = _report_after_tie_weights(SwapsTies())
    assert message.startswith("tied weights changed moving the model to xla:0.")
    assert "  - parameters shared.weight, blocks.1.weight, heads.out.weight" in message
    assert "  - parameters blocks.0.weight, heads.out.weight" in message
