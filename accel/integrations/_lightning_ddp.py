"""Multi-process Lightning strategies: DDP through :mod:`accel.distributed`.

One process per device, launched the way Lightning launches (its subprocess
launcher, which re-runs the script; or ``start_method="spawn"``). Each process
starts the process group with :func:`accel.distributed.init_process_group` (the
accelerator's own backend and this worker's device), moves the model with
:meth:`accel.Accelerator.model_to_device` (ties intact) and wraps it with
:func:`accel.distributed.wrap_data_parallel`; each step is
:meth:`accel.Accelerator.optimizer_step`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.strategies.ddp import DDPStrategy as FabricDDPStrategy
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy as TrainerDDPStrategy

import accel
import accel.distributed
from accel.integrations._lightning_base import AccelStrategyBase
from accel.integrations._lightning_strategies import FabricMoves, TrainerMoves

if TYPE_CHECKING:
    from torch.nn import Module
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["AccelDDPStrategy", "AccelFabricDDPStrategy", "DistributedMoves"]

_StartMethod = Literal["popen", "spawn", "fork", "forkserver"]


class DistributedMoves(AccelStrategyBase):
    """Starting the group through accel and wrapping the model in accel's DDP."""

    single_device = False

    if TYPE_CHECKING:
        cluster_environment: ClusterEnvironment | None
        local_rank: int
        global_rank: int
        world_size: int
        num_processes: int
        _timeout: timedelta | None
        _ddp_kwargs: dict[str, Any]
        _process_group_backend: str | None

    #: This process's place in the job, once the group runs.
    accel_context: accel.distributed.DistributedContext | None = None

    def _process_index(self) -> int:
        return self.local_rank

    def start_process_group(self) -> None:
        """Start (or join) the process group with accel, for this worker's device.

        :raises accel.distributed.DistributedSetupError: accel chose another device
            for this worker than Lightning's ``devices=`` did.
        """
        environment = self.cluster_environment
        assert environment is not None, "Lightning sets the cluster environment first"
        handle = self.lightning_accelerator().handle()
        expected = self.root_device
        with _launch_variables(environment, self.local_rank, self.num_processes):
            context = accel.distributed.init_process_group(handle, timeout=self._timeout)
        if context.device != expected:
            accel.distributed.destroy_process_group(barrier=False)
            raise accel.distributed.DistributedSetupError(
                f"Lightning put local rank {self.local_rank} on {expected}, but "
                f"accel.distributed gives this worker {context.device} (device LOCAL_RANK "
                f"of {handle.name!r}, so that no two workers share one); pass devices=N "
                f"(the first N devices) rather than a list of indices, and choose the "
                f"machine's devices with their visibility variable (CUDA_VISIBLE_DEVICES)"
            )
        self.accel_context = context
        self._process_group_backend = context.backend

    def accel_handle(self) -> accel.Accelerator:
        if self.accel_context is not None:
            return self.accel_context.accelerator
        return super().accel_handle()

    def wrap(self, module: Module) -> DistributedDataParallel:
        """``module``, on this worker's device, in accel's DDP."""
        _stop_sharing_host_memory(module)
        return accel.distributed.wrap_data_parallel(module, self.accel_context, **self._ddp_kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # The context holds an accel handle and belongs to this process's group: a
        # spawned process starts its own.
        state = dict(self.__dict__)
        state.pop("accel_context", None)
        return state


class AccelDDPStrategy(DistributedMoves, TrainerMoves, TrainerDDPStrategy):
    """A Trainer strategy for one process per device, through accel.

    ``Trainer(strategy=AccelDDPStrategy("cpu"), devices=2)`` runs two processes (on
    ``cpu``, which they share over gloo; on an accelerator with devices, one each).
    Lightning launches them: by re-running the script (``start_method="popen"``, the
    default) or with ``"spawn"``. The process group is accel's
    (:func:`accel.distributed.init_process_group`: the accelerator's backend and this
    worker's device), the model moves with accel and is wrapped with
    :func:`accel.distributed.wrap_data_parallel`, each step is
    :meth:`accel.Accelerator.optimizer_step`, checkpoints go through
    :class:`AccelCheckpointIO`.

    :param accelerator: as for :class:`AccelStrategy`.
    :param registry: the accel registry to select a named accelerator from (with
        ``"spawn"``, only accelerators of the default registry can be pickled).
    :param lightning_arguments: passed on to Lightning's DDP strategy: its own
        (``cluster_environment=``, ``checkpoint_io=``, ``precision_plugin=`` or
        ``precision=``, ``timeout=``, ``start_method=``) and DistributedDataParallel's.
    """

    strategy_name = "accel_ddp"

    def setup_distributed(self) -> None:
        reset_seed()  # as Lightning's DDP: seed_everything's seed again, in this process
        self.set_world_ranks()
        self.start_process_group()

    def _setup_model(self, model: Module) -> DistributedDataParallel:
        return self.wrap(model)

    def determine_ddp_device_ids(self) -> list[int] | None:
        return None if self.root_device.type == "cpu" else [self.root_device.index or 0]


class AccelFabricDDPStrategy(DistributedMoves, FabricMoves, FabricDDPStrategy):
    """A Fabric strategy for one process per device, through accel.

    ``Fabric(strategy=AccelFabricDDPStrategy("cpu"), devices=2)``, then
    ``fabric.launch()`` (it re-runs the script) or ``fabric.launch(function)`` with
    ``start_method="spawn"``. As :class:`AccelDDPStrategy` for the Trainer:
    accel's process group, moves, DDP, optimizer step and checkpoints;
    ``fabric.setup(model, optimizer)`` keeps ties and re-points the optimizer.

    :param accelerator: as for :class:`AccelFabricStrategy`.
    :param registry: the accel registry to select a named accelerator from.
    :param lightning_arguments: passed on to Lightning's DDP strategy: its own
        (``cluster_environment=``, ``checkpoint_io=``, ``precision_plugin=`` or
        ``precision=``, ``timeout=``, ``start_method=``) and DistributedDataParallel's.
    """

    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        self.start_process_group()

    def setup_module(self, module: Module) -> DistributedDataParallel:
        self._before_move = None
        return self.wrap(module)

    def _determine_ddp_device_ids(self) -> list[int] | None:
        return None if self.root_device.type == "cpu" else [self.root_device.index or 0]


def _stop_sharing_host_memory(module: Module) -> None:
    """Give this process its own copy of host tensors it shares with others.

    ``spawn`` hands the model to each process through torch.multiprocessing, which
    puts CPU tensors in shared memory: every rank would then step the same weights
    (Lightning undoes this for its own CPU accelerator only). Each Parameter keeps
    its identity, so ties and optimizers built on it stay as they are.
    """
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.device.type == "cpu" and tensor.untyped_storage().is_shared():
                tensor.data = tensor.data.clone()


@contextmanager
def _launch_variables(
    environment: ClusterEnvironment, local_rank: int, local_world_size: int
) -> Iterator[None]:
    """torchrun's variables from Lightning's cluster environment, for as long as the
    group takes to start; the environment is as it was afterwards."""
    values = {
        "RANK": str(environment.global_rank()),
        "WORLD_SIZE": str(environment.world_size()),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": environment.main_address,
        "MASTER_PORT": str(environment.main_port),
    }
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
