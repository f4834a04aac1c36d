"""Tie keeping on a third-party accelerator's device that unties, declared or not.

The vendor plugin here is not the TPU plugin nor derived from it, and the registry has
no built-ins: torch's rule (or the declaration ``unties_weights=True``) alone must give
it the TPU plugin's snapshot, re-tie, validation and ``tie_check`` behaviour. It moves
to ``meta``, which gives every slot a Parameter of its own exactly like XLA.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel.tying import TieReport, count_unique_parameters, find_tied_parameters
from accel.tying import _keeping as tie_keeping
from accel.tying._capture import SlotContents
from helpers.models import ALL_MODELS, TiedLM, TiesOnTieWeights, UntiesOnPurpose


class VendorPlugin:
    """An XLA-like vendor accelerator: moves to ``meta``, declares that it unties."""

    def __init__(self, *, unties_weights: bool = True) -> None:
        self.unties_weights = unties_weights

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("npu", unties_weights=self.unties_weights)]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("meta")


def _npu(*, unties_weights: bool = True, builtins: bool = False) -> accel.Accelerator:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=builtins)
    registry.register(VendorPlugin(unties_weights=unties_weights))
    return registry.get_accelerator("npu")


@pytest.fixture
def captures(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The models whose tie groups a move derived (one per kept move)."""
    taken: list[int] = []
    derive = tie_keeping.TyingSnapshot._of_slots.__func__  # type: ignore[attr-defined]

    def counting(cls: type, slots: SlotContents) -> tie_keeping.TyingSnapshot:
        taken.append(id(slots.modules()[0][0]))
        return derive(cls, slots)  # type: ignore[no-any-return]

    monkeypatch.setattr(tie_keeping.TyingSnapshot, "_of_slots", classmethod(counting))
    return taken


def test_the_premise_torch_alone_unties_on_the_device() -> None:
    model = TiedLM().to("meta")
    assert model.head.weight is not model.embed.weight


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_an_undeclared_untying_device_keeps_every_tie(name: str, captures: list[int]) -> None:
    # torch's rule, not the declaration, says a move to `meta` unties.
    model = ALL_MODELS[name]()
    partition = {group.names for group in find_tied_parameters(model)}
    holds_tensors = any(True for _ in model.state_dict())
    moved = _npu(unties_weights=False).model_to_device(model)
    assert captures == ([id(model)] if holds_tensors else [])  # no tensor: nothing unties
    assert {group.names for group in find_tied_parameters(moved)} == partition
    assert count_unique_parameters(moved) == count_unique_parameters(model)


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_a_declared_untying_device_keeps_every_tie(name: str, captures: list[int]) -> None:
    model = ALL_MODELS[name]()
    partition = {group.names for group in find_tied_parameters(model)}
    count = count_unique_parameters(model)
    moved = _npu().model_to_device(model)
    assert captures == [id(model)]  # kept once
    assert {group.names for group in find_tied_parameters(moved)} == partition
    assert count_unique_parameters(moved) == count
    assert all(p.device.type == "meta" for p in moved.parameters())


def test_tie_check_error_raises_and_restores_on_a_declared_device() -> None:
    model = UntiesOnPurpose()
    embed = model.embed.weight
    with pytest.raises(accel.WeightTyingError, match=r"Before: 3 After: 4") as info:
        _npu().model_to_device(model)
    assert info.value.broken_groups == [("embed.weight", "head.weight")]
    assert model.embed.weight is embed and model.head.weight is embed
    assert embed.device.type == "cpu"


def test_tie_check_warn_and_off_on_a_declared_device() -> None:
    npu = _npu()
    npu.tie_check = "warn"
    with pytest.warns(accel.TyingWarning, match="tied weights came apart") as record:
        model = npu.model_to_device(UntiesOnPurpose())
    assert [w.filename for w in record if w.category is accel.TyingWarning] == [__file__]
    assert model.head.weight is model.embed.weight
    npu.tie_check = "off"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = npu.model_to_device(UntiesOnPurpose())
    assert model.head.weight is model.embed.weight


def test_a_tie_that_would_appear_is_undone_with_a_warning_on_a_declared_device() -> None:
    with pytest.warns(accel.TyingWarning, match="new ties appeared moving the model to meta") as r:
        model = _npu().model_to_device(TiesOnTieWeights())
    assert [w.filename for w in r if w.category is accel.TyingWarning] == [
        __file__
    ]  # the user's line
    assert model.head.weight is not model.embed.weight


def test_with_the_builtins_registered_a_move_is_kept_once(captures: list[int]) -> None:
    model = _npu(builtins=True).model_to_device(TiedLM())
    assert model.head.weight is model.embed.weight
    assert len(captures) == 1


