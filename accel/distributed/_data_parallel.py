"""DistributedDataParallel around a model accel moved, ties intact."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accel.distributed._backends import backend_for_device
from accel.distributed._errors import DistributedSetupError
from accel.distributed._process_group import DistributedContext, current_context
from accel.distributed._spmd import current_spmd_context
from accel.errors import AcceleratorTypeError, AcceleratorValueError

if TYPE_CHECKING:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["check_model_on_device", "running_context", "wrap_data_parallel"]


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
    :raises DistributedSetupError: no process group is running, ``context`` is not
        the running one, or no backend of the group carries the device's tensors
        (``mps``: gloo has no MPS tensors).
    :raises ValueError: a parameter or buffer is not on ``context.device``.
    """

    context = running_context(model, context, "wrap_data_parallel")
    check_model_on_device(model, context)
    if context.device.type == "cuda":
        options.setdefault("device_ids", [context.device.index])
        options.setdefault("output_device", context.device.index)
    if context.backend == "xla":
        # torch_xla's DDP guide: bucket views avoid a copy XLA would trace every step.
        options.setdefault("gradient_as_bucket_view", True)
    return DistributedDataParallel(model, **options)


def running_context(
    model: nn.Module, context: DistributedContext | None, caller: str
) -> DistributedContext:
    """``context``, checked to be the running group's and able to carry the model's
    tensors; ``None`` means the running one."""

    if not isinstance(model, nn.Module):
        raise AcceleratorTypeError(
            f"{caller} expects a torch.nn.Module, got {type(model).__name__}"
        )
    if context is None:
        context = current_context()
    if context is None and current_spmd_context() is not None:
        raise DistributedSetupError(
            f"{caller} runs on a torch.distributed process group, which XLA SPMD "
            f"(init_spmd()) does not use: under init_spmd() shard with torch_xla's "
            f"mark_sharding on the model's tensors (both slots of a tie are one tensor), "
            f"or with accel.distributed.spmd_fully_shard_tied(model) (FSDPv2, ties kept)"
        )
    if context is None or not dist.is_initialized():
        raise DistributedSetupError(
            f"{caller} needs a running process group and found none; call "
            "accel.distributed.init_process_group() first and pass its context"
        )
    if context is not current_context():
        raise DistributedSetupError(
            f"the context passed ({context.backend} on {context.device}) is not the running "
            f"process group's; it was torn down. Pass the context init_process_group() "
            f"returned last"
        )
    running = str(dist.get_backend())
    if backend_for_device(running, context.device.type) is None:
        raise DistributedSetupError(
            f"the process group ({running!r}) has no backend for {context.device.type} "
            f"tensors, so {caller} could not synchronise a model on {context.device}; "
            f"train on a device a backend carries (the 'cpu' accelerator with gloo), "
            f"or start the group with a backend for {context.device.type}"
        )
    return context


def check_model_on_device(
    model: nn.Module, context: DistributedContext, *, meta: bool = False
) -> None:
    """:raises ValueError: a parameter or buffer of ``model`` is off ``context.device``
    (on ``meta`` too, unless ``meta``: a model to materialize after sharding)."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.device == context.device or (meta and tensor.device.type == "meta"):
            continue
        if tensor.device.type == "meta":
            raise AcceleratorValueError(
                f"{name!r} is on meta, with no values yet, but this worker trains on "
                f"{context.device}; materialize the model first with "
                f"context.accelerator.materialize(model, init=...) (it keeps tied weights "
                f"tied; parallelize_tied and fully_shard_tied take a model on meta)"
            )
        raise AcceleratorValueError(
            f"{name!r} is on {tensor.device}, but this worker trains on "
            f"{context.device}; move the model first with "
            f"context.accelerator.model_to_device(model) (it keeps tied weights tied)"
        )
