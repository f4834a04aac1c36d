"""The documented large-model recipe (examples/large_models/train_2d.py) in the pieces
that tests/distributed/test_large_models.py and its workers share: the recipe's tied
LM, plan and data; the model built on ``meta`` over a dp x tp mesh; a few AdamW steps;
and everything gathered whole, to compare across meshes."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed
from torch import nn

import accel.distributed

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "large_models" / "train_2d.py"


def _load_recipe() -> Any:
    # Loaded from its file, as the docs page includes it: the examples are no package.
    spec = importlib.util.spec_from_file_location("large_models_recipe", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recipe = _load_recipe()
TiedLM: type[nn.Module] = recipe.TiedLM
PLAN: dict[str, Any] = recipe.PLAN
LR = 1e-2  # the recipe's AdamW


def batches(steps: int) -> list[torch.Tensor]:
    """The recipe's tokens: the same on every rank, whatever the mesh."""
    return recipe.batches(steps)  # type: ignore[no-any-return]


def build_on_mesh(acc: Any, mesh: Any, *, load: Any = None) -> nn.Module:
    """The recipe: built on ``meta``, ``parallelize_tied`` on ``tp``, ``fully_shard_tied``
    on ``dp``, then materialized (seeded, or filled from ``load``)."""
    with torch.device("meta"):
        model = TiedLM()
    model = accel.distributed.parallelize_tied(model, PLAN, mesh=mesh["tp"])
    model = accel.distributed.fully_shard_tied(model, model.blocks, mesh=mesh["dp"])
    if load is None:
        acc.manual_seed(0)  # the values of TiedLM() after torch.manual_seed(0)
    return acc.materialize(model, load=load)


def built_alone() -> nn.Module:
    """The one-process model: eager, on the CPU, seeded as the recipe's ``--eager``."""
    torch.manual_seed(0)
    return TiedLM()


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR)


def is_tied(model: nn.Module) -> bool:
    return model.head.weight is model.embed.weight  # type: ignore[union-attr]


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: Sequence[torch.Tensor],
    mesh: Any = None,
) -> tuple[torch.Tensor, bool]:
    """Train on ``tokens`` as the recipe does: each dp rank its share of every batch.

    :returns: the loss of each step (the mean over the whole batch, on every rank),
        and whether the embedding and the head were one Parameter after every step.
    """
    dp_rank, dp_size = (0, 1) if mesh is None else (mesh["dp"].get_local_rank(), mesh["dp"].size())
    losses, tied = [], is_tied(model)
    for batch in tokens:
        mine = batch.chunk(dp_size)[dp_rank]
        logits = model(mine[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), mine[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        if mesh is not None:
            torch.distributed.all_reduce(total, group=mesh["dp"].get_group())
        losses.append(total / dp_size)
        tied = tied and is_tied(model)
    return torch.stack(losses), tied


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor shard gathered (a collective: every rank calls it)."""
    gather = getattr(tensor, "full_tensor", None)
    return (gather() if callable(gather) else tensor).detach().clone()


def gathered(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Every parameter under every name (a tie under both), and each parameter's AdamW
    moments and step under its first name: whole tensors, the same on every rank."""
    found: dict[str, Any] = {
        name: full(p) for name, p in model.named_parameters(remove_duplicate=False)
    }
    if optimizer is not None:
        for name, p in model.named_parameters():
            for key, value in optimizer.state[p].items():
                found[f"{name}.{key}"] = full(value)
    return found
