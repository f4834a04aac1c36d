"""Saves an FSDP2 checkpoint on two ranks, or loads it on another world size.

Usage: torchrun --nproc-per-node N fsdp_reshard.py save|load DIR

``save`` (two ranks): a tied model sharded with ``fully_shard_tied``, two AdamW steps,
``save_sharded`` to ``DIR/ckpt`` with ``acc.rng_state()``, every generator seeded by
rank. ``load`` (any number of ranks): the same model, sharded over this world,
``load_sharded`` from ``DIR/ckpt``, then ``acc.set_rng_state``. Either way the main
process writes the full (gathered) parameters and AdamW moments to ``DIR/<mode>.pt``,
and each rank its torch generator's state (and, loading, the warnings it got) to
``DIR/<mode>-rank<r>.pt``, to compare.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch import nn

import accel.distributed

VOCAB, WIDTH = 16, 8


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.embed(tokens))))


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    context = accel.distributed.init_process_group("cpu", timeout=60)
    acc = context.accelerator
    acc.manual_seed(100 + context.world_size)  # the load must not depend on its own init
    model = acc.model_to_device(TiedLM())
    accel.distributed.fully_shard_tied(model, [model.embed, model.head])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"model": model, "optimizer": optimizer}
    caught: list[str] = []
    if mode == "save":
        acc.manual_seed(500 + context.rank)  # the ranks' generators differ
        data = torch.Generator().manual_seed(7)
        for _ in range(2):
            tokens = torch.randint(0, VOCAB, (2, 5), generator=data)
            model(tokens).logsumexp(-1).mean().backward()
            acc.optimizer_step(optimizer)
            optimizer.zero_grad()
        accel.distributed.save_sharded(
            {**state, "step": 2, "rng": acc.rng_state()}, directory / "ckpt"
        )
        step = 2
    else:
        placeholders = {**state, "step": 0, "rng": acc.rng_state()}
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            remainder = accel.distributed.load_sharded(directory / "ckpt", placeholders)
        caught = [str(record.message) for record in records]
        acc.set_rng_state(remainder["rng"])
        step = remainder["step"]
    mine = {"torch": torch.get_rng_state(), "warnings": caught}
    torch.save(mine, directory / f"{mode}-rank{context.rank}.pt")
    names = dict(model.named_parameters())
    full = {name: _full(p) for name, p in names.items()}
    moments = {
        f"{name}.{key}": _full(optimizer.state[p][key])
        for name, p in names.items()
        for key in ("exp_avg", "exp_avg_sq")
    }
    report = {
        "parameters": full,
        "moments": moments,
        "step": step,
        "world_size": context.world_size,
        "tied": model.head.weight is model.embed.weight,
    }
    acc.save(report, directory / f"{mode}.pt")  # every rank calls it; the main one writes
    accel.distributed.destroy_process_group()
    return 0


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)  # a DTensor shard: gather it (collective)
    return (full() if callable(full) else tensor).detach()


if __name__ == "__main__":
    code = main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    import os

    os._exit(code)
