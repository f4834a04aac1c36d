"""torch-nntile, a real third-party PrivateUse1 backend, through the installed vendor
plugin examples/accel-nntile-plugin: a tied model trains bit for bit as on the CPU,
saves, resumes exactly and comes back to the CPU tied. Runs in `bash scripts/test
devices` (the nntile env, requirements/nntile.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import accel
from helpers.real_devices import (
    TARGETS,
    TOKENS,
    VOCAB,
    assert_same_values,
    assert_tied_and_followed,
    tied_model,
)

pytestmark = pytest.mark.devices("nntile")


@pytest.fixture(scope="module")
def nntile() -> accel.Accelerator:
    return accel.get_accelerator("nntile")


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    # Momentum: optimizer state on the device, which a checkpoint must bring back.
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)


def train(
    acc: accel.Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int
) -> None:
    for _ in range(steps):
        batch = acc.batch_to_device({"tokens": TOKENS, "targets": TARGETS})
        optimizer.zero_grad()
        logits = model(batch["tokens"])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch["targets"].reshape(-1))
        loss.backward()
        acc.optimizer_step(optimizer)


def test_the_installed_plugin_provides_nntile() -> None:
    (info,) = [info for info in accel.list_accelerators() if info.name == "nntile"]
    assert info.provider == "accel-nntile-plugin 0.1.0"
    assert info.available, info.reason


def test_a_tied_model_trains_saves_resumes_and_comes_back_tied(
    nntile: accel.Accelerator, tmp_path: Path
) -> None:
    cpu = accel.get_accelerator("cpu")
    reference = tied_model()
    reference_optimizer = sgd(reference)
    model = tied_model()
    optimizer = sgd(model)

    model = nntile.model_to_device(model, optimizer=optimizer)
    assert model.emb.weight.device.type == "nntile"
    assert_tied_and_followed(model, optimizer)

    train(nntile, model, optimizer, 3)
    train(cpu, reference, reference_optimizer, 3)
    assert_same_values(reference, model)

    checkpoint = tmp_path / "last.pt"
    nntile.save({"model": model, "optimizer": optimizer, "step": 3}, checkpoint)
    train(nntile, model, optimizer, 2)
    train(cpu, reference, reference_optimizer, 2)
    assert_same_values(reference, model)

    # Resume: fresh objects, the checkpoint loaded into them, the last two steps again.
    resumed = tied_model(seed=1)  # other values: the checkpoint must replace them all
    resumed_optimizer = sgd(resumed)
    resumed = nntile.model_to_device(resumed, optimizer=resumed_optimizer)
    remainder = nntile.load(checkpoint, {"model": resumed, "optimizer": resumed_optimizer})
    assert remainder == {"step": 3}
    assert_tied_and_followed(resumed, resumed_optimizer)
    train(nntile, resumed, resumed_optimizer, 2)
    assert_same_values(reference, resumed)

    # Back on the CPU: still tied, the optimizer on the same three parameters, and the
    # embedding still trains (a lost tie would leave it behind the head).
    back = cpu.model_to_device(resumed, optimizer=resumed_optimizer)
    assert back.emb.weight.device.type == "cpu"
    assert_tied_and_followed(back, resumed_optimizer)
    assert_same_values(reference, back)
    train(cpu, back, resumed_optimizer, 1)
    train(cpu, reference, reference_optimizer, 1)
    assert_same_values(reference, back)