def test_cpu_moves_take_no_snapshot(
    registry: accel.AcceleratorRegistry, captures: list[int]
) -> None:
    model = registry.get_accelerator("cpu").model_to_device(TiedLM())
    assert model.head.weight is model.embed.weight
    assert captures == []
    assert registry.get_accelerator("cpu").spec.unties_weights is False


def test_unties_weights_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="unties_weights of 'npu' must be a bool, got 'yes'"):
        accel.AcceleratorSpec("npu", unties_weights="yes")  # type: ignore[arg-type]


def _report(**fields: object) -> TieReport:
    return TieReport(count_before=2, count_after=1, broken=(), **fields)  # type: ignore[arg-type]


def test_the_outcome_of_each_report_under_each_tie_check() -> None:
    appeared = (object(),)
    undone = _report(appeared=appeared, kept_as_before=True)
    not_undone = _report(appeared=appeared, kept_as_before=False)
    broken = TieReport(3, 4, broken=appeared, kept_as_before=True)  # type: ignore[arg-type]
    table = {
        (undone, "error"): "warn",
        (undone, "warn"): "warn",
        (undone, "off"): "ok",
        (not_undone, "error"): "error",  # what accel cannot restore still raises
        (not_undone, "warn"): "warn",
        (broken, "error"): "error",
        (broken, "warn"): "warn",
        (broken, "off"): "ok",
        (TieReport(2, 2, broken=(), kept_as_before=True), "error"): "ok",
    }
    for (report, tie_check), expected in table.items():
        assert tie_keeping.outcome(report, tie_check) == expected, (report, tie_check)  # type: ignore[arg-type]


def test_tying_warning_is_public() -> None:
    assert "TyingWarning" in accel.__all__
    assert issubclass(accel.TyingWarning, UserWarning)
    assert not issubclass(accel.TyingWarning, accel.AcceleratorError)  # a warning, not an error
    assert accel.TyingWarning is accel.errors.TyingWarning


class TyingVendorPlugin(VendorPlugin):
    """A vendor whose move ties ``b.weight`` to ``a.weight``: a tie the model never had."""

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")  # values stay comparable

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        moved = model.to(device)
        moved.b.weight = moved.a.weight
        return moved


def _two_layers() -> nn.Module:
    model = nn.ModuleDict({"a": nn.Linear(2, 2, bias=False), "b": nn.Linear(2, 2, bias=False)})
    with torch.no_grad():
        model.a.weight.fill_(1.0)
        model.b.weight.fill_(2.0)
    return model


def _tying_npu(tie_check: accel.TieCheck) -> accel.Accelerator:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(TyingVendorPlugin())
    return registry.get_accelerator("npu", tie_check=tie_check)


def test_a_tie_a_vendor_move_creates_raises_under_error_and_the_model_is_restored() -> None:
    model = _two_layers()
    b_weight = model.b.weight
    with pytest.raises(accel.WeightTyingError, match="new ties appeared") as info:
        _tying_npu("error").model_to_device(model)
    assert info.value.appeared_groups == [("a.weight", "b.weight")]
    assert model.b.weight is b_weight and torch.equal(b_weight, torch.full((2, 2), 2.0))


