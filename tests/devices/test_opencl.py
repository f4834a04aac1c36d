"""torch-opencl, a real third-party PrivateUse1 backend (on pocl's CPU driver), through
the installed vendor plugin examples/accel-opencl-plugin: the tied model moved there and
back keeps its tie, and the optimizer follows. The device has no matmul, so gradients are
set by hand; SGD's elementwise step runs on it. Runs in `bash scripts/test devices` (the
opencl env, requirements/opencl.txt)."""

from __future__ import annotations

import pytest
import torch

import accel
from helpers.real_devices import (
    assert_same_values,
    assert_tied_and_followed,
    fixed_gradients,
    tied_model,
)

pytestmark = pytest.mark.devices("opencl")


@pytest.fixture(scope="module")
def opencl() -> accel.Accelerator:
    return accel.get_accelerator("opencl")


def step(
    acc: accel.Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, number: int
) -> None:
    fixed_gradients(model, number)
    acc.optimizer_step(optimizer)


def test_the_installed_plugin_provides_opencl(opencl: accel.Accelerator) -> None:
    (info,) = [info for info in accel.list_accelerators() if info.name == "opencl"]
    assert info.provider == "accel-opencl-plugin 0.1.0"
    assert opencl.device == torch.device("opencl", 0)


def test_the_tied_model_goes_there_and_back_tied_with_its_optimizer(
    opencl: accel.Accelerator,
) -> None:
    cpu = accel.get_accelerator("cpu")
    reference = tied_model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    model = tied_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    model = opencl.model_to_device(model, optimizer=optimizer)
    assert model.emb.weight.device.type == "opencl"
    assert_tied_and_followed(model, optimizer)
    for number in range(2):
        step(opencl, model, optimizer, number)
        step(cpu, reference, reference_optimizer, number)
    assert_same_values(reference, model)

    back = cpu.model_to_device(model, optimizer=optimizer)
    assert back.emb.weight.device.type == "cpu"
    assert_tied_and_followed(back, optimizer)
    assert_same_values(reference, back)
    step(cpu, back, optimizer, 2)  # the embedding trains: the optimizer holds it
    step(cpu, reference, reference_optimizer, 2)
    assert_same_values(reference, back)


def test_a_batch_with_a_transposed_tensor_moves(opencl: accel.Accelerator) -> None:
    # torch-opencl copies only contiguous host tensors; the plugin's batch hook makes
    # each one contiguous first, so a view a data pipeline hands over still moves.
    features = torch.arange(6.0).reshape(2, 3)
    moved = opencl.batch_to_device({"x": features.T, "n": 3})
    assert moved["n"] == 3
    assert moved["x"].device == opencl.device
    assert torch.equal(moved["x"].cpu(), features.T)
