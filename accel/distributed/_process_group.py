"""Starting, adopting and tearing down the :mod:`torch.distributed` process group."""

from __future__ import annotations

import contextlib
import datetime
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accel.distributed._backends import device_backends, group_backend, memory_store
from accel.distributed._devices import local_accelerator
from accel.distributed._errors import DistributedSetupError
from accel.distributed._launchers import LaunchEnvironment, read_launch_environment
from accel.distributed._restarts import attempt_store
from accel.distributed._xla_group import start_xla_group
from accel.errors import AcceleratorValueError
from accel.training.checkpoint._async_save import wait_for_saves
from accel.training.checkpoint._early_signals import note_early_signals

if TYPE_CHECKING:
    import torch

    from accel.accelerator import Accelerator
    from accel.registry import AcceleratorRegistry

__all__ = [
    "DistributedContext",
    "current_context",
    "destroy_process_group",
    "init_process_group",
    "process_group",
]


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the job, returned by :func:`init_process_group`."""

    #: Global rank of this process.
    rank: int
    #: Number of processes in the job.
    world_size: int
    #: Rank of this process on its machine.
    local_rank: int
    #: The accelerator's :mod:`torch.distributed` backend, e.g. ``"gloo"`` or ``"nccl"``
    #: (a ``nccl`` group also carries CPU tensors over gloo: ``"cpu:gloo,cuda:nccl"``).
    backend: str
    #: The device this process trains on, e.g. ``cuda:1`` for local rank 1.
    device: torch.device
    #: The handle for :attr:`device`: move the model and batches with it.
    accelerator: Accelerator
    #: Set up from a launcher's variables (``False``: a single process, world size 1).
    launched: bool
    #: The launcher that started the job (``"torchrun"``, ``"slurm"``, ``"openmpi"``),
    #: ``None`` for a single process.
    launcher: str | None = None

    @property
    def is_main(self) -> bool:
        """This is rank 0, the process that should log and save checkpoints."""
        return self.rank == 0


_lock = threading.Lock()
_active: DistributedContext | None = None


def current_context() -> DistributedContext | None:
    """The context of the process group :func:`init_process_group` set up, if any."""
    return _active


def init_process_group(
    accelerator: Accelerator | str | None = None,
    *,
    timeout: datetime.timedelta | float | None = None,
    registry: AcceleratorRegistry | None = None,
) -> DistributedContext:
    """Start the :mod:`torch.distributed` process group for ``accelerator``; idempotent.

    Under torchrun, SLURM's ``srun`` or Open MPI's ``mpirun`` it reads the launcher's
    variables (see :func:`read_launch_environment`). With none set it runs as a single
    process: rank 0 of a world of size 1, its rendezvous in memory (no port), so the
    same script runs alone and launched. On XLA (``tpu``) a runtime with several
    replicas (``torch_xla.launch``) uses torch_xla's ``xla://`` rendezvous even
    without a launcher's variables.

    Calling it again returns the same context while the group runs. A group started
    by other code is adopted when its backend matches.

    :param accelerator: a handle, a name, or ``None`` for :func:`accel.get_accelerator`'s
        default. Its ``distributed_backend`` names the backend; the device is chosen
        per worker (see :func:`local_accelerator`).
    :param timeout: for collectives and the rendezvous, as a timedelta or seconds;
        ``None`` keeps torch's default.
    :param registry: where to look names up; default :func:`accel.default_registry`.
    :raises DistributedSetupError: half-set or invalid launcher variables, a group
        already running with another backend or accelerator, (XLA) a runtime that
        does not see the processes the launcher started, or one in SPMD mode, which
        has no process group (use :func:`init_spmd`).
    """
    global _active

    note_early_signals()  # a preemption signal from here on is noted for the guard
    timeout_delta = _as_timedelta(timeout)
    if not dist.is_available():
        raise DistributedSetupError(
            "this torch build has no torch.distributed support; install a build with "
            "distributed support (the official Linux wheels have it)"
        )
    environment = read_launch_environment()
    acc = local_accelerator(accelerator, environment, registry=registry)
    backend = acc.distributed_backend
    with _lock:
        if dist.is_initialized():
            return _existing_context(acc, backend, environment)
        _active = None
        if backend == "xla":
            start_xla_group(environment, timeout_delta)
        else:
            _start_group(acc, environment, timeout_delta)
        _active = _running_context(acc, backend, environment)
        return _active


def _as_timedelta(timeout: datetime.timedelta | float | None) -> datetime.timedelta | None:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise AcceleratorValueError(
            f"timeout must be a positive number of seconds or a datetime.timedelta, got {timeout!r}"
        )
    return datetime.timedelta(seconds=timeout)


def _start_group(
    acc: Accelerator,
    environment: LaunchEnvironment | None,
    timeout: datetime.timedelta | None,
) -> None:
    backend = group_backend(acc)
    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if acc.device.type == "cuda":
        # NCCL binds a rank to the current device; set it before any collective runs.
        torch.cuda.set_device(acc.device)
        options["device_id"] = acc.device
    if environment is None:
        dist.init_process_group(backend, store=memory_store(), rank=0, world_size=1, **options)
        return
    if environment.launcher == "torchrun":
        # The store torchrun's agent runs, under this attempt's prefix (a restarted
        # job must not read the keys of the attempt before); else env:// joins it.
        store = attempt_store(environment, timeout)
        if store is None:
            options["init_method"] = "env://"
        else:
            options["store"] = store
    else:
        host = environment.master_addr
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        options["init_method"] = f"tcp://{host}:{environment.master_port}"
    try:
        dist.init_process_group(
            backend, rank=environment.rank, world_size=environment.world_size, **options
        )
    except RuntimeError as error:  # torch's DistNetworkError is a RuntimeError
        if not _port_in_use(error):
            raise
        note = _port_in_use_note(environment)
        if sys.version_info >= (3, 11):
            # Keep torch's type catchable (DistNetworkError), with accel's word added.
            error.add_note(note)
            raise
        raise DistributedSetupError(f"{error}\n{note}") from error


def _port_in_use(error: BaseException) -> bool:
    text = str(error)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


_LAUNCHER_NAMES = {"slurm": "SLURM (srun)", "openmpi": "Open MPI (mpirun)"}
_PORT_HINTS = {
    "slurm": "`export MASTER_PORT=PORT` before `srun` (srun passes it to every task)",
    "openmpi": "`mpirun -x MASTER_PORT=PORT ...` (or export it before mpirun)",
}


def _port_in_use_note(environment: LaunchEnvironment) -> str:
    """What accel knows and torch does not: which launcher, where the port came from."""
    how = _PORT_HINTS.get(environment.launcher, "`MASTER_PORT=PORT` for every rank")
    launcher = _LAUNCHER_NAMES.get(environment.launcher, environment.launcher)
    return (
        f"accel: rank {environment.rank} could not open the rendezvous store on "
        f"{environment.master_addr}:{environment.master_port}: the port is in use (another "
        f"job, or an earlier run still holding it). Under {launcher} the port "
        f"came from {environment.master_port_source}; set MASTER_PORT to a free port for "
        f"every rank: {how}"
    )


def _existing_context(
    acc: Accelerator, backend: str, environment: LaunchEnvironment | None
) -> DistributedContext:
    global _active

    running = str(dist.get_backend())
    wanted = group_backend(acc)
    if not _backend_matches(running, wanted, acc.device.type):
        raise DistributedSetupError(
            f"a process group is already running with backend {running!r}, but "
            f"{acc.name!r} needs {wanted!r}; call accel.distributed.destroy_process_group() "
            f"first to switch"
        )
    if _active is not None:
        if _active.accelerator.name != acc.name or _active.device != acc.device:
            raise DistributedSetupError(
                f"the process group is already set up for {_active.accelerator.name!r} on "
                f"{_active.device}, not {acc.name!r} on {acc.device}; call "
                f"accel.distributed.destroy_process_group() first to switch"
            )
        return _active
    # Started by other code (e.g. a trainer): adopt it rather than start a second one.
    _active = _running_context(acc, backend, environment)
    return _active


def _backend_matches(running: str, wanted: str, device_type: str) -> bool:
    """The running group carries the accelerator's tensors (or, for a device no
    backend carries, such as ``mps``, the CPU's) with the backend it needs."""
    wanted_map = device_backends(wanted, device_type)
    key = device_type if device_type in wanted_map else "cpu"
    return device_backends(running, device_type).get(key) == wanted_map.get(key)


