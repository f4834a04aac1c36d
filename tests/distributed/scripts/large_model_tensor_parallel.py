"""A torchrun worker: the recipe's tied LM under tensor parallelism and FSDP2 x TP,
against one process.

Usage: torchrun --nproc-per-node 2 large_model_tensor_parallel.py REPORT_DIR

On the 2 ranks, in one process group, each rank reports to REPORT_DIR/rank<r>.pt:

- ``tie``: the recipe's plan through ``parallelize_tied`` and through torch's own
  ``parallelize_module``, on the model built eagerly: Parameters, placements, and the
  gradient of each after one backward against one process's (both uses, apart);
- ``refused``: two plans that place the tied slots apart, on the model built on
  ``meta`` and eagerly: the error, and what the model holds afterwards;
- ``mesh-1x2``, ``mesh-2x1``: the recipe (meta, TP on ``tp``, FSDP2 on ``dp``,
  materialize) trained STEPS steps, with the same steps in this one process.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import accel
import accel.distributed
from helpers.large_models import (
    PLAN,
    TiedLM,
    adamw,
    batches,
    build_on_mesh,
    built_alone,
    full,
    gathered,
    is_tied,
    train,
)

STEPS = 4


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def tie(context: Any) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (context.world_size,), mesh_dim_names=("tp",))
    helped = built_alone()
    plain = copy.deepcopy(helped)  # the same values, for torch alone
    accel.distributed.parallelize_tied(helped, PLAN, mesh=mesh)
    parallelize_module(plain, mesh, PLAN)
    report: dict[str, Any] = {}
    for name, model in (("helped", helped), ("plain", plain)):
        report[name] = {
            "tied": is_tied(model),
            "parameters": len(list(model.parameters())),
            "dtensors": sorted(
                n
                for n, p in model.named_parameters(remove_duplicate=False)
                if isinstance(p, DTensor)
            ),
            "placements": {
                n: str(model.get_parameter(n).placements) for n in ("embed.weight", "head.weight")
            },
        }
    # One process, the tie undone by hand: each use's gradient apart.
    apart = built_alone()
    apart.head.weight = nn.Parameter(apart.embed.weight.detach().clone())
    tokens = batches(1)[0]  # every rank the same tokens: TP splits the weights, not the batch
    for model in (helped, plain, apart):
        loss_of(model, tokens).backward()
    embed_use, head_use = apart.embed.weight.grad, apart.head.weight.grad
    both = embed_use + head_use
    report["grad"] = {
        "helped_vs_both": (full(helped.embed.weight.grad) - both).abs().max().item(),
        "embed_use_vs_both": (embed_use - both).abs().max().item(),
        "head_use_vs_both": (head_use - both).abs().max().item(),
        # torch alone: two Parameters, each with one use's gradient only.
        "plain_embed_vs_embed_use": (full(plain.embed.weight.grad) - embed_use).abs().max().item(),
        "plain_head_vs_head_use": (full(plain.head.weight.grad) - head_use).abs().max().item(),
    }
    return report


#: Plans that shard the tied slots apart: the embedding by its width (Shard(1)) and
#: the head by its rows (Shard(0)); the head in no plan entry (not sharded).
APART = {
    "colwise-embed": lambda: {
        "embed": ColwiseParallel(output_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    },
    "head-left-out": lambda: {"embed": PLAN["embed"]},
}


def refused(context: Any) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (context.world_size,), mesh_dim_names=("tp",))
    report: dict[str, Any] = {}
    for where in ("meta", "cpu"):
        for name, plan in APART.items():
            if where == "meta":
                with torch.device("meta"):
                    model = TiedLM()
            else:
                model = built_alone()
            before = dict(model.named_parameters(remove_duplicate=False))
            values = {n: p.detach().clone() for n, p in before.items()}
            seen: dict[str, Any] = {}
            try:
                accel.distributed.parallelize_tied(model, plan(), mesh=mesh)
            except accel.WeightTyingError as exc:
                seen["error"] = str(exc)
                seen["broken_groups"] = [list(group) for group in exc.broken_groups]
            after = dict(model.named_parameters(remove_duplicate=False))
            seen["same_objects"] = after.keys() == before.keys() and all(
                after[n] is p for n, p in before.items()
            )
            seen["dtensors"] = [n for n, p in after.items() if isinstance(p, DTensor)]
            seen["hooks"] = sum(
                len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()
            )
            seen["tied"] = is_tied(model)
            seen["values_kept"] = where == "meta" or all(
                torch.equal(p, values[n]) for n, p in after.items()
            )
            report[f"{where}/{name}"] = seen
    return report


def on_mesh(context: Any, dp: int, tp: int) -> dict[str, Any]:
    acc = context.accelerator
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = build_on_mesh(acc, mesh)
    report: dict[str, Any] = {
        "tied_built": is_tied(model),
        "placements": str(model.embed.weight.placements),
        "start": gathered(model),
    }
    losses, report["tied_every_step"] = train(model, adamw(model), batches(STEPS), mesh)
    report["losses"], report["end"] = losses, gathered(model)
    alone = built_alone()
    report["alone_start"] = gathered(alone)
    report["alone_losses"], _ = train(alone, adamw(alone), batches(STEPS))
    report["alone_end"] = gathered(alone)
    return report


def main() -> int:
    report_dir = Path(sys.argv[1])
    context = accel.distributed.init_process_group("cpu", timeout=60)
    report = {
        "tie": tie(context),
        "refused": refused(context),
        "mesh-1x2": on_mesh(context, 1, 2),
        "mesh-2x1": on_mesh(context, 2, 1),
    }
    torch.save(report, report_dir / f"rank{context.rank}.pt")
    accel.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
