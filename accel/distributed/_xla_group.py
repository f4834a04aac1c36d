"""The ``xla`` process group: torch_xla's DDP backend, one process per replica."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from accel.distributed._backends import memory_store
from accel.distributed._errors import DistributedSetupError

if TYPE_CHECKING:
    from accel.distributed._launchers import LaunchEnvironment

__all__ = ["start_xla_group"]


def start_xla_group(
    environment: LaunchEnvironment | None, timeout: datetime.timedelta | None
) -> None:
    """Start the ``xla`` group: in memory for one replica, else through ``xla://``.

    :raises DistributedSetupError: the runtime is in SPMD mode, or it does not see
        the processes the launcher started.
    """
    import torch_xla.runtime as xr

    if xr.is_spmd():
        # torch_xla's backend would fail with a bare AssertionError.
        raise DistributedSetupError(
            "the XLA runtime is in SPMD mode (torch_xla.runtime.use_spmd() was called), "
            "where one process drives every device and there is no 'xla' process group; "
            "use accel.distributed.init_spmd() for data parallelism over the devices and "
            "accel.distributed.shard_batch() for the batches, instead of "
            "init_process_group() and wrap_data_parallel()"
        )
    import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)

    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if environment is None and xr.world_size() <= 1:
        dist.init_process_group("xla", store=memory_store(), rank=0, world_size=1, **options)
        return
    # torch_xla's own rendezvous takes rank and world size from the XLA runtime: under
    # a launcher, and under torch_xla.launch (which sets no launcher variables).
    dist.init_process_group("xla", init_method="xla://", **options)
    if environment is None:
        return
    seen = (dist.get_rank(), dist.get_world_size())
    expected = (environment.rank, environment.world_size)
    if seen != expected:
        # Left alone, every process would train as its own world of one, unsynchronised.
        dist.destroy_process_group()
        raise DistributedSetupError(
            f"{environment.launcher} started rank {expected[0]} of {expected[1]} processes, "
            f"but the XLA runtime sees rank {seen[0]} of {seen[1]}: its PJRT client does "
            f"not join separate processes into one job (torch_xla's XLA:CPU client does "
            f"not). Use the 'cpu' accelerator (gloo) for multi-process training on the CPU, "
            f"or run on a runtime that does (TPU)"
        )
