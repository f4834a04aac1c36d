"""Data-parallel training on :mod:`torch.distributed`, set up for the chosen accelerator.

accel does not run processes or move gradients itself: it reads the environment
``torchrun`` gives every worker, starts the process group with the backend the
accelerator declares (``gloo`` for ``cpu``, ``nccl`` for ``cuda``, ``xla`` for
``tpu``), picks this worker's device, and wraps a model that
:meth:`accel.Accelerator.model_to_device` moved (ties intact) in the engine's own
:class:`~torch.nn.parallel.DistributedDataParallel`. Example::

    import accel.distributed

    context = accel.distributed.init_process_group("cpu")  # torchrun, or alone: world 1
    model = context.accelerator.model_to_device(model)
    ddp = accel.distributed.wrap_data_parallel(model, context)
    ...  # train ddp as usual
    accel.distributed.destroy_process_group()

Importing this module does not import torch; the functions do.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from accel.errors import AcceleratorError

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from accel.accelerator import Accelerator
    from accel.registry import AcceleratorRegistry

__all__ = [
    "TORCHRUN_VARIABLES",
    "DistributedContext",
    "DistributedSetupError",
    "TorchrunEnvironment",
    "current_context",
    "destroy_process_group",
    "init_process_group",
    "local_accelerator",
    "process_group",
    "read_torchrun_environment",
    "wrap_data_parallel",
]

#: The variables ``torchrun`` sets for every worker; accel needs all of them or none.
TORCHRUN_VARIABLES: Final = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

_LAUNCH_HINT: Final = (
    "launch with `torchrun --nproc-per-node N script.py` (it sets all of them), set every "
    "one yourself, or unset them all to run as a single process (world size 1)"
)


class DistributedSetupError(AcceleratorError, RuntimeError):
    """The process group cannot be set up as asked: a half-set or invalid launch
    environment, a group already running with another backend, or a runtime that
    does not see the processes the launcher started."""

    def __init__(self, message: str, *, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        #: The torchrun variables that were expected but not set (empty if none).
        self.missing = missing


@dataclass(frozen=True)
class TorchrunEnvironment:
    """What ``torchrun`` told this worker, validated (see :func:`read_torchrun_environment`)."""

    #: Global rank of this process, ``0 <= rank < world_size``.
    rank: int
    #: Number of processes in the job.
    world_size: int
    #: Rank of this process on its machine; selects the device (``cuda:LOCAL_RANK``).
    local_rank: int
    #: Address of the rank-0 host.
    master_addr: str
    #: Port of the rendezvous store on the rank-0 host.
    master_port: int
    #: Processes on this machine (``$LOCAL_WORLD_SIZE``), ``None`` when not set.
    local_world_size: int | None = None


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the job, returned by :func:`init_process_group`."""

    #: Global rank of this process.
    rank: int
    #: Number of processes in the job.
    world_size: int
    #: Rank of this process on its machine.
    local_rank: int
    #: The :mod:`torch.distributed` backend of the process group, e.g. ``"gloo"``.
    backend: str
    #: The device this process trains on, e.g. ``cuda:1`` for local rank 1.
    device: torch.device
    #: The handle for :attr:`device`: move the model and batches with it.
    accelerator: Accelerator
    #: Set up from torchrun's variables (``False``: a single process, world size 1).
    launched: bool

    @property
    def is_main(self) -> bool:
        """This is rank 0, the process that should log and save checkpoints."""
        return self.rank == 0


_lock = threading.Lock()
_active: DistributedContext | None = None