@pytest.mark.parametrize("tie_check", ["warn", "off"])
def test_under_warn_and_off_a_vendor_move_keeps_the_ties_and_values_of_before(
    tie_check: accel.TieCheck,
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = _tying_npu(tie_check).model_to_device(_two_layers())
    assert moved.b.weight is not moved.a.weight
    assert torch.equal(moved.a.weight, torch.full((2, 2), 1.0))
    assert torch.equal(moved.b.weight, torch.full((2, 2), 2.0))  # not a's 1.0
    assert isinstance(moved.b.weight, nn.Parameter) and moved.b.weight.requires_grad
    assert count_unique_parameters(moved) == 2
    tying = [w for w in caught if issubclass(w.category, accel.TyingWarning)]
    if tie_check == "off":
        assert tying == []
    else:
        assert len(tying) == 1
        assert "keeps the ties and values it had before the move" in str(tying[0].message)


class GrowingVendorPlugin(TyingVendorPlugin):
    """A vendor whose move adds a parameter: no tie to take apart, so the model cannot
    be brought back to what it was, and the warning must not say it was."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        moved = model.to(device)
        moved.a.extra = nn.Parameter(torch.zeros(1))
        return moved


def test_under_warn_a_move_accel_cannot_bring_back_says_so() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(GrowingVendorPlugin())
    npu = registry.get_accelerator("npu", tie_check="warn")
    with pytest.warns(accel.TyingWarning) as caught:
        npu.model_to_device(_two_layers())
    message = str(caught[0].message)
    assert "Before: 2 After: 3" in message
    assert "could not bring the model back to the ties it had before the move" in message
    assert "keeps the ties and values" not in message


def test_the_tying_error_and_warning_name_the_plugin_whose_move_made_the_tie() -> None:
    plugin = "plugin 'test_tie_keeping.TyingVendorPlugin' (test_tie_keeping.TyingVendorPlugin)"
    with pytest.raises(accel.WeightTyingError) as info:
        _tying_npu("error").model_to_device(_two_layers())
    message = str(info.value)
    assert f"by the model_to_device hook of {plugin}" in message
    assert "Report this to the plugin's authors" in message
    assert "tie_word_embeddings" not in message  # no tie_weights() ran: no checkpoint hint
    with pytest.warns(accel.TyingWarning) as caught:
        _tying_npu("warn").model_to_device(_two_layers())
    assert f"by the model_to_device hook of {plugin}" in str(caught[0].message)


class UntyingBeforeTheMove(VendorPlugin):
    """A vendor whose ``pre_move_hook`` unties ``b`` on purpose (new values, its own
    Parameter), and whose move is torch's."""

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")  # values stay comparable

    @accel.hookimpl
    def pre_move_hook(self, model: nn.Module) -> None:
        model.b.weight = nn.Parameter(torch.full_like(model.b.weight, 7.0))


def test_the_ties_a_move_keeps_are_the_models_after_every_pre_move_hook() -> None:
    # The hookspec's promise: the groups are recorded after every pre_move_hook, so what
    # one did on purpose is the truth, not undone by re-tying the groups of before.
    model = _two_layers()
    model.b.weight = model.a.weight
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(UntyingBeforeTheMove())
    moved = registry.get_accelerator("npu").model_to_device(model)
    assert moved.b.weight is not moved.a.weight
    assert torch.equal(moved.b.weight, torch.full((2, 2), 7.0))
    assert torch.equal(moved.a.weight, torch.ones(2, 2))


class _TiedPair(nn.Module):
    """Two layers sharing one weight: ``b.weight`` is ``a.weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2, bias=False)
        self.b = nn.Linear(2, 2, bias=False)
        self.b.weight = self.a.weight


class _GrowsWhenMoved(_TiedPair):
    """A model whose own ``_apply`` adds a parameter: the move changes it, no plugin."""

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        moved = super()._apply(fn, recurse)
        self.a.extra = nn.Parameter(torch.zeros(1, device=self.a.weight.device))
        return moved


class _PassThroughMove:
    """A cross-cutting wrapper around every accelerator's ``model_to_device``."""

    @accel.hookimpl(wrapper=True)
    def model_to_device(self) -> Any:
        return (yield)


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_change_accels_own_move_made_blames_no_plugin_even_under_a_wrapper(
    wrapped: bool,
) -> None:
    # The answer came from accel's fallback: a wrapper around it, which may have
    # changed the answer, is no plugin's move to blame either (it is blamed for what
    # it raises).
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(VendorPlugin())
    if wrapped:
        registry.register(_PassThroughMove())
    with pytest.raises(accel.WeightTyingError, match="Before: 1 After: 2") as info:
        registry.get_accelerator("npu").model_to_device(_GrowsWhenMoved())
    assert "model_to_device hook of" not in str(info.value)
    assert "fallback" not in str(info.value)


class _ReadsItsWeightsWhenMoved(_TiedPair):
    """A model whose own ``_apply`` reads every weight before moving."""

    def __init__(self) -> None:
        super().__init__()
        self.norms: list[float] = []

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.norms = [float(self.a.weight.detach().norm()), float(self.b.weight.detach().norm())]
        return super()._apply(fn, recurse)


def test_a_model_with_its_own_apply_sees_every_slot_filled_during_the_move() -> None:
    # accel empties the duplicate tied slots for a move torch's Module.to makes, so each
    # shared tensor crosses once; a model's own _apply may read them, so not for it.
    model = _ReadsItsWeightsWhenMoved()
    moved = _npu().model_to_device(model)
    assert model.norms[0] == model.norms[1] > 0
    assert moved.b.weight is moved.a.weight
    assert moved.a.weight.device.type == "meta"


def test_a_tie_the_models_own_tie_weights_breaks_blames_no_plugin() -> None:
    with pytest.raises(accel.WeightTyingError) as info:
        _npu().model_to_device(UntiesOnPurpose())
    assert "model_to_device hook of" not in str(info.value)
    assert "tie_weights(), which changed them" in str(info.value)
