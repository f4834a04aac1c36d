"""Property-based tests of tied weights and transactional moves on real torch_xla (XLA:CPU).

Every test needs torch_xla (`@pytest.mark.xla`); the XLA tier runs them with
PJRT_DEVICE=CPU. All four parameter dtypes round-trip exactly through XLA:CPU
(torch_xla 2.9), so no dtype is left out; values are compared after `.cpu()`.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import (
    HOOK_FAULTS,
    FaultPlugin,
    InjectedFault,
    ModelState,
    assert_moved,
    assert_noted_restored,
    assert_restored,
    count_tensor_copies,
    failing_tensor_copy,
    module_trees,
    untie_on_tie_weights,
)

import accel

pytestmark = pytest.mark.xla

# XLA moves cost milliseconds each (and compile nothing: only transfers), so a
# few examples per property keep the file well under a minute.
XLA_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def tpu_with(*plugins: object) -> accel.Accelerator:
    registry = accel.AcceleratorRegistry(entry_points=None)
    for plugin in plugins:
        registry.register(plugin)
    return registry.get_accelerator("tpu")


@XLA_SETTINGS
@given(model=module_trees())
def test_xla_move_keeps_ties_counts_dtypes_and_values(model: torch.nn.Module) -> None:
    acc = accel.get_accelerator("tpu")
    before = ModelState.capture(model)

    moved = acc.model_to_device(model)

    assert acc.device.type == "xla"
    assert_moved(moved, before, acc.device, values=True)


@XLA_SETTINGS
@given(model=module_trees(), data=st.data())
def test_xla_move_failing_at_a_tensor_copy_restores_the_model(
    model: torch.nn.Module, data: st.DataObject
) -> None:
    copies = count_tensor_copies(model, tied_once=True)
    assume(copies > 0)  # a model without tensors makes no copy that could fail
    fail_at = data.draw(st.integers(1, copies), label="fail_at")
    acc = tpu_with()
    before = ModelState.capture(model)

    with failing_tensor_copy(fail_at) as calls, pytest.raises(InjectedFault) as raised:
        acc.model_to_device(model)

    assert calls[0] == fail_at
    assert_noted_restored(raised.value)
    assert_restored(model, before)


@XLA_SETTINGS
@given(model=module_trees(), where=st.sampled_from(HOOK_FAULTS))
def test_xla_move_failing_in_a_hook_restores_the_model(model: torch.nn.Module, where: str) -> None:
    acc = tpu_with(FaultPlugin(where))
    before = ModelState.capture(model)

    with pytest.raises(InjectedFault) as raised:
        acc.model_to_device(model)

    assert_noted_restored(raised.value)
    assert_restored(model, before)


@XLA_SETTINGS
@given(model=module_trees())
def test_xla_move_failing_tie_validation_restores_the_model(model: torch.nn.Module) -> None:
    untie_on_tie_weights(model)
    acc = tpu_with()
    before = ModelState.capture(model)

    with pytest.raises(accel.WeightTyingError) as raised:
        acc.model_to_device(model)

    assert_noted_restored(raised.value)
    assert_restored(model, before)


@settings(max_examples=5, deadline=None)
@given(model=module_trees())
def test_the_tensor_copy_count_is_exact_on_xla(model: torch.nn.Module) -> None:
    """The fault-injection test relies on `count_tensor_copies` matching torch_xla."""
    copies = count_tensor_copies(model, tied_once=True)
    with failing_tensor_copy(0) as calls:
        tpu_with().model_to_device(model)
    assert calls[0] == copies