def read_torchrun_environment(
    environ: Mapping[str, str] | None = None,
) -> TorchrunEnvironment | None:
    """Read and check torchrun's variables (:data:`TORCHRUN_VARIABLES`).

    :param environ: where to read them; ``None`` means :data:`os.environ`.
    :returns: the environment, or ``None`` when none of the variables is set (a
        process started without a launcher).
    :raises DistributedSetupError: some are set and some are not, or a value is not
        usable (not an integer, rank beyond the world size, port out of range).
    """
    env = os.environ if environ is None else environ
    present = {name: env[name] for name in TORCHRUN_VARIABLES if env.get(name, "").strip()}
    if not present:
        return None
    missing = tuple(name for name in TORCHRUN_VARIABLES if name not in present)
    if missing:
        found = ", ".join(f"{name}={value!r}" for name, value in present.items())
        raise DistributedSetupError(
            f"the torchrun environment is half set: found {found} but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; "
            f"{_LAUNCH_HINT}",
            missing=missing,
        )
    rank = _int_variable(present, "RANK", minimum=0)
    world_size = _int_variable(present, "WORLD_SIZE", minimum=1)
    local_rank = _int_variable(present, "LOCAL_RANK", minimum=0)
    master_port = _int_variable(present, "MASTER_PORT", minimum=1)
    if rank >= world_size:
        raise DistributedSetupError(
            f"RANK={rank} is not below WORLD_SIZE={world_size}: ranks run from 0 to "
            f"{world_size - 1}; {_LAUNCH_HINT}"
        )
    if master_port > 65535:
        raise DistributedSetupError(
            f"MASTER_PORT={master_port} is not a TCP port (1 to 65535); pick a free port"
        )
    local_world_size = None
    if env.get("LOCAL_WORLD_SIZE", "").strip():
        local_world_size = _int_variable(env, "LOCAL_WORLD_SIZE", minimum=1)
        if local_rank >= local_world_size:
            raise DistributedSetupError(
                f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world_size}; "
                f"{_LAUNCH_HINT}"
            )
    return TorchrunEnvironment(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        master_addr=present["MASTER_ADDR"].strip(),
        master_port=master_port,
        local_world_size=local_world_size,
    )


def _int_variable(env: Mapping[str, str], name: str, *, minimum: int) -> int:
    text = env[name].strip()
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise DistributedSetupError(
            f"{name}={env[name]!r} is not an integer >= {minimum}; {_LAUNCH_HINT}"
        )
    return value


def local_accelerator(
    accelerator: Accelerator | str | None,
    environment: TorchrunEnvironment | None,
    *,
    registry: AcceleratorRegistry | None = None,
) -> Accelerator:
    """The accelerator handle this worker should train on.

    - ``xla`` backend (``tpu``): the accelerator's own device; the XLA runtime
      already gives every process its own devices.
    - ``nccl`` backend (``cuda``), or any accelerator with several devices:
      device ``LOCAL_RANK`` (``cuda:1`` for local rank 1), so that workers on one
      machine never share a device.
    - otherwise (``cpu``, ``mps``): the one device, shared by the local workers.

    :param accelerator: a handle, a name (``"cuda"``), or ``None`` for
        :func:`accel.get_accelerator`'s default.
    :param environment: from :func:`read_torchrun_environment`; ``None`` for a
        single process, which keeps an explicit index such as ``"cuda:1"``.
    :param registry: where to look names up; default :func:`accel.default_registry`.
    :raises DistributedSetupError: an explicit device index that is not this
        worker's ``LOCAL_RANK``.
    :raises accel.AcceleratorUnavailableError: ``LOCAL_RANK`` is beyond the device count.
    """
    acc = _resolve_accelerator(accelerator, registry)
    if environment is None:
        return acc
    local_rank = environment.local_rank
    backend = acc.distributed_backend
    if backend == "xla":
        return acc
    if backend != "nccl" and acc.device_count() <= 1:
        return acc
    if acc.index is not None and acc.index != local_rank:
        raise DistributedSetupError(
            f"asked for {acc.name}:{acc.index}, but under torchrun this worker has "
            f"LOCAL_RANK={local_rank} and takes device {acc.name}:{local_rank}, so that no "
            f"two workers share a device; pass {acc.name!r} without an index, and choose "
            f"the machine's devices with their visibility variable (e.g. CUDA_VISIBLE_DEVICES)"
        )
    try:
        return acc.for_index(local_rank)
    except AcceleratorError as exc:
        if hasattr(exc, "add_note"):
            exc.add_note(
                f"accel.distributed: every worker on a machine needs its own {acc.name} "
                f"device; start no more processes per machine (--nproc-per-node) than it "
                f"has devices."
            )
        raise


