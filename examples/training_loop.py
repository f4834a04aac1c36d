"""One training loop for every accelerator (docs/training.md).

python examples/training_loop.py --accelerator cpu --steps 40
PJRT_DEVICE=CPU python examples/training_loop.py --accelerator tpu --steps 40
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel


def make_data(seed: int = 0) -> TensorDataset:
    """A noisy linear regression problem, the same on every machine."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(512, 16, generator=generator)
    true_weight = torch.randn(16, 1, generator=generator)
    targets = inputs @ true_weight + 0.1 * torch.randn(512, 1, generator=generator)
    return TensorDataset(inputs, targets)


# --8<-- [start:train]
def train(
    acc: accel.Accelerator, steps: int, *, seed: int = 0, checkpoint: str | None = None
) -> list[float]:
    """Train a small MLP for ``steps`` steps on ``acc``; return the losses."""
    acc.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model = acc.model_to_device(model, optimizer=optimizer)
    # drop_last: every batch has the same shape, so XLA compiles the step once.
    loader = DataLoader(make_data(seed), batch_size=32, shuffle=False, drop_last=True)
    losses: list[torch.Tensor] = []
    while len(losses) < steps:  # as many epochs as the steps need
        for inputs, targets in acc.device_loader(loader):
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            acc.optimizer_step(optimizer)  # XLA: the step ends here (at the next batch)
            optimizer.zero_grad()
            losses.append(loss.detach())  # no .item() here: on XLA it would run early
            if len(losses) == steps:
                break
    if checkpoint is not None:  # tensors on the CPU; only the main process writes
        acc.save({"model": acc.state_dict(model), "optimizer": optimizer.state_dict()}, checkpoint)
    return [float(loss) for loss in losses]


# --8<-- [end:train]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint", default=None, help="save the model here")
    args = parser.parse_args()
    acc = accel.get_accelerator(args.accelerator)  # on XLA: before any backward()
    losses = train(acc, args.steps, checkpoint=args.checkpoint)
    print(f"{acc.name} ({acc.device}): loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"memory: {acc.memory_stats()}")


if __name__ == "__main__":
    main()
