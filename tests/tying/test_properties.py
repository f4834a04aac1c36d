"""Property-based tests of tied weights and transactional moves.

A move through the TPU plugin's hooks is exercised three ways: to `meta` (which, like
XLA, builds a new Parameter for every slot; tensors there have no values), to the CPU
with torch's "overwrite module params on conversion" flag set (new Parameters again,
and values that can be compared), and, in the XLA tier, to real XLA:CPU. Tests that
hold for both `meta` and XLA take the target as a parameter (`TARGETS`); the XLA
case carries the `xla` marker, so each tier runs its own half.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import accel
from accel.plugins.tpu import TpuPlugin
from helpers.fakes import CpuTpuPlugin, MetaTpuPlugin
from helpers.registries import isolated_registry
from helpers.strategies import (
    HOOK_FAULTS,
    FaultPlugin,
    InjectedFault,
    ModelState,
    assert_moved,
    assert_noted_restored,
    assert_restored,
    count_tensor_copies,
    failing_tensor_copy,
    make_accelerator,
    module_trees,
    torch_future_flag,
    untie_on_tie_weights,
)

# Few, tiny examples: the whole file runs in seconds.
PROPERTY_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

#: Where the TPU plugin's moves go: `meta` in the main tier, real XLA:CPU in the XLA tier.
TARGETS = [pytest.param("meta"), pytest.param("xla", marks=pytest.mark.xla)]


def tpu_to(target: str, *plugins: object) -> accel.Accelerator:
    """The TPU plugin's hooks moving to ``target``, with ``plugins`` registered too."""
    if target == "meta":
        return make_accelerator(MetaTpuPlugin(), "tpu", *plugins)
    return isolated_registry(*plugins).get_accelerator("tpu")


