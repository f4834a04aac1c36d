"""Data parallelism over the XLA devices of one process, through torch_xla's SPMD.

Under SPMD one process drives every device (how TPU pods are driven): the model is
written for one device and replicated, each batch is sharded along its first
dimension over a 1-D ``data`` mesh, and the XLA compiler inserts the gradient
all-reduce. There is no :mod:`torch.distributed` process group and no DDP wrapper.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

import accel
from accel._util.names import AUTO, name_from_environment, parse_accelerator_name
from accel.distributed._devices import resolve_accelerator
from accel.distributed._errors import DistributedSetupError
from accel.errors import AcceleratorValueError, WeightTyingError
from accel.training.nested import tensors_in
from accel.tying import count_unique_parameters, find_tied_parameters

if TYPE_CHECKING:
    import torch
    from torch import nn

    from accel.accelerator import Accelerator
    from accel.registry import AcceleratorRegistry

__all__ = [
    "SpmdContext",
    "current_spmd_context",
    "init_spmd",
    "shard_batch",
    "spmd_fully_shard_tied",
]

#: The name of the mesh axis the batch is sharded over.
DATA_AXIS = "data"


@dataclass(frozen=True)
class SpmdContext:
    """The data-parallel mesh :func:`init_spmd` set up over this process's XLA devices."""

    #: The :class:`torch_xla.distributed.spmd.Mesh`: every device on one ``data`` axis.
    mesh: Any
    #: How many devices the batch is sharded over.
    num_devices: int
    #: The handle to move the model with (ties are kept, as on one device).
    accelerator: Accelerator
    #: The SPMD virtual device that models and batches live on.
    device: torch.device


_lock = threading.Lock()
_active: SpmdContext | None = None


def current_spmd_context() -> SpmdContext | None:
    """The context :func:`init_spmd` set up in this process, if any."""
    return _active


def init_spmd(
    accelerator: Accelerator | str | None = "tpu",
    *,
    registry: AcceleratorRegistry | None = None,
) -> SpmdContext:
    """Switch the XLA runtime to SPMD and build a data-parallel mesh over its devices.

    Call it first, before any tensor is on an XLA device and before any other
    handle for the XLA accelerator is created (creating one hands a device out):
    torch_xla switches to SPMD for the whole process, once, and this looks the
    accelerator up only after the switch. Then move the model with
    ``context.accelerator.model_to_device(model)`` (it stays replicated, ties intact)
    and pass every batch through :func:`shard_batch`. Idempotent.

    :param accelerator: an XLA accelerator (backend ``xla``) by name, or ``None`` for
        the default; a handle works only once SPMD is on, as creating it handed out
        a device. A non-XLA handle or name is refused before anything is switched
        (a name by its plugin's declared backend, without creating a handle); only
        ``"auto"`` is known once selected, after the switch.
    :raises accel.AcceleratorNotFoundError: no accelerator has that name (nothing
        switched).
    :raises DistributedSetupError: torch_xla is missing, the runtime already handed
        out a device, the accelerator is not an XLA one, or an ``xla`` process group
        is running (SPMD replaces it: destroy it first).
    """
    global _active
    with _lock:
        if _active is not None:
            return _active
        # Refused before switching: the switch is for the whole process, and for good.
        if isinstance(accelerator, (str, type(None))):
            _require_xla_name(accelerator, registry)
        else:
            _require_xla(resolve_accelerator(accelerator, registry))
        xr, xs = _switch_to_spmd()
        acc = resolve_accelerator(accelerator, registry)  # after the switch: see above
        _require_xla(acc)
        import numpy as np

        count = int(xr.global_runtime_device_count())
        mesh = xs.Mesh(np.arange(count), (count,), (DATA_AXIS,))
        xs.set_global_mesh(mesh)
        _active = SpmdContext(mesh=mesh, num_devices=count, accelerator=acc, device=acc.device)
        return _active


def _require_xla(acc: Accelerator) -> None:
    if acc.distributed_backend != "xla":
        raise _not_xla(acc.name, acc.distributed_backend)


def _require_xla_name(accelerator: str | None, registry: AcceleratorRegistry | None) -> None:
    """Refuse a name whose accelerators all declare another backend than ``xla``."""
    name, _source = name_from_environment(accelerator)
    if parse_accelerator_name(name)[0] == AUTO:
        return  # decided by probing: checked once selected
    backends = (registry or accel.default_registry()).distributed_backends(name)
    if "xla" not in backends.values():
        canonical, backend = next(iter(backends.items()))
        raise _not_xla(canonical, backend)


def _not_xla(name: str, backend: str) -> DistributedSetupError:
    return DistributedSetupError(
        f"init_spmd needs an XLA accelerator, but {name!r} uses the {backend!r} backend; "
        f"pass 'tpu', or use init_process_group() and wrap_data_parallel() for {name!r}"
    )


