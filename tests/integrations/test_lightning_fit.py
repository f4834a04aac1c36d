"""Fabric and the Trainer fit a tied model through accel.integrations.lightning.

On the built-in ``cpu`` accelerator and on a third-party one (tests/helpers/integration_plugins.py,
accel hooks only), a few SGD steps must give exactly what a plain torch loop gives on
a tied model: the tie held, the output layer trained through the one shared weight.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from lightning.fabric import Fabric
from lightning.pytorch import LightningModule, Trainer

import accel
from accel.integrations.lightning import AccelAccelerator, AccelFabricStrategy, AccelStrategy
from helpers.fakes import MoveRecorder
from helpers.integration_plugins import VendorPlugin
from helpers.models import TiedLM
from helpers.registries import isolated_registry
from helpers.tied_training import (
    LR,
    STEPS,
    assert_trained_like_torch,
    batches,
    initial_model,
    loader,
    loss_of,
    optimized,
)


@dataclass
class Run:
    """A registry with the built-ins, the vendor plugin and a move recorder."""

    name: str
    registry: accel.AcceleratorRegistry
    vendor: VendorPlugin
    recorder: MoveRecorder

    def check_accel_was_used(self, lightning_accelerator: object) -> None:
        """The move went through accel, each step ended with mark_step, stats came from
        the plugin's memory_stats."""
        assert (self.name, "cpu") in self.recorder.moves, "the model did not move through accel"
        assert isinstance(lightning_accelerator, AccelAccelerator)
        assert lightning_accelerator.handle().name == self.name
        stats = lightning_accelerator.get_device_stats(torch.device("cpu"))
        if self.name == VendorPlugin.NAME:
            assert "post_move_hook" in self.vendor.calls
            assert self.vendor.calls.count("mark_step") == STEPS
            # What the plugin reports, less what it cannot measure (None).
            assert stats == {"allocated_bytes": 1024, "peak_allocated_bytes": 4096}
        else:
            assert set(stats) == {"allocated_bytes", "peak_allocated_bytes", "total_bytes"}
            assert all(isinstance(value, int) and value > 0 for value in stats.values())


@pytest.fixture(params=["cpu", VendorPlugin.NAME])
def run(request: pytest.FixtureRequest) -> Run:
    vendor, recorder = VendorPlugin(), MoveRecorder()
    registry = isolated_registry(vendor, recorder)
    return Run(request.param, registry, vendor, recorder)


def test_fabric_fits_a_tied_model(run: Run) -> None:
    initial = initial_model()
    fabric = Fabric(strategy=AccelFabricStrategy(run.name, registry=run.registry), devices=1)
    model = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    fabric_model, fabric_optimizer = fabric.setup(model, optimizer)
    for batch in batches():
        tokens, targets = fabric.to_device(batch)
        fabric.backward(loss_of(fabric_model, tokens, targets))
        fabric_optimizer.step()
        fabric_optimizer.zero_grad()

    assert_trained_like_torch(model, initial, optimized([optimizer]))
    run.check_accel_was_used(fabric.accelerator)


class TiedLMModule(LightningModule):
    def __init__(self, model: TiedLM) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        return loss_of(self.model, *batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def _trainer(tmp_path: Path, **kwargs: object) -> Trainer:
    return Trainer(
        max_steps=STEPS,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kwargs,  # type: ignore[arg-type]
    )


def test_trainer_fits_a_tied_model(run: Run, tmp_path: Path) -> None:
    initial = initial_model()
    module = TiedLMModule(copy.deepcopy(initial))
    trainer = _trainer(tmp_path, strategy=AccelStrategy(run.name, registry=run.registry))
    trainer.fit(module, loader())

    assert trainer.global_step == STEPS
    assert_trained_like_torch(module.model, initial, optimized(trainer.optimizers))
    run.check_accel_was_used(trainer.accelerator)


def test_trainer_accepts_the_accelerator_and_strategy_apart(tmp_path: Path) -> None:
    registry = isolated_registry(VendorPlugin())
    initial = initial_model()
    module = TiedLMModule(copy.deepcopy(initial))
    trainer = _trainer(
        tmp_path,
        accelerator=AccelAccelerator("vendornpu", registry=registry),
        strategy=AccelStrategy(),
    )
    trainer.fit(module, loader())
    assert_trained_like_torch(module.model, initial, optimized(trainer.optimizers))
