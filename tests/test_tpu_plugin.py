"""The TPU plugin (accel.plugins.tpu): the accelerator, and the ties it keeps on moves.

Each move test runs on up to three routes, one behaviour each:

* ``meta``: the TPU plugin's hooks moving to the ``meta`` device, which builds a new
  Parameter for every slot exactly like XLA (main tier, no values to compare);
* ``overwrite``: the same hooks moving to the CPU in torch's overwrite mode, where
  every move does the same, values can be compared, and the ``cpu`` accelerator's
  move back goes through the plugin's cross-cutting companion (main tier);
* ``xla``: the real plugin on torch_xla, on XLA:CPU (``PJRT_DEVICE=CPU``, XLA tier),
  there and back to the CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass

import pytest
import torch
from fakes import CpuTpuPlugin, FakeAccelerator
from models import (
    ALL_MODELS,
    FrozenTie,
    OwnTieWeights,
    SharedBuffer,
    SharedSubmodule,
    TiedLM,
    TiesOnTieWeights,
    UntiesOnPurpose,
)
from torch import nn

import accel
from accel import tying
from accel.plugins import tpu as tpu_plugin
from accel.plugins.tpu import TyingWarning, move_can_untie
from accel.tying import count_unique_parameters, find_tied_parameters

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
    registry = accel.AcceleratorRegistry(entry_points=None)
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


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


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


def test_a_tie_that_tie_weights_would_make_raises_naming_it(route: Route) -> None:
    model = TiesOnTieWeights()
    head, embed = model.head.weight, model.embed.weight
    with pytest.raises(accel.WeightTyingError) as info:
        route.tpu.model_to_device(model)
    error = info.value
    assert error.appeared_groups == [("embed.weight", "head.weight")]
    assert error.broken_groups == []
    assert (error.count_before, error.count_after) == (2, 1)
    assert str(error).startswith("new ties appeared moving the model to ")
    assert "came apart" not in str(error)
    assert model.head.weight is head and model.embed.weight is embed
    assert head.device.type == "cpu"


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


# -- when the guard runs, and when it does not -------------------------------------------


def _without_torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)


def _with_fake_torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_xla", types.ModuleType("torch_xla"))


def test_move_can_untie_by_target_mode_and_source(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_torch_xla(monkeypatch)
    cpu_model, cpu = TiedLM(), torch.device("cpu")
    assert move_can_untie(cpu_model, torch.device("xla", 0))
    assert move_can_untie(cpu_model, torch.device("meta"))
    assert not move_can_untie(cpu_model, cpu)
    meta_model = TiedLM().to("meta")
    # Without torch_xla no tensor can be on XLA: the model is not even looked at.
    assert not move_can_untie(meta_model, cpu)
    _with_fake_torch_xla(monkeypatch)
    assert move_can_untie(meta_model, cpu)  # a model leaving a device that unties
    assert not move_can_untie(cpu_model, cpu)
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        assert move_can_untie(cpu_model, cpu)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)


@pytest.mark.parametrize("torch_xla_imported", [False, True])
def test_a_cpu_move_never_runs_the_tying_code(
    registry: accel.AcceleratorRegistry,
    monkeypatch: pytest.MonkeyPatch,
    torch_xla_imported: bool,
) -> None:
    if torch_xla_imported:
        _with_fake_torch_xla(monkeypatch)
    else:
        _without_torch_xla(monkeypatch)
    walks: list[str] = []
    original_walk = tpu_plugin._holds_a_tensor_on
    monkeypatch.setattr(
        tpu_plugin,
        "_holds_a_tensor_on",
        lambda *a: (walks.append("walk"), original_walk(*a))[1],
    )
    captures: list[str] = []
    original_scan = tying._scan
    monkeypatch.setattr(tying, "_scan", lambda *a: (captures.append("scan"), original_scan(*a))[1])
    moved = registry.get_accelerator("cpu").model_to_device(TiedLM())
    assert captures == []
    # With torch_xla imported the guard looks at the devices (a model could be on
    # XLA); without it, it does not even do that.
    assert walks == (["walk"] if torch_xla_imported else [])
    assert moved.head.weight is moved.embed.weight


def test_a_tpu_move_is_guarded_once_by_the_plugin_and_its_companion(
    overwrite_mode: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(CpuTpuPlugin(), override=True)
    captures: list[str] = []
    original = tying.TyingSnapshot.capture.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        tying.TyingSnapshot,
        "capture",
        classmethod(lambda cls, model: (captures.append("capture"), original(cls, model))[1]),
    )
    model = registry.get_accelerator("tpu").model_to_device(TiedLM())
    assert captures == ["capture"]
    assert model.head.weight is model.embed.weight


def test_another_accelerator_moving_to_meta_keeps_ties() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(FakeAccelerator("npu", device="meta"))
    model = registry.get_accelerator("npu").model_to_device(TiedLM())
    assert model.head.weight is model.embed.weight
    assert model.head.weight.device.type == "meta"


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


# -- XLA only: the accelerator itself ------------------------------------------------------


def _python(code: str, **env: str | None) -> str:
    environment = dict(os.environ)
    for key, value in env.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.xla
def test_tpu_runs_on_xla_cpu(tpu: accel.Accelerator, registry: accel.AcceleratorRegistry) -> None:
    assert os.environ["PJRT_DEVICE"] == "CPU"
    assert tpu.name == "tpu"
    assert str(tpu.device) == "xla:0"
    assert tpu.device_count() >= 1
    assert tpu.distributed_backend == "xla"
    assert registry.get_accelerator("XLA").name == "tpu"
    assert registry.get_accelerator("tpu:0").device == tpu.device


@pytest.mark.xla
def test_auto_does_not_pick_tpu_on_xla_cpu(registry: accel.AcceleratorRegistry) -> None:
    info = {i.name: i for i in registry.list_accelerators()}["tpu"]
    assert info.available and not info.auto
    assert "CPU" in info.reason
    assert registry.get_accelerator("auto").name != "tpu"


@pytest.mark.xla
def test_model_and_batch_move_to_xla(tpu: accel.Accelerator) -> None:
    model = tpu.model_to_device(nn.Linear(3, 2))
    assert all(p.device == tpu.device for p in model.parameters())
    batch = tpu.batch_to_device({"x": torch.ones(4, 3), "meta": ("id", [torch.zeros(1)])})
    assert batch["x"].device == tpu.device
    assert batch["meta"][0] == "id" and batch["meta"][1][0].device == tpu.device
    out = model(batch["x"]).sum()
    assert out.device == tpu.device and torch.isfinite(out.cpu())


@pytest.mark.xla
def test_import_accel_does_not_import_torch_xla() -> None:
    out = _python("import sys, accel; print('torch_xla' in sys.modules, 'torch' in sys.modules)")
    assert out == "False False"


@pytest.mark.xla
def test_probing_without_pjrt_device_does_not_import_torch_xla() -> None:
    out = _python(
        """
        import os, sys, accel
        infos = {i.name: i for i in accel.list_accelerators()}
        print('torch_xla' in sys.modules, infos['tpu'].available, 'PJRT_DEVICE' in os.environ)
        """,
        PJRT_DEVICE=None,
    )
    assert out == "False False False"


@pytest.mark.xla
def test_cuda_build_without_driver_probes_without_poisoning_fork() -> None:
    # torch 2.9.1 from PyPI is a CUDA build and this machine has no driver: exactly
    # where torch.cuda.device_count() would fall back to cuInit.
    out = _python(
        """
        import os, torch, accel
        assert torch.backends.cuda.is_built()
        infos = {i.name: i for i in accel.list_accelerators()}
        accel.get_accelerator("auto")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, str(torch.cuda._is_in_bad_fork()).encode()); os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(read, 16).decode(), torch.cuda.is_initialized(), infos['cuda'].available)
        print(infos['cuda'].reason)
        """,
        # Unset: with PJRT_DEVICE set, probing imports torch_xla, whose own import
        # poisons fork for CUDA; accel only promises not to do it itself.
        PJRT_DEVICE=None,
    )
    first, reason = out.splitlines()
    assert first == "False False False"
    assert "driver" in reason


@pytest.mark.xla
def test_training_on_xla_keeps_ties_and_learns(tpu: accel.Accelerator) -> None:
    torch.manual_seed(0)
    model = TiedLM(vocab=16, width=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    model = tpu.model_to_device(model, optimizer=optimizer)
    tokens = tpu.batch_to_device(torch.arange(16).repeat(2) % 8)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        logits = model(tokens[:-1])
        loss = nn.functional.cross_entropy(logits, tokens[1:])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        assert model.head.weight is model.embed.weight
        assert optimizer.param_groups[0]["params"][0] is model.embed.weight
    assert model.embed.weight.device == tpu.device
    assert losses[-1] < losses[0] * 0.7


@pytest.mark.xla
def test_a_model_trained_on_xla_exports_to_the_cpu_tied(
    tpu: accel.Accelerator, registry: accel.AcceleratorRegistry
) -> None:
    torch.manual_seed(0)
    model = TiedLM(vocab=16, width=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model = tpu.model_to_device(model, optimizer=optimizer)
    tokens = tpu.batch_to_device(torch.arange(8))
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(tokens[:-1]), tokens[1:]).backward()
        optimizer.step()
    trained = _values(model)
    logits = model(tokens).cpu()
    exported = registry.get_accelerator("cpu").model_to_device(model)
    assert exported.head.weight is exported.embed.weight
    assert count_unique_parameters(exported) == 3
    _assert_same_values(exported, trained)
    torch.testing.assert_close(exported(torch.arange(8)), logits)


@pytest.mark.xla
def test_demo_on_tpu_reports_equal_counts_and_held_ties() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "accel", "demo", "--accelerator", "tpu", "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "device: xla:0" in result.stdout
    counts = next(line for line in result.stdout.splitlines() if line.startswith("unique"))
    before, after = (int(part.split()[-1]) for part in counts.split(","))
    assert before == after > 0
    assert "every tie held: yes" in result.stdout
