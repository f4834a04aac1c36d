"""Tied weights: found, re-tied and validated by the TPU plugin (main tier via `meta`).

`module.to("meta")` and any move under overwrite mode build a new Parameter per slot,
exactly like a move to XLA, so these tests exercise the real TPU hooks fast.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from models import (
    ALL_MODELS,
    FrozenTie,
    NoParameters,
    OwnTieWeights,
    SharedBuffer,
    SharedSubmodule,
    ThreeWayTie,
    TiedLM,
    UntiesOnPurpose,
)
from torch import nn

import accel
from accel.plugins.tpu import TyingWarning
from accel.tying import (
    TyingSnapshot,
    count_unique_parameters,
    find_tied_parameters,
    retie,
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


# -- the TPU plugin's move (to meta) ----------------------------------------------


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_tpu_move_keeps_every_tie_and_the_count(meta_tpu: accel.Accelerator, name: str) -> None:
    model = ALL_MODELS[name]()
    partition, count = _partition(model), count_unique_parameters(model)
    groups = find_tied_parameters(model)
    moved = meta_tpu.model_to_device(model)
    assert moved is model
    assert _partition(moved) == partition
    assert count_unique_parameters(moved) == count
    for group in groups:
        first, *rest = group.tensors()
        assert first is not None and first.device.type == "meta"
        assert all(tensor is first for tensor in rest)
    assert all(p.device.type == "meta" for p in moved.parameters())
    assert all(b.device.type == "meta" for b in moved.buffers())


def test_a_plain_meta_move_really_unties(meta_tpu: accel.Accelerator) -> None:
    model = TiedLM().to("meta")  # the bug accel fixes, on torch's own
    assert model.head.weight is not model.embed.weight
    assert count_unique_parameters(model) == 4


def test_frozen_tie_stays_frozen_and_tied(meta_tpu: accel.Accelerator) -> None:
    model = meta_tpu.model_to_device(FrozenTie())
    assert model.head.weight is model.embed.weight
    assert model.embed.weight.requires_grad is False
    assert model.body.weight.requires_grad is True


def test_shared_buffer_is_shared_again(meta_tpu: accel.Accelerator) -> None:
    model = meta_tpu.model_to_device(SharedBuffer())
    assert model.a.table is model.b.table
    assert model.a.table.device.type == "meta"


def test_shared_submodule_stays_one_module(meta_tpu: accel.Accelerator) -> None:
    model = meta_tpu.model_to_device(SharedSubmodule())
    assert model.again is model.block
    assert count_unique_parameters(model) == 4


def test_models_own_tie_weights_runs_after_the_retie(meta_tpu: accel.Accelerator) -> None:
    model = OwnTieWeights()
    assert model.tie_weights_calls == 1
    moved = meta_tpu.model_to_device(model)
    assert moved.tie_weights_calls == 2
    assert moved.decoder.weight is moved.encoder.weight


def test_model_has_the_last_word_even_against_the_retie(meta_tpu: accel.Accelerator) -> None:
    class TiesTheOtherWay(OwnTieWeights):
        def tie_weights(self) -> None:
            self.tie_weights_calls += 1
            self.encoder.weight = self.decoder.weight

    moved = meta_tpu.model_to_device(TiesTheOtherWay())
    assert moved.encoder.weight is moved.decoder.weight


def test_tie_weights_that_unties_raises_with_details(meta_tpu: accel.Accelerator) -> None:
    model = UntiesOnPurpose()
    embed_before = model.embed.weight
    with pytest.raises(accel.WeightTyingError) as info:
        meta_tpu.model_to_device(model)
    error = info.value
    assert isinstance(error, RuntimeError)
    assert (error.count_before, error.count_after) == (3, 4)
    assert error.broken_groups == [("embed.weight", "head.weight")]
    message = str(error)
    assert "Layer count: [Before: 3 After: 4]" in message
    assert "embed.weight, head.weight" in message
    assert "tie_check='warn'" in message
    # Nothing lost: the model is back on the CPU, tied, with its original objects.
    assert model.embed.weight is embed_before
    assert model.head.weight is embed_before
    assert embed_before.device.type == "cpu"
    assert any("restored" in note for note in getattr(error, "__notes__", []))


def test_tie_check_warn_keeps_the_moved_model(meta_tpu: accel.Accelerator) -> None:
    meta_tpu.tie_check = "warn"
    with pytest.warns(TyingWarning, match=r"Before: 3 After: 4"):
        model = meta_tpu.model_to_device(UntiesOnPurpose())
    assert model.embed.weight.device.type == "meta"
    assert model.head.weight is not model.embed.weight


def test_tie_check_off_neither_raises_nor_warns(meta_tpu: accel.Accelerator) -> None:
    meta_tpu.tie_check = "off"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = meta_tpu.model_to_device(UntiesOnPurpose())
    assert model.head.weight is not model.embed.weight
    # "off" skips validation, not the re-tie: ordinary ties are still restored.
    assert meta_tpu.model_to_device(TiedLM()).head.weight.device.type == "meta"
    tied = meta_tpu.model_to_device(TiedLM())
    assert tied.head.weight is tied.embed.weight


def test_a_parameter_also_registered_as_a_buffer_stays_one_parameter(
    meta_tpu: accel.Accelerator,
) -> None:
    model = nn.Module()
    model.a = nn.Linear(2, 2)
    model.b = nn.Module()
    model.b.register_buffer("w", model.a.weight)
    (group,) = find_tied_parameters(model)
    assert group.kind == "parameter" and group.names == ("a.weight", "b.w")
    moved = meta_tpu.model_to_device(model)
    assert list(moved.b._parameters) == []  # no parameter slot appeared
    assert moved.b._buffers["w"] is moved.a.weight
    assert isinstance(moved.a.weight, nn.Parameter) and moved.a.weight.device.type == "meta"


def test_swap_mode_failed_move_is_restored(meta_tpu: accel.Accelerator) -> None:
    # torch's swap mode moves by swapping tensor implementations under the same
    # Parameter objects; a failed move must swap them back.
    model = UntiesOnPurpose()
    weight, body = model.embed.weight, model.body.weight
    body.grad = torch.ones_like(body)
    grad = body.grad
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with pytest.raises(accel.WeightTyingError):
            meta_tpu.model_to_device(model)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
    assert model.embed.weight is weight and model.head.weight is weight
    assert model.body.weight is body and body.device.type == "cpu"
    assert body.grad is grad and torch.equal(grad, torch.ones_like(body))


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


def test_a_tied_weight_crosses_to_the_device_once(
    meta_tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    copied: list[tuple[int, ...]] = []
    original = torch.Tensor.to

    def counting_to(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copied.append(tuple(self.shape))
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    TiedLM().to("meta")
    assert sorted(copied) == [(8,), (8, 8), (16, 8), (16, 8)]  # plain .to(): shared one twice
    copied.clear()
    model = meta_tpu.model_to_device(TiedLM())
    assert sorted(copied) == [(8,), (8, 8), (16, 8)]
    assert model.head.weight is model.embed.weight
