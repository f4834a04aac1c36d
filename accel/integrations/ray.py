"""accel inside Ray Train: a ``TorchTrainer`` on any accel accelerator, ties kept.

Ray Train starts the worker processes and their :mod:`torch.distributed` group; accel
chooses the backend, moves the model and the batches::

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from accel.integrations.ray import prepare_data_loader, prepare_model, torch_config


    def train_func(config):
        model, optimizer = prepare_model(model, optimizer, accelerator="npu")
        for tokens, targets in prepare_data_loader(loader, accelerator="npu"):
            ...


    trainer = TorchTrainer(train_func, torch_config=torch_config("npu"),
                           scaling_config=ScalingConfig(num_workers=2))

* :func:`torch_config`: a ``ray.train.torch.TorchConfig`` whose backend is the
  accelerator's ``distributed_backend``, refused early when Ray could not start it.
* :func:`prepare_model`: in place of ``ray.train.torch.prepare_model``, which moves
  with ``model.to(device)`` (on XLA that unties a tied model, and leaves the
  optimizer on the old parameters) and knows only Ray's own devices.
* :func:`prepare_data_loader`: in place of ``ray.train.torch.prepare_data_loader``;
  the batches come through the accelerator's ``device_loader``.
* :func:`worker_accelerator`: this worker's accel handle, for ``acc.save``,
  ``acc.load`` and ``acc.optimizer_step``.

Only Ray's public API is used. Needs ``ray[train]`` (``pip install 'accel-torch[ray]'``);
``import accel`` never imports this module. See ``docs/integrations.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

try:
    import ray.train
    import ray.train.torch
except ModuleNotFoundError as exc:
    if exc.name not in ("ray", "ray.train", "ray.train.torch"):
        raise
    raise ModuleNotFoundError(
        "accel.integrations.ray needs the 'ray[train]' package, which is not installed: "
        "pip install 'ray[train]' (or install accel with its 'ray' extra: "
        "pip install 'accel-torch[ray]')",
        name="ray",
    ) from exc

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

import accel
import accel.distributed
from accel.distributed import DistributedSetupError

if TYPE_CHECKING:
    from torch import nn

    from accel.training.device_loader import DeviceLoader

__all__ = ["prepare_data_loader", "prepare_model", "torch_config", "worker_accelerator"]

#: The process-group backends a ``TorchConfig`` can start in Ray's workers: torch's
#: own, and the two Ray registers itself before it starts the group (``hccl`` for
#: Gaudi and Ascend, ``tpu_dist`` for torch_tpu). Anything else is unknown to torch in
#: a fresh worker, where Ray calls ``init_process_group`` before the train function.
_RAY_BACKENDS: Final = frozenset({"gloo", "nccl", "mpi", "ucc", "xccl", "hccl", "tpu_dist"})

_Optimizers = TypeVar("_Optimizers", torch.optim.Optimizer, Sequence[torch.optim.Optimizer])


def torch_config(
    accelerator: accel.Accelerator | str | None = None,
    *,
    timeout_s: int = 1800,
    registry: accel.AcceleratorRegistry | None = None,
) -> ray.train.torch.TorchConfig:
    """A ``TorchConfig`` for ``TorchTrainer(torch_config=...)`` that starts the process
    group with the accelerator's own backend (``acc.distributed_backend``).

    Called on the driver: the accelerator's plugin must be installed there too.

    :param accelerator: a handle, a name (``"npu"``), or ``None`` for
        :func:`accel.get_accelerator`'s default.
    :param timeout_s: for the group's collectives and rendezvous, as ``TorchConfig``'s.
    :param registry: where to look names up; default :func:`accel.default_registry`.
    :raises accel.AcceleratorNotFoundError: no accelerator has that name.
    :raises accel.distributed.DistributedSetupError: Ray cannot start that backend in
        its workers (``xla``, or a name neither torch nor Ray registers); the message
        says what to do instead.
    """
    acc = _resolve(accelerator, registry)
    backend = acc.distributed_backend
    _check_ray_can_start(backend, acc.name)
    return ray.train.torch.TorchConfig(backend=backend, timeout_s=timeout_s)


@overload
def prepare_model(
    model: nn.Module,
    optimizer: None = None,
    *,
    accelerator: accel.Accelerator | str | None = None,
    registry: accel.AcceleratorRegistry | None = None,
    **ddp_options: Any,
) -> nn.Module: ...


@overload
def prepare_model(
    model: nn.Module,
    optimizer: _Optimizers,
    *,
    accelerator: accel.Accelerator | str | None = None,
    registry: accel.AcceleratorRegistry | None = None,
    **ddp_options: Any,
) -> tuple[nn.Module, _Optimizers]: ...


def prepare_model(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    *,
    accelerator: accel.Accelerator | str | None = None,
    registry: accel.AcceleratorRegistry | None = None,
    **ddp_options: Any,
) -> nn.Module | tuple[nn.Module, Any]:
    """Inside a ``TorchTrainer``'s train function: move ``model`` to this worker's device
    with accel and wrap it for data parallelism in the process group Ray started.

    The move is :meth:`accel.Accelerator.model_to_device`: tied weights stay tied (on
    XLA too), the plugin's move hooks run, and ``optimizer`` follows the parameters,
    its state included. The device is the one accel gives Ray's local rank
    (``cuda:LOCAL_RANK``, the one device ``cpu`` workers share, a plugin's device
    ``LOCAL_RANK``). With more than one worker the moved model is wrapped with
    :func:`accel.distributed.wrap_data_parallel` (DDP) in Ray's group, which
    :func:`accel.distributed.init_process_group` adopts; a world of one worker is not
    wrapped, as with ``ray.train.torch.prepare_model``.

    The model is moved in place by every built-in plugin: save and load it (not the
    DDP wrapper) with ``acc.save`` and ``acc.load``.

    :param optimizer: an optimizer, or a list of them, built on ``model``'s parameters.
    :param accelerator: a handle, a name, or ``None`` for :func:`accel.get_accelerator`'s
        default; every worker must name the same one (and :func:`torch_config` too).
    :param registry: where to look names up; default :func:`accel.default_registry`.
        A registry of your own is built inside the train function: it does not travel
        to Ray's workers.
    :param ddp_options: passed on to ``DistributedDataParallel``.
    :returns: the model (wrapped with several workers), and, when given, ``optimizer``.
    :raises RuntimeError: (Ray's own) called outside a Ray Train train function.
    :raises accel.distributed.DistributedSetupError: Ray's group runs with a backend
        other than the accelerator's, or cannot carry the device's tensors. Where Ray can
        start the accelerator's backend, pass ``torch_config(accelerator)`` to the
        trainer; XLA's it cannot (``torch_config("tpu")`` is refused): run one worker
        per host with ``ScalingConfig(num_workers=1)`` and the default ``TorchConfig()``,
        as the message says.
    :raises accel.WeightTyingError: a tie came apart in the move (model restored).
    """
    world_size = ray.train.get_context().get_world_size()
    acc = _worker_accelerator(accelerator, registry, world_size)
    moved = acc.model_to_device(model, optimizer=optimizer)
    prepared: nn.Module = moved
    if world_size > 1:
        prepared = accel.distributed.wrap_data_parallel(moved, **ddp_options)
    return prepared if optimizer is None else (prepared, optimizer)


def prepare_data_loader(
    loader: DataLoader[Any],
    *,
    accelerator: accel.Accelerator | str | None = None,
    registry: accel.AcceleratorRegistry | None = None,
    add_dist_sampler: bool = True,
) -> DeviceLoader[Any]:
    """Inside a ``TorchTrainer``'s train function: ``loader``'s batches, this worker's
    share, on this worker's device.

    With more than one worker, a loader without a ``DistributedSampler`` is rebuilt
    with one (shuffled unless the loader was sequential), as
    ``ray.train.torch.prepare_data_loader`` does; an ``IterableDataset`` is left as it
    is. The batches then come through :meth:`accel.Accelerator.device_loader` on the
    device :func:`prepare_model` chose (torch_xla's parallel loader on XLA, a copy ahead
    from pinned memory on CUDA). Call ``.loader.sampler.set_epoch(epoch)`` on the
    result before each epoch of a shuffled loader.

    :param accelerator: as for :func:`prepare_model`, and the same one.
    :param add_dist_sampler: ``False`` keeps the loader's own sampler (shard yourself).
    :raises TypeError: ``loader`` is not a ``torch.utils.data.DataLoader``.
    """
    if not isinstance(loader, DataLoader):
        raise accel.errors.AcceleratorTypeError(
            f"prepare_data_loader expects a torch.utils.data.DataLoader, got "
            f"{type(loader).__name__}; build one over your dataset, or move the batches "
            f"yourself with acc.batch_to_device"
        )
    # Checked at every world size, so that a run on one worker fails as one on many would.
    if add_dist_sampler and not isinstance(
        loader.sampler, (SequentialSampler, RandomSampler, DistributedSampler)
    ):
        raise accel.errors.AcceleratorValueError(
            f"prepare_data_loader would replace the loader's {type(loader.sampler).__name__} "
            f"with a DistributedSampler when there are several workers; shard the data in "
            f"your sampler and pass add_dist_sampler=False, or build the loader with "
            f"shuffle=True or shuffle=False instead"
        )
    context = ray.train.get_context()
    world_size = context.get_world_size()
    acc = _worker_accelerator(accelerator, registry, world_size)
    if (
        add_dist_sampler
        and world_size > 1
        and not isinstance(loader.sampler, DistributedSampler)
        and not isinstance(loader.dataset, IterableDataset)
    ):
        loader = _with_distributed_sampler(loader, world_size, context.get_world_rank())
    return acc.device_loader(loader)


def worker_accelerator(
    accelerator: accel.Accelerator | str | None = None,
    *,
    registry: accel.AcceleratorRegistry | None = None,
) -> accel.Accelerator:
    """Inside a ``TorchTrainer``'s train function: this worker's accel handle, on the
    device :func:`prepare_model` moves to. Save and resume with it (``acc.save`` into
    the directory of a ``ray.train.Checkpoint``, ``acc.load`` from
    ``ray.train.get_checkpoint()``) and step with ``acc.optimizer_step``.

    :param accelerator: as for :func:`prepare_model`, and the same one.
    :raises RuntimeError: (Ray's own) called outside a Ray Train train function.
    :raises accel.distributed.DistributedSetupError: as :func:`prepare_model`.
    """
    world_size = ray.train.get_context().get_world_size()
    return _worker_accelerator(accelerator, registry, world_size)


# -- the parts ----------------------------------------------------------------------


def _resolve(
    accelerator: accel.Accelerator | str | None, registry: accel.AcceleratorRegistry | None
) -> accel.Accelerator:
    # The registry's one rule for "a handle or a name" (a handle with registry= must be
    # that registry's), as everywhere in accel.
    if registry is not None:
        return registry.get_accelerator(accelerator)
    return accel.get_accelerator(accelerator)


def _check_ray_can_start(backend: str, name: str) -> None:
    """:raises DistributedSetupError: Ray's workers could not start ``backend``."""
    names = {part.split(":", 1)[-1].strip().lower() for part in backend.split(",") if part}
    if "xla" in names:
        raise DistributedSetupError(
            f"accelerator {name!r} declares the torch.distributed backend {backend!r}, "
            f"which Ray Train cannot start: its TorchConfig calls init_process_group in "
            f"each worker with env:// and never imports torch_xla's backend (Ray's TPU "
            f"backend, 'tpu_dist', is torch_tpu's, not torch_xla's). Train on XLA under "
            f"Ray with one worker per host: ScalingConfig(num_workers=1), the default "
            f"ray.train.torch.TorchConfig(), and prepare_model(model, accelerator={name!r}) "
            f"inside (a world of one is not wrapped); spread a host's devices with "
            f"accel.distributed.init_spmd"
        )
    unknown = sorted(names - _RAY_BACKENDS)
    if unknown:
        raise DistributedSetupError(
            f"accelerator {name!r} declares the torch.distributed backend {backend!r}, "
            f"which Ray Train cannot start: its TorchConfig calls init_process_group in "
            f"each worker before the train function runs, where only torch's own "
            f"backends and the ones Ray registers exist ({', '.join(sorted(_RAY_BACKENDS))}), "
            f"and {', '.join(map(repr, unknown))} is none of them. Register it in every "
            f"worker before Ray starts the group (ray.init(runtime_env="
            f"{{'worker_process_setup_hook': ...}}) with a function that imports the "
            f"module registering it) and pass ray.train.torch.TorchConfig(backend="
            f"{backend!r}) yourself, or ask the plugin's vendor for a backend Ray knows"
        )


def _worker_accelerator(
    accelerator: accel.Accelerator | str | None,
    registry: accel.AcceleratorRegistry | None,
    world_size: int,
) -> accel.Accelerator:
    """This worker's handle: with several workers the one accel.distributed gives Ray's
    local rank, in Ray's group (adopted); alone, the accelerator itself."""
    acc = _resolve(accelerator, registry)
    if world_size == 1:
        return acc
    try:
        context = accel.distributed.init_process_group(acc, registry=registry)
    except DistributedSetupError as exc:
        # Python 3.10 has no exception notes: say it in a new message.
        raise DistributedSetupError(
            f"{exc}\naccel.integrations.ray: Ray Train started this worker's process "
            f"group; {_group_remedy(acc)}",
            missing=exc.missing,
        ) from exc
    return context.accelerator


def _group_remedy(acc: accel.Accelerator) -> str:
    """How to have Ray start a group ``acc`` can use: :func:`torch_config` where Ray can
    start its backend; else what :func:`torch_config`'s refusal advises instead (for
    XLA, one worker per host), never the call that would be refused."""
    try:
        _check_ray_can_start(acc.distributed_backend, acc.name)
    except DistributedSetupError as refusal:
        return f"torch_config({acc.name!r}) is refused as well, because {refusal}"
    return (
        f"pass TorchTrainer(torch_config=accel.integrations.ray.torch_config("
        f"{acc.name!r})) so that it starts the group with {acc.name!r}'s backend "
        f"({acc.distributed_backend!r})"
    )


def _with_distributed_sampler(
    loader: DataLoader[Any], world_size: int, rank: int
) -> DataLoader[Any]:
    """``loader`` again, over this rank's share of its dataset (Ray's own rebuild)."""
    shuffle = isinstance(loader.sampler, RandomSampler)
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        shuffle=False,
        sampler=DistributedSampler(
            loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle
        ),
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
    )
