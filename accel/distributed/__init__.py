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

from typing import TYPE_CHECKING

from accel._util.lazy import lazy_names

if TYPE_CHECKING:
    from accel.distributed._checkpoint import load_sharded, save_sharded
    from accel.distributed._data_parallel import wrap_data_parallel
    from accel.distributed._devices import local_accelerator
    from accel.distributed._errors import DistributedSetupError
    from accel.distributed._fsdp import fully_shard_tied
    from accel.distributed._launchers import LaunchEnvironment, read_launch_environment
    from accel.distributed._process_group import (
        DistributedContext,
        current_context,
        destroy_process_group,
        init_process_group,
        process_group,
    )
    from accel.distributed._spmd import (
        SpmdContext,
        current_spmd_context,
        init_spmd,
        shard_batch,
        spmd_fully_shard_tied,
    )
    from accel.distributed._tensor_parallel import parallelize_tied

__all__ = [
    "DistributedContext",
    "DistributedSetupError",
    "LaunchEnvironment",
    "SpmdContext",
    "current_context",
    "current_spmd_context",
    "destroy_process_group",
    "fully_shard_tied",
    "init_process_group",
    "init_spmd",
    "load_sharded",
    "local_accelerator",
    "parallelize_tied",
    "process_group",
    "read_launch_environment",
    "save_sharded",
    "shard_batch",
    "spmd_fully_shard_tied",
    "wrap_data_parallel",
]

_DEFINED_IN = {
    "DistributedContext": "accel.distributed._process_group",
    "DistributedSetupError": "accel.distributed._errors",
    "LaunchEnvironment": "accel.distributed._launchers",
    "SpmdContext": "accel.distributed._spmd",
    "current_context": "accel.distributed._process_group",
    "current_spmd_context": "accel.distributed._spmd",
    "destroy_process_group": "accel.distributed._process_group",
    "fully_shard_tied": "accel.distributed._fsdp",
    "init_process_group": "accel.distributed._process_group",
    "init_spmd": "accel.distributed._spmd",
    "load_sharded": "accel.distributed._checkpoint",
    "local_accelerator": "accel.distributed._devices",
    "parallelize_tied": "accel.distributed._tensor_parallel",
    "process_group": "accel.distributed._process_group",
    "read_launch_environment": "accel.distributed._launchers",
    "save_sharded": "accel.distributed._checkpoint",
    "shard_batch": "accel.distributed._spmd",
    "spmd_fully_shard_tied": "accel.distributed._spmd",
    "wrap_data_parallel": "accel.distributed._data_parallel",
}

__getattr__, __dir__ = lazy_names(globals(), _DEFINED_IN, __all__)