def _resolve_accelerator(
    accelerator: Accelerator | str | None, registry: AcceleratorRegistry | None
) -> Accelerator:
    from accel.accelerator import Accelerator

    if isinstance(accelerator, Accelerator):
        return accelerator
    if accelerator is not None and not isinstance(accelerator, str):
        raise TypeError(
            f"accelerator must be an accel.Accelerator, a name such as 'cuda', or None, "
            f"got {type(accelerator).__name__}: {accelerator!r}"
        )
    if registry is None:
        from accel import default_registry

        registry = default_registry()
    return registry.get_accelerator(accelerator)


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

    Under ``torchrun`` it reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR`` and ``MASTER_PORT``. With none of them set it runs as a single
    process: rank 0 of a world of size 1, its rendezvous in memory (no port), so the
    same script runs alone and under torchrun. On XLA (``tpu``) a runtime with
    several replicas (``torch_xla.launch``) uses torch_xla's ``xla://`` rendezvous
    even without torchrun's variables.

    Calling it again returns the same context while the group runs. A group started
    by other code is adopted when its backend matches.

    :param accelerator: a handle, a name, or ``None`` for :func:`accel.get_accelerator`'s
        default. Its ``distributed_backend`` names the backend; the device is chosen
        per worker (see :func:`local_accelerator`).
    :param timeout: for collectives and the rendezvous, as a timedelta or seconds;
        ``None`` keeps torch's default.
    :param registry: where to look names up; default :func:`accel.default_registry`.
    :raises DistributedSetupError: half-set or invalid torchrun variables, a group
        already running with another backend or accelerator, or (XLA) a runtime
        that does not see the processes torchrun started.
    """
    global _active
    import torch.distributed as dist

    timeout_delta = _as_timedelta(timeout)
    if not dist.is_available():
        raise DistributedSetupError(
            "this torch build has no torch.distributed support; install a build with "
            "distributed support (the official Linux wheels have it)"
        )
    environment = read_torchrun_environment()
    acc = local_accelerator(accelerator, environment, registry=registry)
    backend = acc.distributed_backend
    with _lock:
        if dist.is_initialized():
            return _existing_context(acc, backend, environment)
        _active = None
        if backend == "xla":
            _start_xla_group(environment, timeout_delta)
        else:
            _start_group(acc, backend, environment, timeout_delta)
        _active = _running_context(acc, backend, environment)
        return _active


def _as_timedelta(timeout: datetime.timedelta | float | None) -> datetime.timedelta | None:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(
            f"timeout must be a positive number of seconds or a datetime.timedelta, got {timeout!r}"
        )
    return datetime.timedelta(seconds=timeout)


def _start_group(
    acc: Accelerator,
    backend: str,
    environment: TorchrunEnvironment | None,
    timeout: datetime.timedelta | None,
) -> None:
    import torch
    import torch.distributed as dist

    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if acc.device.type == "cuda":
        # NCCL binds a rank to the current device; set it before any collective runs.
        torch.cuda.set_device(acc.device)
        options["device_id"] = acc.device
    if environment is None:
        dist.init_process_group(backend, store=_memory_store(), rank=0, world_size=1, **options)
        return
    dist.init_process_group(
        backend,
        init_method="env://",  # MASTER_ADDR and MASTER_PORT, checked above
        rank=environment.rank,
        world_size=environment.world_size,
        **options,
    )


def _memory_store() -> Any:
    """An in-memory rendezvous store, for a world of one process: no port to collide."""
    import torch.distributed as dist

    # torch re-exports HashStore from its C extension without declaring it in __all__.
    return dist.HashStore()  # type: ignore[attr-defined]


def _start_xla_group(
    environment: TorchrunEnvironment | None, timeout: datetime.timedelta | None
) -> None:
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)
    import torch_xla.runtime as xr

    options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if environment is None and xr.world_size() <= 1:
        dist.init_process_group("xla", store=_memory_store(), rank=0, world_size=1, **options)
        return
    # torch_xla's own rendezvous takes rank and world size from the XLA runtime: under
    # torchrun, and under torch_xla.launch (which sets no torchrun variables).
    dist.init_process_group("xla", init_method="xla://", **options)
    if environment is None:
        return
    seen = (dist.get_rank(), dist.get_world_size())
    expected = (environment.rank, environment.world_size)
    if seen != expected:
        # Left alone, every process would train as its own world of one, unsynchronised.
        dist.destroy_process_group()
        raise DistributedSetupError(
            f"torchrun started rank {expected[0]} of {expected[1]} processes, but the XLA "
            f"runtime sees rank {seen[0]} of {seen[1]}: its PJRT client does not join "
            f"separate processes into one job (torch_xla's XLA:CPU client does not). Use "
            f"the 'cpu' accelerator (gloo) for multi-process training on the CPU, or run "
            f"on a runtime that does (TPU)"
        )


def _existing_context(
    acc: Accelerator, backend: str, environment: TorchrunEnvironment | None
) -> DistributedContext:
    global _active
    import torch.distributed as dist

    running = str(dist.get_backend())
    if not _backend_matches(running, backend):
        raise DistributedSetupError(
            f"a process group is already running with backend {running!r}, but "
            f"{acc.name!r} needs {backend!r}; call accel.distributed.destroy_process_group() "
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


def _running_context(
    acc: Accelerator, backend: str, environment: TorchrunEnvironment | None
) -> DistributedContext:
    """The context of the process group now running, for ``acc``."""
    import torch.distributed as dist

    return DistributedContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=0 if environment is None else environment.local_rank,
        backend=backend,
        device=acc.device,
        accelerator=acc,
        launched=environment is not None,
    )


def _backend_matches(running: str, wanted: str) -> bool:
    # A group started with backend=None reports "cpu:gloo,cuda:nccl".
    names = {part.rpartition(":")[2].strip().lower() for part in running.split(",")}
    return wanted.lower() in names


def destroy_process_group(*, barrier: bool = True) -> bool:
    """Tear down the process group, whoever started it; safe to call when none runs.

    :param barrier: first wait for every rank to get here. Without it, a rank that
        finishes early can close the rendezvous store while another is still tearing
        down, and gloo then aborts that process ("terminate called without an active
        exception"). Pass ``False`` when a rank may have died, so teardown never waits.
    :returns: whether a group was running.
    """
    global _active
    import torch.distributed as dist

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


def wrap_data_parallel(
    model: nn.Module, context: DistributedContext | None = None, **options: Any
) -> DistributedDataParallel:
    """Wrap a model already on ``context.device`` in
    :class:`~torch.nn.parallel.DistributedDataParallel`.

    Move the model first with ``context.accelerator.model_to_device(model)``, which
    keeps tied weights tied; DDP then shares each tied Parameter once, and its
    start-up broadcast makes every rank begin from rank 0's weights. Train and save
    through ``wrapped.module`` as usual.

    :param context: from :func:`init_process_group`; ``None`` means the current one.
    :param options: passed on to DistributedDataParallel (they override accel's
        choices: ``device_ids`` for CUDA, ``gradient_as_bucket_view`` for XLA).
    :raises DistributedSetupError: no process group is running, or ``context`` is
        not the running one.
    :raises ValueError: a parameter or buffer is not on ``context.device``.
    """
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, nn.Module):
        raise TypeError(f"wrap_data_parallel expects a torch.nn.Module, got {type(model).__name__}")
    if context is None:
        context = _active
    if context is None or not dist.is_initialized():
        raise DistributedSetupError(
            "wrap_data_parallel needs a running process group and found none; call "
            "accel.distributed.init_process_group() first and pass its context"
        )
    if context is not _active:
        raise DistributedSetupError(
            f"the context passed ({context.backend} on {context.device}) is not the running "
            f"process group's; it was torn down. Pass the context init_process_group() "
            f"returned last"
        )
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.device != context.device:
            raise ValueError(
                f"{name!r} is on {tensor.device}, but this worker trains on "
                f"{context.device}; move the model first with "
                f"context.accelerator.model_to_device(model) (it keeps tied weights tied)"
            )
    if context.device.type == "cuda":
        options.setdefault("device_ids", [context.device.index])
        options.setdefault("output_device", context.device.index)
    if context.backend == "xla":
        # torch_xla's DDP guide: bucket views avoid a copy XLA would trace every step.
        options.setdefault("gradient_as_bucket_view", True)
    return DistributedDataParallel(model, **options)
