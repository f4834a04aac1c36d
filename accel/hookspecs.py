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

import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from accel.markers import hookspec

if TYPE_CHECKING:
    import torch

    from accel.types import AcceleratorSpec, Availability, MemoryStats, MoveContext

__all__ = [
    "autocast",
    "batch_to_device",
    "clip_grad_norm_",
    "compile_backend",
    "device_count",
    "device_loader",
    "distributed_backend",
    "get_device",
    "grad_scaler",
    "is_available",
    "load",
    "manual_seed",
    "mark_step",
    "memory_stats",
    "model_to_device",
    "no_sync",
    "optimizer_step",
    "post_move_hook",
    "pre_move_hook",
    "register_accelerators",
    "restore_to_device",
    "rng_state",
    "save",
    "set_rng_state",
    "state_dict",
    "synchronize",
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

    A backend that can only tell by initialising (torch-opencl counts its devices by
    setting up OpenCL) declares ``AcceleratorSpec(..., probing_initialises=True)``:
    then listing and ``"auto"`` do not call this hook (the accelerator is listed as
    not probed, and ``"auto"`` passes it over) until it is selected by name
    (``get_accelerator("opencl")``, or ``$ACCEL_ACCELERATOR``), which probes it; from
    then on, in that registry, it is listed and may be picked as any other.

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

    Asked only when :func:`is_available` said yes. *First result*: the fallback is
    ``torch.accelerator.device_count()`` when the accelerator's name is the device
    type ``torch.accelerator`` reports (never ``cpu`` or ``cuda``), else ``1``.
    Example::

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

    On a move that unties (torch's rule, see :meth:`accel.Accelerator.tie_check`),
    accel records the tied groups after every ``pre_move_hook`` has run. If this or
    any later step raises, the model is restored (see :meth:`accel.Accelerator.model_to_device`)
    and the exception propagates. Example::

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
    implement this only to move differently. A module returned in the model's place
    (a copy) gets the ties of before and the optimizers passed to the move. A wrapper implementation
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

    On a move that unties (to or from XLA, say), accel has already re-tied the
    groups it remembered on the module ``model_to_device`` returned, called its own
    ``tie_weights()`` and validated. Raise to fail the move: the model is restored
    and the exception reaches the caller. Example::

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
    namedtuples and dataclasses to any depth by :mod:`accel.training.nested`'s rules,
    keeping each container's type, and copies pinned host memory to CUDA without
    blocking. Implement it for a faster transfer path. It also runs for every batch of
    ``device_loader`` (as its ``move``); on TPU, torch_xla's parallel loader has
    copied the batch's tensors to the device already by then, so return the batch
    unchanged for tensors already on ``device``. Example::

        @accel.hookimpl
        def batch_to_device(batch, device):
            return my_runtime.send_to_device(batch, device)
    """
    raise NotImplementedError


# -- the training step ---------------------------------------------------------------


@hookspec(firstresult=True)
def optimizer_step(
    accelerator: str,
    optimizer: torch.optim.Optimizer,
    closure: Callable[[], Any] | None,
    device: torch.device,
    scaler: torch.amp.GradScaler | None,
) -> Any:
    """Step ``optimizer`` (with ``closure`` when given) the way this accelerator needs.

    *First result*: the built-in fallback, asked last, is ``optimizer.step(closure)``
    and returns what it returns; with a ``scaler`` (float16 loss scaling, see
    :func:`grad_scaler`) it is ``scaler.step(optimizer)`` then ``scaler.update()``.
    A plugin that steps itself must honour ``scaler`` the same way. Most plugins do
    their work *around* that step, as a wrapper: the TPU plugin reduces gradients
    across replicas before it (those :func:`clip_grad_norm_` reduced excepted) and
    marks the XLA step after it (inside a ``device_loader`` loop, at the next batch).
    A ``closure`` computes the gradients inside the step: work on them belongs after
    each call of it (the TPU plugin steps with a closure that reduces after yours).
    A plain implementation that returns ``None`` lets the fallback step; one that
    steps itself must return a value other than ``None`` (or the fallback steps a
    second time), so prefer a wrapper. Example::

        @accel.hookimpl(wrapper=True)
        def optimizer_step(optimizer):
            my_runtime.all_reduce_gradients(optimizer)
            result = yield  # the step itself
            my_runtime.flush()
            return result
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def clip_grad_norm_(
    accelerator: str,
    parameters: list[torch.Tensor],
    max_norm: float,
    norm_type: float,
    device: torch.device,
) -> torch.Tensor | None:
    """Clip the gradients of ``parameters`` to total norm ``max_norm``; return the
    total norm before clipping, as a tensor (no ``.item()``: on a lazy device that
    would run the graph).

    Called after ``backward()`` and before ``optimizer_step``. Where gradients are
    reduced across replicas *in* the step, reduce them here first, or every replica
    clips its own unreduced gradients, and make the step not reduce them again: the
    TPU plugin does both. *First result*: the fallback is
    :func:`accel.training.step.clip_grad_norm` (torch's ``clip_grad_norm_``, with
    FSDP2's sharded norm reduced to a plain tensor). Example::

        @accel.hookimpl
        def clip_grad_norm_(parameters, max_norm, norm_type):
            my_runtime.all_reduce_gradients(parameters)
            return accel.training.step.clip_grad_norm(parameters, max_norm, norm_type)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def no_sync(
    accelerator: str, model: torch.nn.Module, enabled: bool, device: torch.device
) -> AbstractContextManager[Any] | None:
    """Return a context in which ``backward()`` does not reduce ``model``'s gradients
    across processes: the micro-steps of gradient accumulation.

    ``enabled`` is ``False`` on the micro-step that must sync (the last); return a
    context that changes nothing then. *First result*: the fallback
    (:func:`accel.training.step.gradient_sync_paused`) uses DDP's
    ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``, and nothing for a
    plain model. Implement it for a runtime that reduces gradients in ``backward()``
    in a way of its own. Example::

        @accel.hookimpl
        def no_sync(model, enabled):
            return my_runtime.skip_gradient_reduction(model) if enabled else None
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def grad_scaler(
    accelerator: str, device: torch.device, options: dict[str, Any]
) -> torch.amp.GradScaler | None:
    """Return a loss scaler for float16 training on ``device``, built with ``options``
    (``init_scale``, ``growth_interval``, ... as the user passed them).

    Asked only when the loop trains in float16 (bfloat16 and float32 need no
    scaling, and the handle returns ``None`` without asking). The result must have
    ``scale``, ``unscale_``, ``step`` and ``update``, as ``torch.amp.GradScaler``
    does. *First result*: the fallback is ``torch.amp.GradScaler(device.type,
    **options)``. Example::

        @accel.hookimpl
        def grad_scaler(options):
            return my_runtime.amp.GradScaler(**options)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def compile_backend(accelerator: str, device: torch.device) -> str | Callable[..., Any] | None:
    """Name the ``torch.compile`` backend for this accelerator: a registered backend
    name (``torch._dynamo.list_backends()``) or a backend callable.

    *First result*: the fallback is ``"inductor"`` (the CPU and CUDA); the TPU
    plugin answers ``"openxla"``. Example::

        @accel.hookimpl
        def compile_backend():
            return "npu_backend"  # registered by the vendor's torch extension
    """
    raise NotImplementedError


@hookspec
def mark_step(accelerator: str, device: torch.device) -> None:
    """Cut the pending lazy graph and send it to the device (a step boundary).

    Every implementation runs; the fallback does nothing, right for any eager
    device. The TPU plugin calls ``torch_xla.sync()``. Example::

        @accel.hookimpl
        def mark_step(device):
            my_lazy_runtime.flush(device)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def synchronize(accelerator: str, device: torch.device) -> bool | None:
    """Block until ``device`` has finished the work queued on it so far; return ``True``.

    *First result*: a plugin that returns ``True`` has answered, and accel's fallback
    does not run (return ``True`` where your backend cannot synchronise, too). The
    fallback calls ``torch.accelerator.synchronize`` for a device type torch drives
    itself (``torch.accelerator``: XPU, HPU, a ``privateuse1`` backend; never the CPU
    or CUDA) and otherwise does nothing; where the backend refuses
    (``RuntimeError``/``NotImplementedError``, as torch-opencl's "Backend doesn't
    support synchronizing events"), it returns without waiting and never raises: such
    a backend finishes each operation before returning. Example::

        @accel.hookimpl
        def synchronize(device):
            torch.npu.synchronize(device)
            return True
    """
    raise NotImplementedError


@hookspec
def manual_seed(accelerator: str, seed: int, device: torch.device) -> None:
    """Seed the random number generators of this accelerator's devices.

    Every implementation runs. The fallback calls ``torch.manual_seed(seed)``,
    which seeds the host and every device type torch itself knows (CUDA, MPS,
    XPU, a registered ``privateuse1`` backend), and, for the device type
    ``torch.accelerator`` reports, ``torch.<type>.manual_seed_all`` where that
    module has it; so implement this only for a runtime that keeps its own random
    state, as XLA does. Example::

        @accel.hookimpl
        def manual_seed(seed, device):
            my_runtime.set_rng_state(seed, device)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def autocast(
    accelerator: str, device: torch.device, dtype: torch.dtype | None
) -> AbstractContextManager[Any] | None:
    """Return a context manager that runs its block in mixed precision on ``device``.

    ``dtype`` is what the user asked for, or ``None`` for the accelerator's
    preferred low-precision type. Raise ``ValueError`` for a type the device
    cannot autocast to (:func:`accel.training.precision.checked_autocast_dtype` writes
    the message). *First result*: the fallback is ``torch.autocast`` for the
    device's type, defaulting to ``torch.get_autocast_dtype``. Example::

        @accel.hookimpl
        def autocast(device, dtype):
            from accel.training.precision import checked_autocast_dtype
            chosen = checked_autocast_dtype("npu", dtype, default=torch.float16,
                                            supported=(torch.float16, torch.bfloat16))
            return torch.autocast(device.type, dtype=chosen)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def memory_stats(accelerator: str, device: torch.device) -> MemoryStats | None:
    """Report the device's memory use as an :class:`accel.training.memory.MemoryStats` dict.

    Keys ``allocated_bytes``, ``peak_allocated_bytes`` and ``total_bytes``; each an
    ``int``, or ``None`` when the runtime does not report it (never a guess).
    *First result*: the fallback reads ``torch.accelerator``'s counters for a device
    type torch drives (the total from ``get_memory_info`` where torch has it), and
    otherwise reports all three as ``None``; a counter the backend refuses (torch's
    ``NotImplementedError``, a ``RuntimeError``) is ``None``, never an error. Example::

        @accel.hookimpl
        def memory_stats(device):
            return accel.training.memory.MemoryStats(
                allocated_bytes=torch.npu.memory_allocated(device),
                peak_allocated_bytes=torch.npu.max_memory_allocated(device),
                total_bytes=torch.npu.get_device_properties(device).total_memory,
            )
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def device_loader(
    accelerator: str,
    loader: Iterable[Any],
    device: torch.device,
    move: Callable[[Any], Any],
) -> Iterable[Any] | None:
    """Return an iterable over ``loader``'s batches with their tensors on ``device``.

    Iterated once per epoch, so return something iterable again and again (a
    class with ``__iter__``, not a generator). ``move`` is the handle's
    ``batch_to_device``, with every plugin's batch hooks: pass every batch through
    it, so those hooks run whichever loader is in use (where no plugin implements
    ``batch_to_device``, ``move`` is accel's own ``move_batch``, a ``BatchMover``, which
    a loader that already moved a batch whole may skip). Transfer ahead of use where
    the device allows it: the TPU plugin lets torch_xla's ``MpDeviceLoader`` copy the
    CPU tensors, rebuilds each batch as the loader made it and then calls ``move`` on
    it; the CUDA plugin copies the next batch from pinned memory while the current one
    is used. Batches may already be on the device, and ``loader`` may be
    a :class:`~accel.training.device_loader.DeviceLoader` itself (wrapped twice).
    *First result*: the fallback moves each batch with ``move`` as it is taken.
    Example::

        @accel.hookimpl
        def device_loader(loader, device, move):
            return my_runtime.PrefetchingLoader(loader, device, then=move)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def state_dict(accelerator: str, model: torch.nn.Module) -> dict[str, Any] | None:
    """Return ``model``'s state dict with every tensor on the CPU.

    A tensor the model holds under several names (a tied weight) must be one CPU
    tensor under all of them, so that ``torch.save`` stores it once and
    ``load_state_dict`` restores the tie. *First result*: the fallback
    (:func:`accel.training.checkpoint._state.cpu_state_dict`) copies each distinct tensor once.
    Example::

        @accel.hookimpl
        def state_dict(model):
            my_runtime.wait_for_pending_writes()
            return None  # then let the fallback copy
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def save(accelerator: str, obj: Any, path: str | os.PathLike[str]) -> bool | None:
    """Write ``obj`` to ``path`` atomically, its tensors on the CPU; return ``True``.

    ``obj`` is what the user saved, its modules, optimizers and schedulers already
    replaced by their state dicts and the step already marked; its tensors may still
    be on the device. The write must be atomic: ``path`` holds the previous file or
    the new one, never a torn one
    (:func:`accel.training.checkpoint._atomic.atomic_save` does it, and stores tensors on the CPU).
    Only the main process of a distributed job writes, every process returns once the
    file is complete, and a failed write raises an ``OSError`` on every process.
    *First result*: the fallback
    (:func:`accel.training.checkpoint._state.save_on_main_process`) writes on rank 0 of an
    initialised :mod:`torch.distributed` group, or always without one. An
    asynchronous save (``acc.save(obj, path, asynchronous=True)``) in a process
    without such a group calls this hook in a background thread, with ``obj`` a
    snapshot whose tensors are all on the CPU: use no collective of the training
    run there. In a distributed job accel writes an asynchronous save itself, on rank
    0, with ``atomic_save``. Example::

        @accel.hookimpl
        def save(obj, path):
            if my_runtime.rank() == 0:
                accel.training.checkpoint._atomic.atomic_save(obj, path)
            my_runtime.barrier()
            return True
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def load(accelerator: str, path: str | os.PathLike[str]) -> Any:
    """Read the object :func:`save` wrote to ``path``, its tensors on the CPU.

    Must read with ``weights_only=True`` (a checkpoint never runs code). The handle then
    restores the state into the user's objects in place and marks the step. *First
    result*: the fallback (:func:`accel.training.checkpoint._state.load_checkpoint`) is
    ``torch.load(path, map_location="cpu", weights_only=True)`` with clear errors.
    Example::

        @accel.hookimpl
        def load(path):
            my_runtime.prefetch(path)
            return None  # then let the fallback read it
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def restore_to_device(
    accelerator: str, tensors: list[torch.Tensor], device: torch.device
) -> list[torch.Tensor] | None:
    """Copy the host tensors of a checkpoint being restored to ``device`` together;
    return the device tensors, in the same order.

    ``acc.load(path, state)`` asks it once, after every check passed, with each
    distinct tensor that ``load_state_dict`` would copy to ``device`` unchanged (a
    module's parameters and buffers of the same dtype, an optimizer's state but its
    ``step``); the modules and optimizers then load the device tensors, so a
    parameter's ``copy_`` is a copy on the device. Implement it where one transfer of
    many tensors is much faster than one each, and where a parameter loaded from a
    device tensor takes its place without a second copy: on XLA one upload for the
    lot replaces a synchronous upload per tensor. *First result*: accel's fallback
    answers only for a device that refuses to copy a host tensor into one of its own
    in place (``nntile`` does; tried once per device on a one-element tensor): it
    moves each tensor with ``.to(device)``, so ``load_state_dict`` copies on the device
    and ``acc.load(path, state)`` works there with no hook of yours. Elsewhere it
    answers ``None`` and ``load_state_dict`` copies each host tensor into place. So
    implement it only for speed, or where ``.to(device)`` is not how your device
    takes a host tensor. Example::

        @accel.hookimpl
        def restore_to_device(tensors, device):
            return my_runtime.upload_all(tensors, device)
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def rng_state(accelerator: str, device: torch.device) -> Any:
    """Return the state of this accelerator's device generators (host ones are accel's).

    The value is stored in checkpoints, so it must hold only what
    ``torch.load(weights_only=True)`` reads: tensors, numbers, strings, containers.
    *First result*: the fallback returns ``{"type": device.type, "states": [...]}``
    from ``torch.<device type>.get_rng_state_all()`` (CUDA, XPU, ...) or
    ``get_rng_state()`` (MPS), and ``None`` for the CPU (torch's host generator is
    stored by accel itself). Example::

        @accel.hookimpl
        def rng_state(device):
            return {"type": "npu", "seed": my_runtime.current_seed(device)}
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def set_rng_state(accelerator: str, state: Any, device: torch.device) -> bool | None:
    """Put back the device generator state :func:`rng_state` returned; return ``True``.

    *First result*: the fallback sets what its ``rng_state`` read and refuses a state
    from another device type with a ``ValueError``. Example::

        @accel.hookimpl
        def set_rng_state(state, device):
            my_runtime.set_seed(state["seed"], device)
            return True
    """
    raise NotImplementedError
