"""Tensor parallelism (:func:`torch.distributed.tensor.parallel.parallelize_module`)
that keeps tied weights tied.

Each style of a plan registers a new DTensor Parameter on its module, so an embedding
tied to the output layer comes out as two ``Shard(0)`` weights, and they train apart
without an error. One Parameter has one placement, so a tie can be kept only where
its slots are sharded alike (a vocabulary-parallel embedding, ``RowwiseParallel``, and
a column-parallel head, ``ColwiseParallel``, are both ``Shard(0)``). The plan is tried
first on a ``meta`` double of the model, which says each slot's placement before
anything is sharded; then the model is parallelized in the same transaction as a
move: one capture, the ties put back, one check, and the model as it was on failure.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from accel.distributed._data_parallel import check_model_on_device, running_context
from accel.distributed._errors import DistributedSetupError
from accel.distributed._process_group import DistributedContext
from accel.distributed._structure import ModuleStructure, changed_in_place
from accel.errors import AcceleratorTypeError, WeightTyingError
from accel.tying import TiedGroup, count_unique_parameters, find_tied_parameters
from accel.tying._capture import RestorePoint, transact
from accel.tying._keeping import Keeper
from accel.types import MoveContext

__all__ = ["parallelize_tied"]

Plan = ParallelStyle | Mapping[str, ParallelStyle]


def parallelize_tied(
    model: nn.Module,
    plan: Plan,
    *,
    mesh: DeviceMesh | None = None,
    context: DistributedContext | None = None,
) -> nn.Module:
    """``parallelize_module(model, mesh, plan)`` with every tie of the model kept one
    DTensor Parameter.

    ``plan`` is torch's own: a ``ParallelStyle`` (``ColwiseParallel()``,
    ``RowwiseParallel()``, ``SequenceParallel()``, ...) or a dict from module names
    (wildcards as torch allows) to styles. The model may be on ``meta`` (materialize
    it afterwards with :meth:`accel.Accelerator.materialize`) or on ``context.device``.

    :param mesh: a 1-D :class:`~torch.distributed.device_mesh.DeviceMesh` (the ``tp``
        dimension of a 2-D one); ``None`` means every rank on ``context.device``'s type.
    :param context: from :func:`init_process_group`; ``None`` means the current one.
    :returns: ``model``, parallelized in place.
    :raises accel.WeightTyingError: the plan gives the slots of one tie different
        placements (named, with the plan entries to change); nothing is sharded.
    :raises DistributedSetupError: no running process group, or an XLA one.
    :raises TypeError: ``plan`` is neither a style nor a dict of styles.
    """
    context = running_context(model, context, "parallelize_tied")
    if context.backend == "xla":
        raise DistributedSetupError(
            "parallelize_tied runs torch's tensor parallelism, which torch_xla does not; on "
            "XLA devices shard with accel.distributed.init_spmd() and mark_sharding instead"
        )
    _check_plan(plan)
    check_model_on_device(model, context, meta=True)
    if mesh is None:
        mesh = init_device_mesh(context.device.type, (context.world_size,))
    groups = find_tied_parameters(model, buffers=False)
    if groups:
        check_placements(model, plan, mesh, groups)
    structure = ModuleStructure(model)
    move = MoveContext(context.accelerator.name, context.device, "error")

    def parallelize() -> tuple[nn.Module, str]:
        return parallelize_module(model, mesh, _as_torch_plan(plan)), ""

    def run(capture: RestorePoint) -> nn.Module:
        return Keeper(capture.slots(), move).keep(model, parallelize)

    return transact(model, run, _failed_note, undo=structure.restore)


def _failed_note(unrestored: list[str]) -> str:
    return (
        "accel: parallelize_tied failed; the model holds what it held before: every "
        "parameter and buffer slot, and no forward hook of the plan's styles"
    ) + changed_in_place(unrestored)


def check_placements(
    model: nn.Module, plan: Plan, mesh: DeviceMesh, groups: list[TiedGroup]
) -> None:
    """Apply ``plan`` to a ``meta`` double of ``model`` and compare the placements the
    slots of each tie get.

    :raises accel.WeightTyingError: a tie's slots would be sharded differently.
    """
    double = _meta_double(model)
    parallelize_module(double, mesh, _as_torch_plan(plan))
    placed = dict(double.named_parameters(remove_duplicate=False))
    for group in groups:
        placements = {name: _placement(placed[name]) for name in group.names}
        if len(set(placements.values())) == 1:
            continue
        slots = "; ".join(
            f"{name}: {placement} ({_entry_for(name, plan)})"
            for name, placement in placements.items()
        )
        count = count_unique_parameters(model)
        raise WeightTyingError(
            f"parallelize_tied: the tied parameters {' = '.join(group.names)} are one "
            f"Parameter, which has one placement, but the plan shards them differently: "
            f"{slots}. Change the plan so that every slot of the tie gets the same "
            f"placement: a vocabulary-parallel embedding (RowwiseParallel) tied to a "
            f"column-parallel head (ColwiseParallel) are both Shard(0), or leave both "
            f"modules out of the plan. Nothing was sharded",
            count_before=count,
            count_after=count + len(group.names) - 1,
            broken_groups=[group.names],
        )


def _meta_double(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every tensor is an empty one on ``meta`` (ties as in
    the model): the plan's placements, read at no memory cost."""
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in memo:
            empty = torch.empty_like(tensor, device="meta")
            if isinstance(tensor, nn.Parameter):
                empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = empty
    return copy.deepcopy(model, memo)


def _placement(parameter: torch.Tensor) -> str:
    if isinstance(parameter, DTensor):
        return f"{tuple(parameter.placements)} on a {parameter.device_mesh.ndim}-D mesh"
    return "not sharded (no plan entry)"


def _entry_for(name: str, plan: Plan) -> str:
    """The plan entry that shards the module holding parameter ``name``."""
    path = name.rpartition(".")[0]
    if isinstance(plan, ParallelStyle):
        return f"the plan {type(plan).__name__}"
    for key, style in plan.items():
        if fnmatch.fnmatchcase(path, key):
            return f"plan entry {key!r}: {type(style).__name__}"
    return f"no plan entry names {path!r}"


def _as_torch_plan(plan: Plan) -> ParallelStyle | dict[str, ParallelStyle]:
    return plan if isinstance(plan, ParallelStyle) else dict(plan)


def _check_plan(plan: object) -> None:
    if isinstance(plan, ParallelStyle):
        return
    if isinstance(plan, Mapping) and all(
        isinstance(key, str) and isinstance(style, ParallelStyle) for key, style in plan.items()
    ):
        return
    raise AcceleratorTypeError(
        f"parallelize_tied: plan must be a ParallelStyle (ColwiseParallel(), "
        f"RowwiseParallel(), ...) or a dict from module names to them, got "
        f"{type(plan).__name__}"
    )
