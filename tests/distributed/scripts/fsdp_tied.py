"""A torchrun worker: shards a tied model with FSDP2 and compares with one process.

Usage: torchrun --nproc-per-node 2 fsdp_tied.py LAYOUT[,LAYOUT...] REPORT_DIR [STEPS]

Each LAYOUT runs in turn, on a fresh model, in the one process group. It names the
modules given their own FSDP2 unit: ``root`` (none: the whole model is one unit),
``separate`` (embed, body and head each their own, which torch's plain
fully_shard would untie), ``body`` (only the untied body). ``unhelped`` shards embed
and head apart with torch's own fully_shard, without accel: the failure the helper
exists for. Every rank also trains an unsharded copy on the whole batch in this one
process (no collectives): the single-process run. Each rank trains on its half of
the batch, so equal results prove the sharded run matched it.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import accel.distributed
from helpers.models import TiedLM


def main() -> None:
    layouts, report_dir = sys.argv[1].split(","), Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    context = accel.distributed.init_process_group("cpu", timeout=60)
    report: dict[str, object] = {"rank": context.rank, "torch": torch.__version__}
    for layout in layouts:
        report[layout] = run_layout(layout, context, steps)
    accel.distributed.destroy_process_group()
    (report_dir / f"rank{context.rank}.json").write_text(json.dumps(report))


def run_layout(
    layout: str, context: accel.distributed.DistributedContext, steps: int
) -> dict[str, object]:
    torch.manual_seed(0)  # the same start on every rank, as FSDP2 expects
    model = context.accelerator.model_to_device(TiedLM())
    reference = copy.deepcopy(model)
    result: dict[str, object] = {}
    try:
        losses, reference_losses = shard_and_train(model, reference, layout, context, steps, result)
    except Exception as exc:  # torch 2.13 refuses the unhelped layout at the first forward
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    full = {name: unshard(p) for name, p in model.named_parameters()}
    result["names"] = sorted(full)
    result["loss_diff"] = max(abs(a - b) for a, b in zip(losses, reference_losses, strict=True))
    result["param_diff"] = max(
        (full[name] - reference.get_parameter(name).detach()).abs().max().item() for name in full
    )
    result["trained"] = not torch.equal(full["embed.weight"], initial_embedding())
    result["still_tied"] = model.head.weight is model.embed.weight
    return result


def shard_and_train(
    model: TiedLM,
    reference: TiedLM,
    layout: str,
    context: accel.distributed.DistributedContext,
    steps: int,
    result: dict[str, object],
) -> tuple[list[float], list[float]]:
    if layout == "unhelped":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.embed)
        fully_shard(model.head)
        fully_shard(model)
    else:
        units = {
            "root": [],
            "separate": [model.embed, model.body, model.head],
            "body": [model.body],
        }[layout]
        accel.distributed.fully_shard_tied(model, units)
    result["parameters"] = len(list(model.parameters()))
    result["tied"] = model.head.weight is model.embed.weight
    losses, reference_losses = [], []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7)  # the same data on every rank
    for _ in range(steps):
        tokens = torch.randint(0, 16, (4, 5), generator=generator)
        half = tokens.shape[0] // context.world_size
        mine = tokens[context.rank * half : (context.rank + 1) * half]
        loss = model(context.accelerator.batch_to_device(mine)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        whole = loss.detach().clone()
        torch.distributed.all_reduce(whole)  # the mean over ranks: the full batch's loss
        losses.append(whole.item() / context.world_size)
        reference_loss = reference(tokens).logsumexp(-1).mean()
        reference_optimizer.zero_grad()
        reference_loss.backward()
        reference_optimizer.step()
        reference_losses.append(reference_loss.item())
    return losses, reference_losses


def initial_embedding() -> torch.Tensor:
    torch.manual_seed(0)
    return TiedLM().embed.weight.detach()


def unshard(parameter: torch.Tensor) -> torch.Tensor:
    full = getattr(parameter, "full_tensor", None)
    return (full() if callable(full) else parameter).detach()


if __name__ == "__main__":
    main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
