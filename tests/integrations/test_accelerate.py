"""accel.integrations.accelerate on XLA:CPU with the real Accelerate.

Accelerate's own ``prepare`` unties a tied model on XLA and leaves ``head.weight`` out
of the optimizer; a test here records that, so an upstream fix shows up as a failing
expectation (then update docs/integrations.md and drop the test).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import accel
from accel.integrations.accelerate import move_for_prepare, prepare
from helpers.models import TiedLM
from helpers.tied_training import (
    LR,
    assert_trained_like_torch,
    batches,
    initial_model,
    loss_of,
    optimized,
)

pytestmark = pytest.mark.xla


@pytest.fixture
def accelerator() -> Any:
    from accelerate import Accelerator

    return Accelerator()


def _train(accelerator: Any, model: torch.nn.Module, optimizer: Any) -> None:
    for tokens, targets in batches():
        tokens, targets = tokens.to(accelerator.device), targets.to(accelerator.device)
        accelerator.backward(loss_of(model, tokens, targets))
        optimizer.step()
        optimizer.zero_grad()


def _model_and_optimizer(initial: TiedLM) -> tuple[TiedLM, torch.optim.Optimizer]:
    model = copy.deepcopy(initial)
    return model, torch.optim.SGD(model.parameters(), lr=LR)


def test_prepare_with_accel_keeps_the_tie_and_trains_the_head(accelerator: Any) -> None:
    assert accelerator.device.type == "xla"
    initial = initial_model()
    model, optimizer = prepare(accelerator, *_model_and_optimizer(initial))
    assert model.head.weight is model.embed.weight
    assert model.head.weight.device.type == "xla"
    _train(accelerator, model, optimizer)
    assert_trained_like_torch(model, initial, optimized([optimizer.optimizer]), exact=False)


def test_the_one_line_recipe_does_the_same(accelerator: Any) -> None:
    initial = initial_model()
    model, optimizer = _model_and_optimizer(initial)
    accel.get_accelerator("tpu").model_to_device(model, optimizer=optimizer)
    model, optimizer = accelerator.prepare(model, optimizer)
    _train(accelerator, model, optimizer)
    assert_trained_like_torch(model, initial, optimized([optimizer.optimizer]), exact=False)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Accelerate 1.15's prepare unties on XLA and drops head.weight from the "
    "optimizer. If this passes, Accelerate fixed it: update docs/integrations.md and "
    "turn this into a plain test of prepare.",
)
def test_bare_prepare_keeps_the_tie(accelerator: Any) -> None:
    model, optimizer = accelerator.prepare(*_model_and_optimizer(initial_model()))
    assert model.head.weight.device.type == "xla"  # it did move, so a failure below is the tie
    assert model.head.weight is model.embed.weight, "Accelerate's prepare untied the model"
    assert id(model.head.weight) in optimized([optimizer.optimizer])


def test_placement_flags_are_honoured(accelerator: Any) -> None:
    kept, moved = TiedLM(), TiedLM()
    result = move_for_prepare(accelerator, kept, moved, device_placement=[False, True])
    assert result == [kept, moved]
    assert kept.head.weight.device.type == "cpu"
    assert moved.head.weight.device.type == "xla"
    assert moved.head.weight is moved.embed.weight
    with pytest.raises(ValueError, match="device_placement has 1 entries for 2 objects"):
        move_for_prepare(accelerator, kept, moved, device_placement=[True])