def _running_context(
    acc: Accelerator, backend: str, environment: LaunchEnvironment | None
) -> DistributedContext:
    """The context of the process group now running, for ``acc``."""

    return DistributedContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=0 if environment is None else environment.local_rank,
        backend=backend,
        device=acc.device,
        accelerator=acc,
        launched=environment is not None,
        launcher=None if environment is None else environment.launcher,
    )


def destroy_process_group(*, barrier: bool = True) -> bool:
    """Tear down the process group, whoever started it; safe to call when none runs.

    :param barrier: first wait for every rank to get here. Without it, a rank that
        finishes early can close the rendezvous store while another is still tearing
        down, and gloo then aborts that process ("terminate called without an active
        exception"). Pass ``False`` when a rank may have died, so teardown never waits.
    :returns: whether a group was running.
    :raises OSError: the pending asynchronous save failed (its ranks talk over the
        group, so it is finished first, with ``barrier``); the group still runs.
    """
    global _active

    if barrier:
        wait_for_saves()
    with _lock:
        _active = None
        if not (dist.is_available() and dist.is_initialized()):
            return False
        if barrier and dist.get_world_size() > 1:
            with contextlib.suppress(Exception):  # a dead peer must not block teardown
                dist.barrier()
        dist.destroy_process_group()
        return True


@contextmanager
def process_group(
    accelerator: Accelerator | str | None = None,
    *,
    timeout: datetime.timedelta | float | None = None,
    registry: AcceleratorRegistry | None = None,
) -> Iterator[DistributedContext]:
    """:func:`init_process_group` for a ``with`` block, torn down when it ends::

    with accel.distributed.process_group("cpu") as context:
        train(context)
    """
    context = init_process_group(accelerator, timeout=timeout, registry=registry)
    try:
        yield context
    finally:
        destroy_process_group()
