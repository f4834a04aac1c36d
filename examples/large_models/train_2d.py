"""A tied language model too big for one device, the way accel trains it: built on
``meta``, tensor parallel on the inner mesh dimension, FSDP2 on the outer one, then
materialized, initialized and trained. Run it with torchrun, on gloo here:

    torchrun --nproc-per-node 4 examples/large_models/train_2d.py --dp 2 --tp 2

It prints one loss per step on rank 0 (the mean over the whole batch) and checks
that the embedding and the head are still one Parameter.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import accel.distributed


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class TiedLM(nn.Module):
    """An embedding and an output layer sharing one weight, blocks between them."""

    def __init__(self, vocab: int = 32, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


#: Torch's own tensor-parallel plan. The embedding is split by vocabulary rows
#: (RowwiseParallel) and the head by output rows (ColwiseParallel): both Shard(0), so
#: the tie stays one Parameter.
PLAN = {
    "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    "blocks.*.up": ColwiseParallel(),
    "blocks.*.down": RowwiseParallel(),
    "head": ColwiseParallel(output_layouts=Replicate()),
}


def batches(steps: int, batch: int = 8, length: int = 6, vocab: int = 32) -> list[torch.Tensor]:
    """The same tokens on every rank, whatever the mesh (seeded)."""
    generator = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (batch, length + 1), generator=generator) for _ in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eager", action="store_true", help="one process, built eagerly")
    args = parser.parse_args()
    if args.eager:
        return train_eagerly(args.steps)

    context = accel.distributed.init_process_group("cpu")
    acc = context.accelerator
    mesh = init_device_mesh(acc.device.type, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))

    with torch.device("meta"):
        model = TiedLM()  # no memory yet; the tie as the model makes it
    model = accel.distributed.parallelize_tied(model, PLAN, mesh=mesh["tp"])
    model = accel.distributed.fully_shard_tied(model, model.blocks, mesh=mesh["dp"])
    acc.manual_seed(0)
    model = acc.materialize(model)  # on acc.device, the tie kept, reset_parameters()
    assert model.head.weight is model.embed.weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    dp_rank, dp_size = mesh["dp"].get_local_rank(), args.dp
    for step, tokens in enumerate(batches(args.steps)):
        mine = tokens.chunk(dp_size)[dp_rank]  # this data-parallel rank's share
        logits = model(mine[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), mine[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total, group=mesh["dp"].get_group())
        if context.rank == 0:
            print(f"step {step} loss {total.item() / dp_size:.7f}")
    assert model.head.weight is model.embed.weight
    accel.distributed.destroy_process_group()


def train_eagerly(steps: int) -> None:
    """The same model and steps in one process, built on the CPU: what the mesh must match."""
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step, tokens in enumerate(batches(steps)):
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.7f}")


if __name__ == "__main__":
    main()
