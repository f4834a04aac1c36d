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

pluggy makes every call: wrappers, ``tryfirst``/``trylast`` and first results as it
documents them. Hooks marked *first result* stop at the first implementation that
returns something other than ``None``; plugins registered later are asked first, and
accel's fallbacks are asked last.

**The rule for action hooks.** ``optimizer_step``, ``mark_step``, ``synchronize``,
``manual_seed``, ``save`` and ``set_rng_state`` *do* something. Each is done by exactly
one plain implementation: the plugin's where one has it (then accel's fallback is left
out of the call), else accel's fallback. What it returns is the call's value
(``optimizer_step``'s is the step's, ``None`` included; the others' is ignored). To add
work before or after the action, implement it as a wrapper
(``@accel.hookimpl(wrapper=True)``: code before and after ``yield``, which returns the
action's value). Two plugins with plain implementations of one action hook for one
accelerator cannot be registered together: the second raises :class:`~accel.PluginError`
naming both.
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
    # pluggy never calls a spec (the others are their docstrings alone); mypy wants a
    # body for a result that cannot be None.
    raise NotImplementedError


@hookspec(firstresult=True)
def is_available(accelerator: str) -> Availability | None:
    """Say whether ``accelerator`` can be used in this process, and if not, why.

    Cheap and side-effect free: it runs whenever anyone lists accelerators or asks for
    ``"auto"``; never initialise a device runtime here (CUDA must stay uninitialised).
    An exception is reported as unavailability. A backend that can only tell by
    initialising declares ``AcceleratorSpec(..., probing_initialises=True)``: then it
    is probed only once selected by name. *First result.* Example::

        @accel.hookimpl
        def is_available():
            if importlib.util.find_spec("torch_npu") is None:
                return accel.Availability(False, reason="torch_npu is not installed",
                                          remedy="pip install torch_npu")
            return accel.Availability(True)
    """


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


@hookspec(firstresult=True)
def get_device(accelerator: str, index: int | None) -> torch.device | None:
    """Return the :class:`torch.device` for device ``index`` (``None``: the default one).

    The registry has already checked ``index`` against :func:`device_count`.
    *First result.* Example::

        @accel.hookimpl
        def get_device(index):
            return torch.device("npu", 0 if index is None else index)
    """


@hookspec(firstresult=True)
def distributed_backend(accelerator: str) -> str | None:
    """Name the :mod:`torch.distributed` backend for this accelerator (``"gloo"``,
    ``"nccl"``, ``"xla"``, ``"hccl"``, ...). *First result.* Example::

        @accel.hookimpl
        def distributed_backend():
            return "hccl"
    """


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


@hookspec
def post_move_hook(
    accelerator: str, model: torch.nn.Module, device: torch.device, context: MoveContext
) -> None:
    """Called after the move with the moved model; fix up and validate it here.

    On a move that unties (to or from XLA, say), accel has already re-tied the
    groups it remembered on the module ``model_to_device`` returned, called its own
    ``tie_weights()`` and validated; after every ``post_move_hook`` it checks the ties
    once more (a hook that broke or made one is reported by ``tie_check``). Raise to
    fail the move: the model is restored and the exception reaches the caller. Example::

        @accel.hookimpl
        def post_move_hook(model, device):
            for name, param in model.named_parameters():
                if param.device != device:
                    raise RuntimeError(f"{name} stayed on {param.device}")
    """


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


# -- the training step ---------------------------------------------------------------


@hookspec(firstresult=True)
def optimizer_step(
    accelerator: str,
    optimizer: torch.optim.Optimizer,
    closure: Callable[[], Any] | None,
    device: torch.device,
    scaler: torch.amp.GradScaler | None,
) -> Any:
    """Step ``optimizer`` (with ``closure`` when given); return the step's value.

    *Action hook.* The fallback is ``optimizer.step(closure)``, or with a ``scaler``
    ``scaler.step(optimizer)`` then ``scaler.update()``. A plain implementation
    replaces it and must honour ``closure`` and ``scaler`` the same way (the TPU
    plugin's reduces gradients across replicas, steps, and marks the XLA step).
    Work around the step is a wrapper. Example::

        @accel.hookimpl(wrapper=True)
        def optimizer_step(optimizer):
            my_runtime.all_reduce_gradients(optimizer)
            result = yield  # the step itself
            my_runtime.flush()
            return result
    """


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


@hookspec(firstresult=True)
def no_sync(
    accelerator: str, model: torch.nn.Module, enabled: bool, device: torch.device
) -> AbstractContextManager[Any] | None:
    """Return a context in which ``backward()`` does not reduce ``model``'s gradients
    across processes: the micro-steps of gradient accumulation.

    ``enabled`` is ``False`` on the micro-step that must sync (the last); return a
    context that changes nothing then. *First result*: the fallback uses DDP's
    ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``, and nothing for a
    plain model. Implement it for a runtime that reduces gradients in ``backward()``
    in a way of its own. Example::

        @accel.hookimpl
        def no_sync(model, enabled):
            return my_runtime.skip_gradient_reduction(model) if enabled else None
    """


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


@hookspec(firstresult=True)
def compile_backend(accelerator: str, device: torch.device) -> str | Callable[..., Any] | None:
    """Name the ``torch.compile`` backend for this accelerator: a registered backend
    name (``torch._dynamo.list_backends()``) or a backend callable.

    *First result*: the fallback is ``"inductor"``; the TPU plugin answers
    ``"openxla"``. Where the answer is ``"inductor"`` (the fallback's too) and inductor
    has no backend for the device type, accel compiles with ``"aot_eager"`` and warns
    once (``PluginWarning``). To get inductor there, register a backend with
    ``torch._inductor.codegen.common.register_backend_for_device``, or answer another
    backend here. Example::

        @accel.hookimpl
        def compile_backend():
            return "npu_backend"  # registered by the vendor's torch extension
    """


@hookspec(firstresult=True)
def mark_step(accelerator: str, device: torch.device) -> None:
    """Cut the pending lazy graph and send it to the device (a step boundary).

    *Action hook*: the fallback does nothing, right for any eager device; the TPU
    plugin calls ``torch_xla.sync()``. Example::

        @accel.hookimpl
        def mark_step(device):
            my_lazy_runtime.flush(device)
    """


@hookspec(firstresult=True)
def synchronize(accelerator: str, device: torch.device) -> None:
    """Block until ``device`` has finished the work queued on it so far.

    *Action hook*: the fallback calls ``torch.accelerator.synchronize`` for a device
    type torch drives itself (never the CPU or CUDA), and returns without waiting where
    there is nothing to wait for or the backend refuses (torch-opencl); it never
    raises. Example::

        @accel.hookimpl
        def synchronize(device):
            torch.npu.synchronize(device)
    """


@hookspec(firstresult=True)
def manual_seed(accelerator: str, seed: int, device: torch.device) -> None:
    """Seed the random number generators of this accelerator's devices.

    accel has seeded the host first (``torch.manual_seed``, which also seeds CUDA, MPS,
    XPU and a registered ``privateuse1`` backend). *Action hook*: the fallback calls
    ``torch.<type>.manual_seed_all`` for the device type ``torch.accelerator`` reports;
    implement it for a runtime with random state of its own, as XLA has. Example::

        @accel.hookimpl
        def manual_seed(seed, device):
            my_runtime.set_rng_state(seed, device)
    """


@hookspec(firstresult=True)
def autocast(
    accelerator: str, device: torch.device, dtype: torch.dtype | None
) -> AbstractContextManager[Any] | None:
    """Return a context manager that runs its block in mixed precision on ``device``.

    ``dtype`` is what the user asked for, or ``None`` for the accelerator's preferred
    low-precision type. Raise ``ValueError`` for a type the device cannot autocast to
    (:func:`accel.training.precision.autocast_to` checks and writes the message).
    *First result*: the fallback is ``torch.autocast`` for the device's type, defaulting
    to ``torch.get_autocast_dtype``. Example::

        @accel.hookimpl
        def autocast(accelerator, device, dtype):
            return accel.training.precision.autocast_to(
                accelerator, device, dtype, default=torch.float16,
                supported=(torch.float16, torch.bfloat16))
    """


@hookspec(firstresult=True)
def memory_stats(accelerator: str, device: torch.device) -> MemoryStats | None:
    """Report the device's memory use as an :class:`accel.MemoryStats` dict.

    Keys ``allocated_bytes``, ``peak_allocated_bytes`` and ``total_bytes``; each an
    ``int``, or ``None`` when the runtime does not report it (never a guess).
    *First result*: the fallback reads ``torch.accelerator``'s counters for a device
    type torch drives (the total from ``get_memory_info`` where torch has it), and
    otherwise reports all three as ``None``; a counter the backend refuses (torch's
    ``NotImplementedError``, a ``RuntimeError``) is ``None``, never an error. Example::

        @accel.hookimpl
        def memory_stats(device):
            return accel.MemoryStats(
                allocated_bytes=torch.npu.memory_allocated(device),
                peak_allocated_bytes=torch.npu.max_memory_allocated(device),
                total_bytes=torch.npu.get_device_properties(device).total_memory,
            )
    """


@hookspec(firstresult=True)
def device_loader(
    accelerator: str,
    loader: Iterable[Any],
    device: torch.device,
    move: Callable[[Any], Any],
) -> Iterable[Any] | None:
    """Return an iterable over ``loader``'s batches with their tensors on ``device``,
    iterable again every epoch (a class with ``__iter__``, not a generator).

    Pass every batch through ``move`` (the handle's ``batch_to_device``, with every
    plugin's batch hooks). Transfer ahead of use where the device allows it (the TPU
    plugin uses torch_xla's ``MpDeviceLoader``; CUDA copies the next batch from pinned
    memory). ``loader`` may be a ``DeviceLoader`` itself (wrapped twice). *First
    result*: the fallback moves each batch with ``move`` as it is taken. Example::

        @accel.hookimpl
        def device_loader(loader, device, move):
            return my_runtime.PrefetchingLoader(loader, device, then=move)
    """


@hookspec(firstresult=True)
def state_dict(accelerator: str, model: torch.nn.Module) -> dict[str, Any] | None:
    """Return ``model``'s state dict with every tensor on the CPU.

    A tensor the model holds under several names (a tied weight) must be one CPU
    tensor under all of them, so that ``torch.save`` stores it once and
    ``load_state_dict`` restores the tie. *First result*: the fallback copies each
    distinct tensor once.
    Example::

        @accel.hookimpl
        def state_dict(model):
            my_runtime.wait_for_pending_writes()
            return None  # then let the fallback copy
    """


@hookspec(firstresult=True)
def save(accelerator: str, obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` to ``path`` atomically (the previous file or the new one, never a
    torn one), its tensors on the CPU. *Action hook*.

    Called in both modes. ``acc.save(obj, path)``: on every process, in the loop's
    thread (tensors may still be on the device); only the main process writes, every
    process returns once the file is complete, and a failed write raises an
    ``OSError`` on every process. The fallback
    (:func:`accel.training.checkpoint.save_on_main_process`) writes on rank 0 and tells
    the others. ``acc.save(..., asynchronous=True)``: in accel's background writer,
    only on the process that writes (a lone process, or rank 0 of a distributed job),
    with ``obj`` a snapshot whose tensors are all on the CPU: only write, use no
    collective; accel tells the other ranks over a gloo group of its own.
    :func:`accel.training.checkpoint.writing_in_background` tells the modes apart (not
    the thread: a loop may run in one of its own, as Ray Train's does). Example::

        @accel.hookimpl
        def save(obj, path):
            if accel.training.checkpoint.writing_in_background():
                accel.training.checkpoint.atomic_save(obj, path)  # only write
            else:
                if my_runtime.rank() == 0:
                    accel.training.checkpoint.atomic_save(obj, path)
                my_runtime.barrier()
    """


@hookspec(firstresult=True)
def load(accelerator: str, path: str | os.PathLike[str]) -> Any:
    """Read the object :func:`save` wrote to ``path``, its tensors on the CPU.

    Must read with ``weights_only=True`` (a checkpoint never runs code). The handle then
    restores the state into the user's objects in place and marks the step. *First
    result*: the fallback is ``torch.load(path, map_location="cpu", weights_only=True)``
    with clear errors.
    Example::

        @accel.hookimpl
        def load(path):
            my_runtime.prefetch(path)
            return None  # then let the fallback read it
    """


@hookspec(firstresult=True)
def restore_to_device(
    accelerator: str, tensors: list[torch.Tensor], device: torch.device
) -> list[torch.Tensor] | None:
    """Copy the host tensors of a checkpoint being restored to ``device`` together;
    return the device tensors, in the same order.

    ``acc.load(path, state)`` asks it once, with each distinct tensor
    ``load_state_dict`` would copy to ``device``; the objects then load the device
    tensors. Implement it where one transfer of many tensors is faster (XLA: one upload
    for the lot). *First result*: the fallback answers only for a device that refuses
    to copy a host tensor into one of its own in place (``nntile``), with
    ``.to(device)`` per tensor; elsewhere ``None`` (each host tensor copied into place).
    Example::

        @accel.hookimpl
        def restore_to_device(tensors, device):
            return my_runtime.upload_all(tensors, device)
    """


@hookspec(firstresult=True)
def rng_state(accelerator: str, device: torch.device) -> Any:
    """Return the state of this accelerator's device generators (host ones are accel's).

    The value is stored in checkpoints, so it must hold only what
    ``torch.load(weights_only=True)`` reads: tensors, numbers, strings, containers.
    *First result*: the fallback returns ``{"type": device.type, "states": [...]}``
    from ``torch.<device type>.get_rng_state_all()`` (CUDA, XPU, ...) or
    ``get_rng_state()`` (MPS), and no states for the CPU (torch's host generator is
    stored by accel itself). Example::

        @accel.hookimpl
        def rng_state(device):
            return {"type": "npu", "seed": my_runtime.current_seed(device)}
    """


@hookspec(firstresult=True)
def set_rng_state(accelerator: str, state: Any, device: torch.device) -> None:
    """Put back the device generator state :func:`rng_state` returned.

    *Action hook*: the fallback sets what its ``rng_state`` read and refuses a state
    from another device type with a ``ValueError``. Example::

        @accel.hookimpl
        def set_rng_state(state, device):
            my_runtime.set_seed(state["seed"], device)
    """
