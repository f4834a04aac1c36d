"""A torchrun worker: two micro-steps under acc.no_sync on DDP, against one step on the
whole batch in one process; reports what it saw.

Usage: torchrun --nproc-per-node 2 accumulate_no_sync.py REPORT_DIR

Every rank writes REPORT_DIR/rank<RANK>.json. A DDP communication hook counts the
all-reduces each micro-step started: none under no_sync, some on the synced one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import accel.distributed

MICRO_STEPS = 2


def micro_batch(rank: int, micro_step: int) -> torch.Tensor:
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(10 * rank + micro_step))


def loss_of(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).pow(2).mean() / MICRO_STEPS


def main() -> None:
    report_dir = Path(sys.argv[1])
    context = accel.distributed.init_process_group("cpu", timeout=60)
    acc, rank = context.accelerator, context.rank
    torch.manual_seed(0)
    model = acc.model_to_device(torch.nn.Linear(3, 2))
    reference = torch.nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    ddp = accel.distributed.wrap_data_parallel(model, context)
    reductions: list[int] = []

    # No annotations: DDP checks them, and this module's are strings (__future__).
    def counting(state, bucket):  # type: ignore[no-untyped-def]
        reductions[-1] += 1
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    local_grads = []
    for micro_step in range(MICRO_STEPS):
        reductions.append(0)
        with acc.no_sync(ddp, enabled=micro_step < MICRO_STEPS - 1):
            loss_of(ddp, micro_batch(rank, micro_step)).backward()
        local_grads.append(model.weight.grad.detach().clone())  # type: ignore[union-attr]
    acc.optimizer_step(optimizer)

    # The reference: one process, one step on every rank's micro-batches together.
    everything = torch.cat(
        [micro_batch(r, m) for r in range(context.world_size) for m in range(MICRO_STEPS)]
    )
    (reference(everything).pow(2).mean()).backward()
    torch.optim.SGD(reference.parameters(), lr=0.5).step()

    first = [torch.empty_like(local_grads[0]) for _ in range(context.world_size)]
    dist.all_gather(first, local_grads[0])
    report = {
        "rank": rank,
        "reductions": reductions,
        "unsynced_after_first": not torch.allclose(first[0], first[1]),
        "diff": max(
            (a - b).abs().max().item()
            for a, b in zip(model.parameters(), reference.parameters(), strict=True)
        ),
    }
    (report_dir / f"rank{rank}.json").write_text(json.dumps(report))
    accel.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
