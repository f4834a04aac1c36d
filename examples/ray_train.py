"""Ray Train with accel: a tied model on two workers, checkpointed through Ray and
resumed from it after a failure (docs/integrations.md, "Ray Train").

python examples/ray_train.py --accelerator cpu --workers 2 --storage /tmp/ray-results

Needs Ray Train (pip install 'accel-torch[ray]'); starts a local Ray cluster unless
one is running.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import ray.train
import torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel.integrations.ray import (
    prepare_data_loader,
    prepare_model,
    torch_config,
    worker_accelerator,
)


class TiedLM(nn.Module):
    """The embedding and the output layer share one weight (GPT-2 style)."""

    def __init__(self, vocab: int = 16, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def make_data(vocab: int = 16) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (64, 5), generator=generator)
    return TensorDataset(tokens, tokens.roll(1, dims=1))


# --8<-- [start:train]
def train_func(config: dict[str, Any]) -> None:
    """Runs in every Ray worker, in the process group Ray started."""
    name = config["accelerator"]
    net = TiedLM()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    # accel's move (ties kept, the optimizer re-pointed), DDP in Ray's group.
    model, optimizer = prepare_model(net, optimizer, accelerator=name)
    acc = worker_accelerator(name)  # this worker's handle: save, load, step
    loader = prepare_data_loader(DataLoader(make_data(), batch_size=8), accelerator=name)

    start = 0
    checkpoint = ray.train.get_checkpoint()  # set when Ray restarts a failed run
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = {"model": net, "optimizer": optimizer}
            start = acc.load(Path(directory) / "state.pt", state)["epoch"] + 1

    for epoch in range(start, config["epochs"]):
        for tokens, targets in loader:
            loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            optimizer.zero_grad()
            loss.backward()
            acc.optimizer_step(optimizer)
        with tempfile.TemporaryDirectory() as directory:
            # The model accel moved (not the DDP wrapper); only rank 0 writes.
            state = {"model": net, "optimizer": optimizer, "epoch": epoch}
            acc.save(state, Path(directory) / "state.pt")
            main_rank = ray.train.get_context().get_world_rank() == 0
            ray.train.report(
                {"epoch": epoch, "loss": loss.item()},
                checkpoint=Checkpoint.from_directory(directory) if main_rank else None,
            )


def train(accelerator: str, workers: int, storage: str, epochs: int = 3) -> ray.train.Result:
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"accelerator": accelerator, "epochs": epochs},
        torch_config=torch_config(accelerator),  # the accelerator's own backend
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            storage_path=storage, name="tied-lm", failure_config=FailureConfig(max_failures=1)
        ),
    )
    return trainer.fit()


# --8<-- [end:train]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--storage", default=str(Path(tempfile.gettempdir()) / "ray-results"))
    args = parser.parse_args()
    result = train(args.accelerator, args.workers, args.storage)
    print(f"epochs done: {result.metrics['epoch'] + 1}, last checkpoint: {result.checkpoint}")


if __name__ == "__main__":
    main()
