"""Which device each worker of a job trains on."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import accel
from accel import Accelerator
from accel._util.names import VISIBILITY_VARIABLES
from accel._util.notes import add_note
from accel.distributed._backends import device_backends
from accel.distributed._errors import DistributedSetupError
from accel.errors import AcceleratorError

if TYPE_CHECKING:
    from accel.accelerator import Accelerator
    from accel.distributed._launchers import LaunchEnvironment
    from accel.registry import AcceleratorRegistry

__all__ = ["local_accelerator", "resolve_accelerator"]


def local_accelerator(
    accelerator: Accelerator | str | None,
    environment: LaunchEnvironment | None,
    *,
    registry: AcceleratorRegistry | None = None,
) -> Accelerator:
    """The accelerator handle this worker should train on.

    - ``xla`` backend (``tpu``): the accelerator's own device; the XLA runtime
      already gives every process its own devices.
    - one visible device, made visible to this worker alone (``CUDA_VISIBLE_DEVICES=3``
      under SLURM's ``--gpus-per-task`` or a Kubernetes pod): device 0, whatever
      ``LOCAL_RANK`` is, since the worker's only device is numbered 0.
    - a backend that cannot share a device between ranks (``nccl``), or any
      accelerator with several devices: device ``LOCAL_RANK`` (``cuda:1`` for local
      rank 1), so that workers on one machine never share a device.
    - otherwise (``cpu``, ``mps``): the one device, shared by the local workers.

    :param accelerator: a handle, a name (``"cuda"``), or ``None`` for
        :func:`accel.get_accelerator`'s default.
    :param environment: from :func:`read_launch_environment`; ``None`` for a
        single process, which keeps an explicit index such as ``"cuda:1"``.
    :param registry: where to look names up; default :func:`accel.default_registry`.
    :raises DistributedSetupError: an explicit device index that is not this
        worker's device.
    :raises accel.AcceleratorUnavailableError: ``LOCAL_RANK`` is beyond the device count.
    """
    acc = resolve_accelerator(accelerator, registry)
    if environment is None:
        return acc
    declared = acc.distributed_backend
    if declared == "xla":
        return acc
    count = acc.device_count()
    backends = set(device_backends(declared, acc.device.type).values())
    if count <= 1 and backends <= {"gloo"}:
        return acc  # gloo lets the machine's workers share its one device
    index = environment.local_rank
    if count == 1 and _visible_to_this_worker_alone(acc.device.type):
        index = 0
    if acc.index is not None and acc.index != index:
        raise DistributedSetupError(
            f"asked for {acc.name}:{acc.index}, but under {environment.launcher} this worker "
            f"has LOCAL_RANK={environment.local_rank} and takes device {acc.name}:{index}, "
            f"so that no two workers share a device; pass {acc.name!r} without an index, "
            f"and choose the machine's devices with their visibility variable "
            f"(e.g. CUDA_VISIBLE_DEVICES)"
        )
    try:
        return acc.for_index(index)
    except AcceleratorError as exc:
        add_note(
            exc,
            f"accel.distributed: every worker on a machine needs its own {acc.name} "
            f"device; start no more processes per machine (--nproc-per-node) than it "
            f"has devices, or give each worker its own with CUDA_VISIBLE_DEVICES.",
        )
        raise


def _visible_to_this_worker_alone(device_type: str) -> bool:
    """A visibility variable names exactly one device: the launcher partitioned the
    machine's devices between its workers."""
    for name in VISIBILITY_VARIABLES.get(device_type, ()):
        value = os.environ.get(name)
        if value is not None and value.strip():
            return len([part for part in value.split(",") if part.strip()]) == 1
    return False


def resolve_accelerator(
    accelerator: Accelerator | str | None, registry: AcceleratorRegistry | None
) -> Accelerator:
    """A handle for ``accelerator`` (a handle, a name, or ``None`` for the default), by
    the registry's one rule for "a handle or a name" (a handle with ``registry=`` must
    be that registry's)."""
    if registry is not None:
        return registry.get_accelerator(accelerator)
    return accel.get_accelerator(accelerator)
