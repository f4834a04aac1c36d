"""Moves through the TPU plugin and its tie guard keep every tie, both ways, and never
change which tensors are tied (accel.plugins.tpu's move hooks).

Each test runs on up to three routes, one behaviour each:

* ``meta``: the TPU plugin's hooks moving to the ``meta`` device, which builds a new
  Parameter for every slot exactly like XLA (main tier, no values to compare);
* ``overwrite``: the same hooks moving to the CPU in torch's overwrite mode, where
  every move does the same, values can be compared, and the ``cpu`` accelerator's
  move back goes through the plugin's cross-cutting companion (main tier);
* ``xla``: the real plugin on torch_xla, on XLA:CPU (``PJRT_DEVICE=CPU``, XLA tier),
  there and back to the CPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import accel
from accel import TyingWarning
from accel.tying import count_unique_parameters, find_tied_parameters
from helpers.fakes import CpuTpuPlugin
from helpers.models import (
    ALL_MODELS,
    FrozenTie,
    OwnTieWeights,
    SharedBuffer,
    SharedSubmodule,
    TiedLM,
    TiesOnTieWeights,
    UntiesOnPurpose,
)
from helpers.registries import isolated_registry

XLA = pytest.param("xla", marks=pytest.mark.xla)


@dataclass(frozen=True)
class Route:
    """Where a test moves its model: ``tpu`` there, and ``cpu`` back (if there is a way)."""

    kind: str
    tpu: accel.Accelerator
    cpu: accel.Accelerator | None

    @property
    def has_values(self) -> bool:
        return self.kind != "meta"


def _route(request: pytest.FixtureRequest, kind: str) -> Route:
    if kind == "meta":
        return Route(kind, request.getfixturevalue("meta_tpu"), None)
    registry = isolated_registry()
    if kind == "overwrite":
        request.getfixturevalue("overwrite_mode")
        registry.register(CpuTpuPlugin(), override=True)
    return Route(kind, registry.get_accelerator("tpu"), registry.get_accelerator("cpu"))


@pytest.fixture(params=["meta", "overwrite", XLA])
def route(request: pytest.FixtureRequest) -> Route:
    return _route(request, request.param)


@pytest.fixture(params=["overwrite", XLA])
def round_trip(request: pytest.FixtureRequest) -> Route:
    """A route with values and a way back to the CPU."""
    return _route(request, request.param)


def _partition(model: nn.Module) -> set[tuple[str, ...]]:
    return {group.names for group in find_tied_parameters(model)}


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}


def _assert_same_values(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert set(state) == set(values)
    for name, value in state.items():
        assert torch.equal(value.cpu(), values[name]), name


def _assert_on(model: nn.Module, device: torch.device) -> None:
    assert all(p.device == device for p in model.parameters())
    assert all(b.device == device for b in model.buffers())


# -- the premise: a plain move unties, both ways ---------------------------------------


def test_a_plain_move_really_unties(route: Route) -> None:
    model = TiedLM()
    model.to(route.tpu.device)  # what everyone else does
    assert model.head.weight is not model.embed.weight
    assert count_unique_parameters(model) == 4
    if route.cpu is not None:
        model.head.weight = model.embed.weight
        model.to(route.cpu.device)  # the way back unties too
        assert model.head.weight is not model.embed.weight
        assert count_unique_parameters(model) == 4


# -- a move to the TPU keeps every tie ----------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_every_tie_survives_the_move(route: Route, name: str) -> None:
    model = ALL_MODELS[name]()
    groups = find_tied_parameters(model)
    partition, count = _partition(model), count_unique_parameters(model)
    values = _values(model) if route.has_values else None
    moved = route.tpu.model_to_device(model)
    assert moved is model
    assert _partition(moved) == partition
    assert count_unique_parameters(moved) == count
    for group in groups:
        first, *rest = group.tensors()
        assert first is not None and first.device == route.tpu.device
        assert all(tensor is first for tensor in rest)
    _assert_on(moved, route.tpu.device)
    if values is not None:
        _assert_same_values(moved, values)


def test_frozen_tie_stays_frozen_and_tied(route: Route) -> None:
    model = route.tpu.model_to_device(FrozenTie())
    assert model.head.weight is model.embed.weight
    assert model.embed.weight.requires_grad is False
    assert model.body.weight.requires_grad is True


def test_shared_buffer_is_shared_again(route: Route) -> None:
    model = route.tpu.model_to_device(SharedBuffer())
    assert model.a.table is model.b.table
    assert model.a.table.device == route.tpu.device


def test_shared_submodule_stays_one_module(route: Route) -> None:
    model = route.tpu.model_to_device(SharedSubmodule())
    assert model.again is model.block
    assert count_unique_parameters(model) == 4


def test_a_parameter_also_registered_as_a_buffer_stays_one_parameter(route: Route) -> None:
    model = nn.Module()
    model.a = nn.Linear(2, 2)
    model.b = nn.Module()
    model.b.register_buffer("w", model.a.weight)
    (group,) = find_tied_parameters(model)
    assert group.kind == "parameter" and group.names == ("a.weight", "b.w")
    moved = route.tpu.model_to_device(model)
    assert list(moved.b._parameters) == []  # no parameter slot appeared
    assert moved.b._buffers["w"] is moved.a.weight
    assert isinstance(moved.a.weight, nn.Parameter)
    assert moved.a.weight.device == route.tpu.device


def test_models_own_tie_weights_runs_after_the_retie(route: Route) -> None:
    model = OwnTieWeights()
    assert model.tie_weights_calls == 1
    moved = route.tpu.model_to_device(model)
    assert moved.tie_weights_calls == 2
    assert moved.decoder.weight is moved.encoder.weight


def test_model_has_the_last_word_when_its_ties_stay_the_same(route: Route) -> None:
    class TiesTheOtherWay(OwnTieWeights):
        def tie_weights(self) -> None:
            self.tie_weights_calls += 1
            self.encoder.weight = self.decoder.weight

    moved = route.tpu.model_to_device(TiesTheOtherWay())
    assert moved.tie_weights_calls == 2
    assert moved.encoder.weight is moved.decoder.weight


# -- a tie_weights() that would change the ties ------------------------------------------


def test_tie_weights_that_unties_raises_with_details(route: Route) -> None:
    model = UntiesOnPurpose()
    embed_before = model.embed.weight
    with pytest.raises(accel.WeightTyingError) as info:
        route.tpu.model_to_device(model)
    error = info.value
    assert isinstance(error, RuntimeError)
    assert (error.count_before, error.count_after) == (3, 4)
    assert error.broken_groups == [("embed.weight", "head.weight")]
    assert error.appeared_groups == []
    message = str(error)
    assert "tied weights came apart" in message
    assert "Layer count: [Before: 3 After: 4]" in message
    assert "embed.weight, head.weight" in message
    assert "tie_check='warn'" in message
    # Nothing lost: the model is back on the CPU, tied, with its original objects.
    assert model.embed.weight is embed_before
    assert model.head.weight is embed_before
    assert embed_before.device.type == "cpu"
    assert any("restored" in note for note in getattr(error, "__notes__", []))


def test_tie_check_warn_moves_with_the_ties_the_model_had(route: Route) -> None:
    route.tpu.tie_check = "warn"
    original = UntiesOnPurpose()
    values = _values(original)
    with pytest.warns(TyingWarning, match=r"Before: 3 After: 4"):
        model = route.tpu.model_to_device(original)
    assert model.embed.weight.device == route.tpu.device
    # tie_weights() untied the head; accel undid it: the move never changes ties.
    assert model.head.weight is model.embed.weight
    assert count_unique_parameters(model) == 3
    if route.has_values:
        _assert_same_values(model, values)


def test_tie_check_off_neither_raises_nor_warns(route: Route) -> None:
    route.tpu.tie_check = "off"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = route.tpu.model_to_device(UntiesOnPurpose())
    # "off" skips the report, not the guarantee: the ties are those of before the move.
    assert model.head.weight is model.embed.weight
    assert model.head.weight.device == route.tpu.device
    # ... and ordinary ties are still restored.
    tied = route.tpu.model_to_device(TiedLM())
    assert tied.head.weight is tied.embed.weight
    assert tied.head.weight.device == route.tpu.device


@pytest.mark.parametrize("tie_check", ["error", "warn"])
def test_a_tie_that_tie_weights_would_make_is_undone_with_a_warning(
    route: Route, tie_check: accel.TieCheck
) -> None:
    # transformers' own answer to a checkpoint saved untied and loaded with a config
    # that ties: warn, keep the weights as they are. accel undoes the tie, so the
    # model is exactly as before and the move goes ahead, also under "error".
    route.tpu.tie_check = tie_check
    model = TiesOnTieWeights()
    values = _values(model)
    with pytest.warns(TyingWarning) as record:
        moved = route.tpu.model_to_device(model)
    (warning,) = [w for w in record if w.category is TyingWarning]
    message = str(warning.message)
    assert message.startswith("new ties appeared moving the model to ")
    assert "  - parameters embed.weight, head.weight" in message
    assert "Layer count: [Before: 2 After: 1]" in message
    assert "The move went ahead: the model keeps the ties and values it had" in message
    assert "came apart" not in message and "tie_check='warn'" not in message
    assert warning.filename == __file__  # points at the caller's model_to_device line
    assert moved is model and model.head.weight is not model.embed.weight
    assert model.head.weight.device == route.tpu.device
    assert count_unique_parameters(model) == 2
    if route.has_values:
        _assert_same_values(model, values)


def test_a_tie_that_appears_while_another_comes_apart_still_raises(route: Route) -> None:
    from helpers.models import SwapsTies

    model = SwapsTies()
    shared = model.shared.weight
    with pytest.raises(accel.WeightTyingError) as info:
        route.tpu.model_to_device(model)
    assert info.value.broken_groups and info.value.appeared_groups
    assert str(info.value).startswith("tied weights changed moving the model to ")
    assert model.shared.weight is shared and shared.device.type == "cpu"


def test_warn_keeps_an_untied_model_untied_with_its_values(route: Route) -> None:
    route.tpu.tie_check = "warn"
    original = TiesOnTieWeights()
    values = _values(original)
    with pytest.warns(TyingWarning, match=r"new ties appeared"):
        model = route.tpu.model_to_device(original)
    assert model.head.weight is not model.embed.weight
    assert model.head.weight.device == route.tpu.device
    assert count_unique_parameters(model) == 2
    if route.has_values:
        _assert_same_values(model, values)
        tokens = torch.arange(10).to(route.tpu.device)
        reference = original.__class__()
        reference.load_state_dict(values)
        torch.testing.assert_close(model(tokens).cpu(), reference(torch.arange(10)))


def test_off_keeps_an_untied_model_untied_silently(route: Route) -> None:
    route.tpu.tie_check = "off"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = route.tpu.model_to_device(TiesOnTieWeights())
    assert model.head.weight is not model.embed.weight


class TiesDuringMove:
    """A cross-cutting plugin whose move ties ``b.weight`` to ``a.weight`` (it answers
    first: registered last), a tie the model never had and no re-tie undoes."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        moved = model.to(device)
        moved.b.weight = moved.a.weight
        return moved