def _switch_to_spmd() -> tuple[Any, Any]:
    """Turn torch_xla's SPMD mode on, or say why it cannot be; returns its runtime
    and SPMD modules."""
    try:
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr
    except ImportError as exc:
        raise DistributedSetupError(
            f"init_spmd needs torch_xla, and importing it failed ({exc}); pip install 'accel[tpu]'"
        ) from exc

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "xla":
        raise DistributedSetupError(
            "an 'xla' process group is running, and SPMD has none; call "
            "accel.distributed.destroy_process_group() before init_spmd()"
        )
    if xr.is_spmd():
        return xr, xs
    # Once a device was handed out, torch_xla can only force SPMD by replicating what
    # exists, and torch_xla 2.9 then crashes at the next sync: refuse instead.
    is_locked = getattr(torch_xla._XLAC, "_xla_get_spmd_config_is_locked", None)
    if is_locked is not None and is_locked():
        raise DistributedSetupError(
            "the XLA runtime already handed out a device (an accelerator handle for "
            "'tpu' was created, or a tensor moved to XLA) before init_spmd(), and SPMD "
            "must be switched on before that; call accel.distributed.init_spmd('tpu') "
            "first in the program and use the handle it returns (context.accelerator)"
        )
    xr.use_spmd()
    return xr, xs


def shard_batch(batch: Any, context: SpmdContext | None = None) -> Any:
    """Move ``batch`` to the XLA device and shard each tensor's first dimension over
    the mesh; containers are walked as by ``batch_to_device``.

    :param context: from :func:`init_spmd`; ``None`` means the current one.
    :raises DistributedSetupError: :func:`init_spmd` was not called.
    :raises ValueError: a tensor's first dimension does not divide evenly over the
        devices (each would see a different share of the batch). Scalars stay replicated.
    """
    if context is None:
        context = _active
    if context is None:
        raise DistributedSetupError(
            "shard_batch needs the mesh of accel.distributed.init_spmd(); call it first"
        )
    import torch_xla.distributed.spmd as xs

    moved = context.accelerator.batch_to_device(batch)

    for tensor in tensors_in(moved):
        if tensor.dim() == 0:
            continue  # a scalar (a step count, a scale) stays replicated
        if tensor.shape[0] % context.num_devices:
            raise AcceleratorValueError(
                f"shard_batch splits every tensor's first dimension over "
                f"{context.num_devices} devices, but a tensor of shape {tuple(tensor.shape)} "
                f"does not divide evenly; use a batch size divisible by {context.num_devices}"
            )
        xs.mark_sharding(tensor, context.mesh, (DATA_AXIS,) + (None,) * (tensor.dim() - 1))
    return moved


def spmd_fully_shard_tied(
    model: nn.Module, *, mesh: Any = None, context: SpmdContext | None = None, **options: Any
) -> nn.Module:
    """Shard ``model`` with torch_xla's FSDPv2 (``SpmdFullyShardedDataParallel``),
    its ties kept.

    FSDPv2 moves the model itself with ``module.to("xla")``, which gives each slot of
    a tied weight a Parameter of its own (a tied LM's 3 parameters become 4, silently),
    and on a model on ``meta`` fails in torch pointing at ``to_empty``, which unties it
    too. Given a model already on the device, it keeps the tie. So the model is moved
    first with ``context.accelerator.model_to_device`` (ties kept), then wrapped, then
    every tie is checked.

    :param mesh: a :class:`torch_xla.distributed.spmd.Mesh` with an ``fsdp`` axis;
        ``None`` means every device on one ``fsdp`` axis.
    :param options: passed on to FSDPv2 (``auto_wrap_policy``, ``shard_output``, ...).
    :returns: the FSDPv2 wrapper; ``wrapper.module`` is ``model``.
    :raises DistributedSetupError: :func:`init_spmd` was not called.
    :raises AcceleratorValueError: the model holds tensors on ``meta`` (build it there,
        then ``context.accelerator.materialize(model)`` before this call).
    :raises accel.WeightTyingError: a tie came apart all the same (the model is then
        left sharded as FSDPv2 made it).
    """
    if context is None:
        context = _active
    if context is None:
        raise DistributedSetupError(
            "spmd_fully_shard_tied needs the mesh of accel.distributed.init_spmd(); call it first"
        )
    import numpy as np
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel,
    )

    model = context.accelerator.model_to_device(model)  # refuses meta, naming materialize
    groups = find_tied_parameters(model, buffers=False)
    count_before = count_unique_parameters(model)
    if mesh is None:
        mesh = xs.Mesh(np.arange(context.num_devices), (context.num_devices,), ("fsdp",))
    wrapped: nn.Module = SpmdFullyShardedDataParallel(model, mesh=mesh, **options)
    broken = [group for group in groups if not group.is_tied()]
    if broken:
        count_after = count_unique_parameters(wrapped)
        names = "; ".join(" = ".join(group.names) for group in broken)
        raise WeightTyingError(
            f"spmd_fully_shard_tied: tied parameters came apart under FSDPv2 ({names}); "
            f"{count_before} unique parameters before, {count_after} after. Check that "
            f"no auto_wrapper_callable moves or rebuilds a module's parameters",
            count_before=count_before,
            count_after=count_after,
            broken_groups=[group.names for group in broken],
        )
    return wrapped
