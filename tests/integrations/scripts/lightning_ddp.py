"""Two Lightning processes train a tied model through accel; each reports what it saw.

Usage: python lightning_ddp.py {fabric,trainer} ACCELERATOR {popen,spawn} REPORT_DIR

Lightning launches the second process itself: ``popen`` re-runs this script (with
the same arguments), ``spawn`` starts a fresh interpreter and pickles the run into
it. Every rank writes REPORT_DIR/rank<RANK>.json; the test compares them. Each rank
builds its model from a different seed, so equal parameters at the end show that
DDP both broadcast rank 0's start and averaged the gradients; the plain torch loop
over both ranks' batches at once (``data_parallel_reference`` in
tests/helpers/tied_training.py) is the reference.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import accel
import accel.distributed
from accel.integrations.lightning import (
    AccelAccelerator,
    AccelCheckpointIO,
    AccelDDPStrategy,
    AccelFabricDDPStrategy,
)
from helpers.integration_plugins import VendorPlugin
from helpers.models import TiedLM
from helpers.tied_training import (
    BATCH,
    LR,
    STEPS,
    VOCAB,
    data_parallel_reference,
    dataset,
    loss_of,
)

PROCESSES = 2
TIMEOUT = timedelta(seconds=60)
#: The vendor plugin of this process, when it runs on it.
VENDOR: list[VendorPlugin] = []


def initial_model(rank: int) -> TiedLM:
    torch.manual_seed(100 + rank)  # a different start per rank, on purpose
    return TiedLM(VOCAB)


def data() -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(dataset(STEPS * BATCH * PROCESSES), batch_size=BATCH)


def accelerator(name: str) -> AccelAccelerator:
    if name == VendorPlugin.NAME:
        # A registry of this process's own: every process Lightning starts re-runs
        # this script (popen), so each builds it again.
        registry = accel.AcceleratorRegistry(entry_points=None)
        VENDOR.append(VendorPlugin())
        registry.register(VENDOR[0])
        return AccelAccelerator(name, registry=registry)
    return AccelAccelerator(name)


def report(
    report_dir: Path,
    strategy: Any,
    model: TiedLM,
    optimizers: list[torch.optim.Optimizer],
    checkpoint: dict[str, Any],
    wrapper: object,
    *,
    shuffled: bool,
) -> None:
    """Write what this rank ended with; ``checkpoint``: what AccelCheckpointIO read back."""
    context = strategy.accel_context
    expected = data_parallel_reference(initial_model(0), PROCESSES, shuffle=shuffled)
    trained = {name: value.detach().cpu() for name, value in model.state_dict().items()}
    stored = checkpoint.get("state_dict", checkpoint.get("model", {}))
    stored = {name.removeprefix("model."): value for name, value in stored.items()}
    optimized = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    result = {
        "rank": context.rank,
        "world_size": context.world_size,
        "backend": context.backend,
        "launched": context.launched,
        "accelerator": context.accelerator.name,
        "wrapper": type(wrapper).__name__,
        "tied": model.head.weight is model.embed.weight,
        "unique_parameters": len({id(p) for p in model.parameters()}),
        "head_optimized": id(model.head.weight) in optimized,
        "parameters": torch.cat([v.reshape(-1) for v in trained.values()]).tolist(),
        "reference_max_difference": max(
            (trained[name] - value).abs().max().item()
            for name, value in expected.state_dict().items()
        ),
        "checkpoint_io": type(strategy.checkpoint_io).__name__,
        # The vendor's hooks ran in this process: its move hooks and a mark per step.
        "vendor_calls": sorted(set(VENDOR[0].calls)) if VENDOR else None,
        "vendor_mark_steps": VENDOR[0].calls.count("mark_step") if VENDOR else None,
        "checkpoint_equal": sorted(stored) == sorted(trained)
        and all(torch.equal(stored[name], trained[name]) for name in trained),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"rank{context.rank}.json").write_text(json.dumps(result))


# -- Fabric -----------------------------------------------------------------------------


def fabric_run(fabric: Any, report_dir: Path) -> None:
    model = initial_model(fabric.global_rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    fabric_model, fabric_optimizer = fabric.setup(model, optimizer)
    for tokens, targets in fabric.setup_dataloaders(data()):
        fabric.backward(loss_of(fabric_model, tokens, targets))
        fabric_optimizer.step()
        fabric_optimizer.zero_grad()
    path = report_dir / "fabric.ckpt"
    fabric.save(path, {"model": fabric_model, "optimizer": fabric_optimizer})
    fabric.barrier()
    checkpoint = AccelCheckpointIO().load_checkpoint(path)
    wrapper = fabric_model._forward_module  # what Fabric runs the forward pass through
    # Fabric's distributed sampler keeps a sequential loader's order.
    report(report_dir, fabric.strategy, model, [optimizer], checkpoint, wrapper, shuffled=False)
    fabric.barrier()


def fabric_main(name: str, start_method: str, report_dir: Path) -> None:
    strategy = AccelFabricDDPStrategy(
        accelerator(name),
        timeout=TIMEOUT,
        start_method=start_method,  # type: ignore[arg-type]
    )
    fabric = Fabric(strategy=strategy, devices=PROCESSES)
    if start_method == "popen":
        fabric.launch()
        fabric_run(fabric, report_dir)
    else:
        fabric.launch(fabric_run, report_dir)


# -- the Trainer ------------------------------------------------------------------------


class TiedModule(LightningModule):
    def __init__(self, model: TiedLM) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        return loss_of(self.model, *batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


class Report(Callback):
    """Reports from inside each worker (with spawn, the script's process is none)."""

    def __init__(self, report_dir: Path) -> None:
        self.report_dir = report_dir

    def on_train_end(self, trainer: Trainer, module: LightningModule) -> None:
        path = self.report_dir / "trainer.ckpt"
        trainer.save_checkpoint(path)
        checkpoint = AccelCheckpointIO().load_checkpoint(path)
        strategy = trainer.strategy
        assert isinstance(module, TiedModule)
        # The Trainer's distributed sampler shuffles training data (seed 0).
        report(
            self.report_dir,
            strategy,
            module.model,
            trainer.optimizers,
            checkpoint,
            strategy.model,
            shuffled=True,
        )


def trainer_main(name: str, start_method: str, report_dir: Path) -> None:
    # popen: this script runs once per rank, LOCAL_RANK set for all but the first.
    module = TiedModule(initial_model(int(os.environ.get("LOCAL_RANK", "0"))))
    trainer = Trainer(
        strategy=AccelDDPStrategy(
            accelerator(name),
            timeout=TIMEOUT,
            start_method=start_method,  # type: ignore[arg-type]
        ),
        devices=PROCESSES,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=report_dir,
        callbacks=[Report(report_dir)],
    )
    trainer.fit(module, data())


if __name__ == "__main__":
    mode, name, start_method, directory = sys.argv[1:5]
    (fabric_main if mode == "fabric" else trainer_main)(name, start_method, Path(directory))
    accel.distributed.destroy_process_group()
    # gloo's C++ teardown can abort at interpreter exit ("terminate called without an
    # active exception") after the report is written; the test judges the report.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