class InPlaceCastPlugin:
    """An accelerator whose move swaps storage under the same Parameter objects.

    Casting to float64 on the CPU takes `Module._apply`'s in-place `.data =` path,
    the same one a CPU -> CUDA move takes, so a failure midway leaves some
    Parameters holding new storage that the restore must swap back.
    """

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("cast")]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True, auto=False)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")

    @accel.hookimpl
    def model_to_device(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(torch.float64)


@PROPERTY_SETTINGS
@given(model=module_trees())
def test_meta_move_keeps_ties_counts_and_metadata(model: torch.nn.Module) -> None:
    acc = make_accelerator(MetaTpuPlugin())
    before = ModelState.capture(model, values=False)

    moved = acc.model_to_device(model)

    assert moved is model
    assert_moved(moved, before, torch.device("meta"), values=False)


@PROPERTY_SETTINGS
@given(model=module_trees())
def test_swap_mode_meta_move_keeps_ties_counts_and_metadata(model: torch.nn.Module) -> None:
    # torch's other conversion mode swaps each tensor into the existing Parameter object.
    acc = make_accelerator(MetaTpuPlugin())
    before = ModelState.capture(model, values=False)

    with torch_future_flag("swap_module_params_on_conversion", True):
        moved = acc.model_to_device(model)

    assert_moved(moved, before, torch.device("meta"), values=False)


@PROPERTY_SETTINGS
@given(model=module_trees(), where=st.sampled_from(HOOK_FAULTS[1:]))
def test_swap_mode_failing_move_restores_the_model(model: torch.nn.Module, where: str) -> None:
    assume(any(True for _ in model.parameters()))
    acc = make_accelerator(MetaTpuPlugin(), "tpu", FaultPlugin(where))
    before = ModelState.capture(model)

    with (
        torch_future_flag("swap_module_params_on_conversion", True),
        pytest.raises(InjectedFault) as raised,
    ):
        acc.model_to_device(model)

    assert_noted_restored(raised.value)
    assert_restored(model, before)


@PROPERTY_SETTINGS
@given(model=module_trees(parameter_as_buffer=True))
def test_meta_move_keeps_a_parameter_registered_as_a_buffer_tied(
    model: torch.nn.Module,
) -> None:
    acc = make_accelerator(MetaTpuPlugin())
    before = ModelState.capture(model, values=False)

    moved = acc.model_to_device(model)

    assert_moved(moved, before, torch.device("meta"), values=False)


@PROPERTY_SETTINGS
@given(model=module_trees())
def test_overwrite_mode_cpu_move_keeps_ties_and_values(model: torch.nn.Module) -> None:
    acc = make_accelerator(CpuTpuPlugin())
    before = ModelState.capture(model)

    with torch_future_flag("overwrite_module_params_on_conversion", True):
        moved = acc.model_to_device(model)

    assert_moved(moved, before, torch.device("cpu"), values=True)
    # The flag made every slot a new Parameter: the ties survived because accel re-tied.
    for name, record in before.tensors.items():
        if record.kind == "parameter":
            assert moved.get_parameter(name) is not record.obj, name


@pytest.mark.parametrize("target", TARGETS)
@PROPERTY_SETTINGS
@given(model=module_trees(), data=st.data())
def test_tpu_move_failing_at_a_tensor_copy_restores_the_model(
    target: str, model: torch.nn.Module, data: st.DataObject
) -> None:
    copies = count_tensor_copies(model, tied_once=True)
    assume(copies > 0)  # a model without tensors makes no copy that could fail
    fail_at = data.draw(st.integers(1, copies), label="fail_at")
    acc = tpu_to(target)
    before = ModelState.capture(model)

    with failing_tensor_copy(fail_at) as calls, pytest.raises(InjectedFault) as raised:
        acc.model_to_device(model)

    assert calls[0] == fail_at
    assert_noted_restored(raised.value)
    assert_restored(model, before)


@pytest.mark.parametrize("target", TARGETS)
@PROPERTY_SETTINGS
@given(model=module_trees(), where=st.sampled_from(HOOK_FAULTS))
def test_tpu_move_failing_in_a_hook_restores_the_model(
    target: str, model: torch.nn.Module, where: str
) -> None:
    acc = tpu_to(target, FaultPlugin(where))
    before = ModelState.capture(model)

    with pytest.raises(InjectedFault) as raised:
        acc.model_to_device(model)

    assert_noted_restored(raised.value)
    assert_restored(model, before)


@pytest.mark.parametrize("target", TARGETS)
@PROPERTY_SETTINGS
@given(model=module_trees())
def test_tpu_move_failing_tie_validation_restores_the_model(
    target: str, model: torch.nn.Module
) -> None:
    untie_on_tie_weights(model)
    acc = tpu_to(target)
    before = ModelState.capture(model)

    with pytest.raises(accel.WeightTyingError) as raised:
        acc.model_to_device(model)

    assert_noted_restored(raised.value)
    assert_restored(model, before)


@PROPERTY_SETTINGS
@given(model=module_trees(), data=st.data())
def test_in_place_move_failing_at_a_tensor_copy_restores_storage(
    model: torch.nn.Module, data: st.DataObject
) -> None:
    copies = count_tensor_copies(model)
    assume(copies > 0)  # a model without tensors makes no copy that could fail
    fail_at = data.draw(st.integers(1, copies), label="fail_at")
    acc = make_accelerator(InPlaceCastPlugin(), "cast")
    before = ModelState.capture(model)

    with failing_tensor_copy(fail_at) as calls, pytest.raises(InjectedFault) as raised:
        acc.model_to_device(model)

    assert calls[0] == fail_at
    assert_noted_restored(raised.value)
    assert_restored(model, before)


@PROPERTY_SETTINGS
@given(model=module_trees(), where=st.sampled_from(HOOK_FAULTS))
def test_in_place_move_failing_in_a_hook_restores_storage(
    model: torch.nn.Module, where: str
) -> None:
    # The whole in-place cast has happened when the post hooks fail.
    acc = make_accelerator(InPlaceCastPlugin(), "cast", FaultPlugin(where))
    before = ModelState.capture(model)

    with pytest.raises(InjectedFault) as raised:
        acc.model_to_device(model)

    assert_noted_restored(raised.value)
    assert_restored(model, before)


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=10, deadline=None)
@given(model=module_trees())
def test_the_tensor_copy_count_is_exact(target: str, model: torch.nn.Module) -> None:
    """The fault-injection tests rely on `count_tensor_copies` matching torch (and torch_xla)."""
    copies = count_tensor_copies(model, tied_once=True)
    with failing_tensor_copy(0) as calls:
        tpu_to(target).model_to_device(model)
    assert calls[0] == copies


@pytest.mark.xla
@PROPERTY_SETTINGS
@given(model=module_trees())
def test_xla_move_keeps_ties_counts_dtypes_and_values(model: torch.nn.Module) -> None:
    """All four parameter dtypes round-trip exactly through XLA:CPU (torch_xla 2.9), so
    no dtype is left out; values are compared after `.cpu()`."""
    acc = accel.get_accelerator("tpu")
    before = ModelState.capture(model)

    moved = acc.model_to_device(model)

    assert acc.device.type == "xla"
    assert_moved(moved, before, acc.device, values=True)


def test_tpu_plugin_is_the_real_one() -> None:
    # The fakes declare the shipped plugin's accelerator, untying weights, so the
    # handle keeps their ties exactly as it keeps the real one's.
    assert MetaTpuPlugin.register_accelerators is TpuPlugin.register_accelerators
    (spec,) = TpuPlugin().register_accelerators()
    assert spec.name == "tpu" and spec.unties_weights is True
