"""The XLA SPMD side of :func:`save_sharded` / :func:`load_sharded`: torch_xla's DCP
planners, which write each device's shards of a sharded XLA tensor and read them back
into place.

Under SPMD one process drives every device and there is no process group, so DCP
runs without one (``no_dist``), and the model's tensors stay on the XLA device:
``SPMDSavePlanner`` copies each shard to the CPU as it writes it, and
``SPMDLoadPlanner`` loads into the tensors that are there. Loading in place is what
keeps ties: the state dict holds the model's own Parameter objects
(``keep_vars=True``), so a tied weight is one object under both names and is
written into once per name, never replaced.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from accel.distributed._dcp_layouts import CheckedLoadPlanner
from accel.distributed._spmd import current_spmd_context

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["is_optimizer", "is_spmd", "spmd_entry", "spmd_load", "spmd_save_planner"]


def is_spmd() -> bool:
    """Whether this process runs XLA SPMD (:func:`init_spmd`, or torch_xla's own
    ``use_spmd()``). Never imports torch_xla: a process that has not imported it
    is not running SPMD."""

    if current_spmd_context() is not None:
        return True
    if "torch_xla" not in sys.modules:
        return False
    import torch_xla.runtime as xr

    return bool(xr.is_spmd())


def spmd_entry(model: nn.Module, value: Any) -> Any:
    """What DCP saves or loads for ``value`` (the model or one of its optimizers):
    their own tensors, not copies, so a load lands in place."""
    if value is model:
        return model.state_dict(keep_vars=True)
    return value.state_dict()


def spmd_load(
    model: nn.Module,
    state: Mapping[str, Any],
    app_state: dict[str, Any],
    read: Any,
) -> None:
    """Load into ``app_state`` in place with ``read(app_state, planner)``, first giving
    every optimizer the state tensors it will be loaded into; the module is loaded
    through its own Parameters, so it keeps its device, its sharding and its ties."""

    for value in state.values():
        if is_optimizer(value) and not value.state:
            _prime(value)
    for key, value in state.items():  # again: priming created the state tensors
        if is_optimizer(value):
            app_state[key] = spmd_entry(model, value)
    with torch.no_grad():  # the Parameters are written into, not differentiated
        read(app_state, spmd_load_planner())
    for key, value in state.items():
        if is_optimizer(value):
            # The tensors were loaded in place; this applies the param_groups (lr, ...).
            value.load_state_dict(app_state[key])


def spmd_save_planner() -> Any:
    """torch_xla's save planner, once no execution writes the state any more."""
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    _settle()
    return SPMDSavePlanner()


def _settle() -> None:
    """Run the pending graph and wait for every execution to end.

    torch_xla's planners read (and, loading, write) each sharded tensor's shards
    directly, and a tensor that an execution still writes raises "Trying to access XLA
    data ... while an async operation is in flight": a step's sync returns while its
    execution runs on (accel.plugins._xla_cut).
    """
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    xm.wait_device_ops()


def spmd_load_planner() -> Any:
    """torch_xla's load planner, reading pickled entries ``weights_only`` (as
    :meth:`Accelerator.load` does), so nothing in the checkpoint runs; an entry the
    checkpoint lacks is an :class:`AcceleratorKeyError` naming it."""
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner

    _settle()

    class WeightsOnlySPMDLoadPlanner(CheckedLoadPlanner, SPMDLoadPlanner):  # type: ignore[misc]
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            data = value.getvalue()
            torch.load(io.BytesIO(data), weights_only=True)  # raises on anything unsafe
            super().load_bytes(read_item, io.BytesIO(data))

    return WeightsOnlySPMDLoadPlanner()


def _prime(optimizer: torch.optim.Optimizer) -> None:
    """Create ``optimizer``'s state (AdamW's moments, ...) so DCP has tensors to load
    into: a step with zero gradients. It may move the parameters (weight decay), but
    the load overwrites them next."""
    from torch_xla.experimental.distributed_checkpoint import prime_optimizer

    grads = [(p, p.grad) for group in optimizer.param_groups for p in group["params"]]
    prime_optimizer(optimizer)
    for parameter, grad in grads:
        parameter.grad = grad  # the run's own gradients (usually None), as before


def is_optimizer(value: object) -> bool:
    return isinstance(value, torch.optim.Optimizer)