@pytest.mark.parametrize("kind", ["overwrite", XLA])
@pytest.mark.parametrize("tie_check", ["warn", "off"])
def test_a_tie_another_plugins_move_makes_is_taken_apart_with_the_values_of_before(
    kind: str, tie_check: accel.TieCheck, request: pytest.FixtureRequest
) -> None:
    registry = isolated_registry()
    if kind == "overwrite":
        request.getfixturevalue("overwrite_mode")
        registry.register(CpuTpuPlugin(), override=True)
    registry.register(TiesDuringMove())
    tpu = registry.get_accelerator("tpu", tie_check=tie_check)
    model = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    values = _values(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = tpu.model_to_device(model)
    assert moved.b.weight is not moved.a.weight
    assert isinstance(moved.b.weight, nn.Parameter) and moved.b.weight.requires_grad
    assert count_unique_parameters(moved) == 4
    _assert_on(moved, tpu.device)
    _assert_same_values(moved, values)
    tying = [str(w.message) for w in caught if issubclass(w.category, TyingWarning)]
    assert len(tying) == (tie_check == "warn")


# -- the way back: leaving the TPU keeps every tie and value ----------------------------


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_round_trip_keeps_every_tie_and_value(round_trip: Route, name: str) -> None:
    assert round_trip.cpu is not None
    model = ALL_MODELS[name]()
    partition, count = _partition(model), count_unique_parameters(model)
    values = _values(model)
    for step, acc in enumerate((round_trip.tpu, round_trip.cpu, round_trip.tpu)):
        model = acc.model_to_device(model)
        assert _partition(model) == partition, (step, acc.name)
        assert count_unique_parameters(model) == count, (step, acc.name)
        for group in find_tied_parameters(model):
            first, *rest = group.tensors()
            assert all(tensor is first for tensor in rest)
        _assert_on(model, acc.device)
        _assert_same_values(model, values)


def test_the_head_is_the_embedding_again_on_the_cpu(round_trip: Route) -> None:
    assert round_trip.cpu is not None
    model = round_trip.tpu.model_to_device(TiedLM())
    back = round_trip.cpu.model_to_device(model)
    assert back.head.weight is back.embed.weight
    assert back.head.weight.device.type == "cpu"
    assert count_unique_parameters(back) == 3


def test_leaving_with_an_untying_tie_weights_raises_and_restores(round_trip: Route) -> None:
    assert round_trip.cpu is not None
    round_trip.tpu.tie_check = "warn"
    with pytest.warns(TyingWarning):
        model = round_trip.tpu.model_to_device(UntiesOnPurpose())
    embed = model.embed.weight
    values = _values(model)
    with pytest.raises(accel.WeightTyingError, match=r"Before: 3 After: 4") as info:
        round_trip.cpu.model_to_device(model)
    assert info.value.broken_groups == [("embed.weight", "head.weight")]
    # Restored where it was: on the TPU, tied, same objects and values.
    assert model.embed.weight is embed and model.head.weight is embed
    assert embed.device == round_trip.tpu.device
    _assert_same_values(model, values)


def test_the_way_back_remaps_the_optimizer(round_trip: Route) -> None:
    assert round_trip.cpu is not None
    model = TiedLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model = round_trip.tpu.model_to_device(model, optimizer=optimizer)
    loss = model(torch.arange(4).to(round_trip.tpu.device)).sum()
    loss.backward()
    optimizer.step()
    model = round_trip.cpu.model_to_device(model, optimizer=optimizer)
    assert model.head.weight is model.embed.weight
    (group,) = optimizer.param_groups
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]
    assert all(p.device.type == "cpu" for p in optimizer.state)


# -- meta only: torch's swap mode, and the shared tensor crossing once -----------------


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
