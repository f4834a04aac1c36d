"""Training on several devices: :mod:`torch.distributed` and torch_xla's SPMD, set up
for the chosen accelerator.

accel does not run processes or move gradients itself. It reads the environment a
launcher (``torchrun``, SLURM's ``srun``, Open MPI's ``mpirun``) gives every worker,
starts the process group with the backend the accelerator declares, picks this
worker's device, and wraps a model that :meth:`accel.Accelerator.model_to_device`
moved (ties intact) in DDP, or shards it with FSDP2 keeping its ties. On XLA devices
driven by one process it sets up SPMD data parallelism instead. Example::

    import accel.distributed

    context = accel.distributed.init_process_group("cpu")  # launched, or alone: world 1
    model = context.accelerator.model_to_device(model)
    ddp = accel.distributed.wrap_data_parallel(model, context)
    ...  # train ddp as usual
    accel.distributed.destroy_process_group()

Importing this package does not import torch; the functions do.
"""

from __future__ import annotations

from accel.distributed._checkpoint import load_sharded, save_sharded
from accel.distributed._data_parallel import wrap_data_parallel
from accel.distributed._devices import local_accelerator
from accel.distributed._errors import DistributedSetupError
from accel.distributed._fsdp import fully_shard_tied
from accel.distributed._launchers import (
    DEFAULT_MASTER_PORT,
    OPENMPI_VARIABLES,
    SLURM_VARIABLES,
    TORCHRUN_VARIABLES,
    LaunchEnvironment,
    TorchrunEnvironment,
    read_launch_environment,
    read_torchrun_environment,
)
from accel.distributed._process_group import (
    DistributedContext,
    current_context,
    destroy_process_group,
    init_process_group,
    process_group,
)
from accel.distributed._spmd import SpmdContext, current_spmd_context, init_spmd, shard_batch

__all__ = [
    "DEFAULT_MASTER_PORT",
    "OPENMPI_VARIABLES",
    "SLURM_VARIABLES",
    "TORCHRUN_VARIABLES",
    "DistributedContext",
    "DistributedSetupError",
    "LaunchEnvironment",
    "SpmdContext",
    "TorchrunEnvironment",
    "current_context",
    "current_spmd_context",
    "destroy_process_group",
    "fully_shard_tied",
    "init_process_group",
    "init_spmd",
    "load_sharded",
    "local_accelerator",
    "process_group",
    "read_launch_environment",
    "read_torchrun_environment",
    "save_sharded",
    "shard_batch",
    "wrap_data_parallel",
]
