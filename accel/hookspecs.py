"""The hooks an accel plugin can implement.

A plugin is any object (a module, a class instance) with methods decorated by
``@accel.hookimpl``. There are two kinds:

* An **accelerator plugin** implements :func:`register_accelerators`. Its other
  hooks then run *only* while one of the accelerators it declared is selected, so
  the TPU plugin's move hooks never see a CPU move.
* A **cross-cutting plugin** declares no accelerator. Its hooks run for every
  accelerator: a natural home for logging, metrics or policy.

Every hook receives ``accelerator``, the canonical name of the selected
accelerator, so one plugin can serve several. An implementation may accept any
subset of a hook's arguments, in any order (pluggy matches them by name).

Hooks marked *first result* stop at the first implementation that returns
something other than ``None``; plugins registered later are asked first, and the
built-in fallbacks are asked last.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from accel.markers import hookspec

if TYPE_CHECKING:
    import torch

    from accel.types import AcceleratorSpec, Availability, MoveContext

__all__ = [
    "batch_to_device",
    "device_count",
    "distributed_backend",
    "get_device",
    "is_available",
    "model_to_device",
    "post_move_hook",
    "pre_move_hook",
    "register_accelerators",
]


@hookspec
def register_accelerators() -> Iterable[AcceleratorSpec]:
    """Declare the accelerators this plugin provides.

    Called once, when the plugin is registered. Returning specs makes the plugin an
    accelerator plugin: its other hooks then run only for these accelerators.

    Example::

        @accel.hookimpl
        def register_accelerators():
            return [accel.AcceleratorSpec("npu", aliases=("ascend",), priority=150,
                                          description="Huawei Ascend NPUs via torch_npu")]
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def is_available(accelerator: str) -> Availability | None:
    """Say whether ``accelerator`` can be used in this process, and if not, why.

    Must be cheap and side-effect free: it runs for every accelerator whenever
    anyone lists accelerators or asks for ``"auto"``. Never initialise a device
    runtime here (CUDA must stay uninitialised so the process can still fork).
    Exceptions are caught by the registry and reported as unavailability.

    *First result.* Example::

        @accel.hookimpl
        def is_available():
            if importlib.util.find_spec("torch_npu") is None:
                return accel.Availability(False, reason="torch_npu is not installed",
                                          remedy="pip install torch_npu")
            return accel.Availability(True)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def device_count(accelerator: str) -> int | None:
    """Return how many devices of ``accelerator`` this process can use.

    Asked only when :func:`is_available` said yes. *First result.* Example::

        @accel.hookimpl
        def device_count():
            return torch.npu.device_count()
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def get_device(accelerator: str, index: int | None) -> torch.device | None:
    """Return the :class:`torch.device` for device ``index`` (``None``: the default one).

    The registry has already checked ``index`` against :func:`device_count`.
    *First result.* Example::

        @accel.hookimpl
        def get_device(index):
            return torch.device("npu", 0 if index is None else index)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def distributed_backend(accelerator: str) -> str | None:
    """Name the :mod:`torch.distributed` backend for this accelerator (``"gloo"``,
    ``"nccl"``, ``"xla"``, ``"hccl"``, ...). *First result.* Example::

        @accel.hookimpl
        def distributed_backend():
            return "hccl"
    """
    raise NotImplementedError


@hookspec
def pre_move_hook(
    accelerator: str, model: torch.nn.Module, device: torch.device, context: MoveContext
) -> None:
    """Called before a model moves. Remember what you need in ``context.notes``.

    The TPU plugin records the tied parameter groups here. If this or any later
    step raises, the model is restored as it was and the exception propagates.
    Example::

        @accel.hookimpl
        def pre_move_hook(model, context):
            context.notes["mine.param_count"] = sum(p.numel() for p in model.parameters())
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def model_to_device(
    accelerator: str, model: torch.nn.Module, device: torch.device, context: MoveContext
) -> torch.nn.Module | None:
    """Move ``model`` to ``device`` and return it (or the module that replaces it).

    *First result*: the built-in fallback, asked last, is ``model.to(device)``, so
    implement this only to move differently. A wrapper implementation
    (``@accel.hookimpl(wrapper=True)``) can time or log every move. Example::

        @accel.hookimpl(wrapper=True)
        def model_to_device(model, device):
            started = time.perf_counter()
            moved = yield
            log.info("moved %s to %s in %.3fs", type(model).__name__, device,
                     time.perf_counter() - started)
            return moved
    """
    raise NotImplementedError


@hookspec
def post_move_hook(
    accelerator: str, model: torch.nn.Module, device: torch.device, context: MoveContext
) -> None:
    """Called after the move with the moved model; fix up and validate it here.

    The TPU plugin re-ties the groups it remembered in ``pre_move_hook``, calls the
    model's own ``tie_weights()``, then validates. Raise to fail the move: the
    model is restored and the exception reaches the caller. Example::

        @accel.hookimpl
        def post_move_hook(model, device):
            for name, param in model.named_parameters():
                if param.device != device:
                    raise RuntimeError(f"{name} stayed on {param.device}")
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def batch_to_device(accelerator: str, batch: Any, device: torch.device) -> Any:
    """Move every tensor inside ``batch`` to ``device``; return the moved batch.

    *First result*: the built-in fallback, asked last, walks dicts, lists, tuples,
    namedtuples and dataclasses to any depth, keeping each container's type, and
    copies pinned host memory to CUDA without blocking. Implement it for a faster
    transfer path. Example::

        @accel.hookimpl
        def batch_to_device(batch, device):
            return my_runtime.send_to_device(batch, device)
    """
    raise NotImplementedError
