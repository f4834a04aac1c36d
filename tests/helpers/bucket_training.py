"""A tiny token model and a masked loss, for the bucket tests and benchmark: the loss
ignores padded positions (labels -100), so padding must not change it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import accel
from accel.training.buckets import bucketed

VOCAB = 64
PAD = {"input_ids": 0, "attention_mask": 0, "labels": -100}


class TinyTokenModel(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.mix(self.embed(input_ids)))
        # Masked mean over the sequence: a padded position adds nothing to any token.
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        context = (hidden * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True)
        return self.head(hidden + context)  # type: ignore[no-any-return]


def masked_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["input_ids"], batch["attention_mask"])
    return nn.functional.cross_entropy(
        logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100
    )


def token_batch(length: int, size: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed * 1000 + length)
    ids = torch.randint(1, VOCAB, (size, length), generator=generator)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(size, length, dtype=torch.long),
        "labels": torch.roll(ids, -1, dims=1),
    }


def train(
    acc: accel.Accelerator,
    batches: Iterable[dict[str, torch.Tensor]],
    sizes: tuple[int, ...] | None,
) -> list[float]:
    """One epoch over ``batches`` (bucketed when ``sizes`` is given); the losses."""
    torch.manual_seed(0)
    model = acc.model_to_device(TinyTokenModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader: Any = batches if sizes is None else bucketed(batches, sizes, PAD)
    losses = []
    for batch in acc.device_loader(loader):
        loss = masked_loss(model, batch)
        loss.backward()
        acc.optimizer_step(optimizer)
        optimizer.zero_grad()
        losses.append(loss.detach())
    acc.mark_step()
    return [float(loss) for loss in losses]  # fetched after the loop: no extra graphs


def graphs_compiled_by(acc: accel.Accelerator, habit: str, steps: int = 6) -> int:
    """XLA graphs compiled by a fixed-shape loop with one of the habits docs/training.md
    warns about: ``"none"``, ``"item"`` (a ``float(loss)`` each step) or ``"fetch"``
    (a second batch taken from the loader between forward and backward)."""
    import torch_xla.debug.metrics as metrics

    torch.manual_seed(0)
    model = acc.model_to_device(TinyTokenModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(acc.device_loader([token_batch(32, seed=i) for i in range(2 * steps)]))
    for batch in batches:
        loss = masked_loss(model, batch)
        if habit == "item":
            float(loss)
        elif habit == "fetch":
            extra = next(batches, None)
            if extra is not None:
                loss = loss + masked_loss(model, extra)
        loss.backward()
        acc.optimizer_step(optimizer)
        optimizer.zero_grad()
    acc.mark_step()
    return int((metrics.metric_data("CompileTime") or [0])[0])
