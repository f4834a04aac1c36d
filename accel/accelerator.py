"""The handle :func:`accel.get_accelerator` returns."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeVar, final, overload

import torch
from torch import nn

from accel._core.hooks import AcceleratorHooks
from accel._core.moving import move_model
from accel._util.notes import add_note
from accel.training._compiling import checked_compile_target
from accel.training._materialize import Init, Source, materialize_model
from accel.training.batch import BatchMover
from accel.training.checkpoint._async_save import PendingSave, wait_for_saves
from accel.training.checkpoint._load import load_and_restore
from accel.training.checkpoint._preemption import PreemptionGuard
from accel.training.checkpoint._rng import host_rng_state, set_host_rng_state
from accel.training.checkpoint._save import save_checkpoint
from accel.training.checkpoint._state import checked_state_dict_model
from accel.training.device_loader import DeviceLoader
from accel.training.precision import checked_autocast_arguments, full_precision, requested_dtype
from accel.training.step import (
    checked_clip_arguments,
    checked_device_index,
    checked_loader,
    checked_no_sync_arguments,
    checked_seed,
    checked_step_arguments,
    unwrap_compiled,
)
from accel.types import AcceleratorSpec, MemoryStats, TieCheck, checked_tie_check

__all__ = ["Accelerator"]

_Model = TypeVar("_Model", bound=nn.Module)
_Batch = TypeVar("_Batch")
_Compiled = TypeVar("_Compiled", bound=Callable[..., Any])


@final
class Accelerator:
    """One selected accelerator and device: moves models and batches there.

    Obtain it from :func:`accel.get_accelerator` or
    :meth:`AcceleratorRegistry.get_accelerator`; every operation runs the hooks of
    this accelerator's plugin and of cross-cutting plugins, never another
    accelerator's. Every method is a thin call into the hook of the same name (see
    :mod:`accel.hookspecs`) or into the function that does the work.
    """

    __slots__ = ("_hooks", "_tie_check", "device", "index", "spec")

    def __init__(
        self,
        hooks: AcceleratorHooks,
        spec: AcceleratorSpec,
        *,
        index: int | None,
        device: torch.device,
        tie_check: TieCheck = "error",
    ) -> None:
        self._hooks = hooks
        #: What the plugin declared: name, aliases, priority, description.
        self.spec = spec
        #: The device index asked for (``None``: the accelerator's default device).
        self.index = index
        #: The :class:`torch.device` models and batches move to, e.g. ``xla:0``.
        self.device = device
        self._tie_check: TieCheck = tie_check

    @property
    def name(self) -> str:
        """Canonical accelerator name, e.g. ``"tpu"`` (also when selected as ``"xla"``)."""
        return self.spec.name

    @property
    def tie_check(self) -> TieCheck:
        """What a move does when tied weights came apart.

        ``"error"`` (default) raises :class:`accel.WeightTyingError` and restores the
        model; ``"warn"`` warns (:class:`accel.TyingWarning`) and keeps the moved model
        with the ties and values it had before the move; ``"off"`` does the same
        silently. Ties the model's ``tie_weights()`` would add, which accel undoes, warn
        under ``"error"`` too. Only moves that untie check at all, as torch's own rule
        says for their source and target device types (to or from XLA, ``meta`` or a
        PrivateUse1 backend, any move in torch's overwrite mode), or where the
        accelerator declares ``unties_weights``; CPU and CUDA moves never do.
        """
        return self._tie_check

    @tie_check.setter
    def tie_check(self, value: TieCheck) -> None:
        self._tie_check = checked_tie_check(value)

    def __repr__(self) -> str:
        return f"Accelerator(name={self.name!r}, device={str(self.device)!r})"

    def __eq__(self, other: object) -> bool:
        # Two handles of one registry's accelerator on one device do the same thing
        # (tie_check is a setting of the handle, not what it selects).
        if not isinstance(other, Accelerator):
            return NotImplemented
        return self._hooks is other._hooks and self.device == other.device

    def __hash__(self) -> int:
        return hash((id(self._hooks), self.device))

    def is_available(self) -> bool:
        """Whether the accelerator can still be used (asks its plugin again)."""
        return self._hooks.availability().available

    def device_count(self) -> int:
        """How many devices of this accelerator the process can use."""
        return self._hooks.device_count() if self.is_available() else 0

    def for_index(self, index: int) -> Accelerator:
        """The same accelerator on device ``index`` (as ``get_accelerator("NAME:INDEX")``).

        :raises accel.AcceleratorUnavailableError: ``index`` is beyond :meth:`device_count`.
        """
        checked_device_index(index)
        device = self._hooks.device(index, requested=f"{self.name}:{index}")
        return Accelerator(
            self._hooks, self.spec, index=index, device=device, tie_check=self._tie_check
        )

    @property
    def distributed_backend(self) -> str:
        """The :mod:`torch.distributed` backend for this accelerator, e.g. ``"nccl"``."""
        return self._hooks.distributed_backend()

    def model_to_device(
        self,
        model: _Model,
        *,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    ) -> _Model:
        """Move ``model`` to :attr:`device` through the plugins' hooks and return it.

        Runs ``pre_move_hook``, ``model_to_device`` and ``post_move_hook``; on a move
        that unties (see :attr:`tie_check`) the ties are remembered after the pre hooks
        and re-tied and validated, on the module the move returned, before the post
        hooks. If any
        step fails, the model is restored (same objects in every slot, devices,
        storage, ties, gradients, ``requires_grad`` and training mode) and the
        exception is re-raised with a note saying so; tensors a hook changed in place
        cannot be restored without copies, and the note names each of them.

        Moves of one model from several threads run one at a time; moves of
        different models run concurrently.

        A torch_xla ``MpModelWrapper`` (used when processes are forked) is accepted
        too: its wrapped model moves under the wrapper's lock, as the wrapper's own
        ``to()`` would move it, and that model is returned.

        :param optimizer: optimizer(s) built on the model's parameters; their
            parameter groups and state are remapped to the moved parameters.
        :raises ValueError: none of the optimizers holds any of the model's parameters.
        """
        return move_model(self._hooks, self.spec, self.device, self._tie_check, model, optimizer)

    def materialize(
        self, model: _Model, init: Init | None = None, *, load: Source | None = None
    ) -> _Model:
        """Allocate a model built on ``meta`` on :attr:`device`, every tie group one
        Parameter (its ``tie_weights()`` honoured), then fill it: ``init(model)``, or
        else each module's ``reset_parameters()`` in module order (values as in a
        one-process build, a shard of a sharded model its own), or ``load``, a state
        dict or the path of an :meth:`save` file or ``save_sharded`` directory, copied
        in place. Tensors already off ``meta`` keep their values. On failure the model
        is as it was.

        :raises TypeError: ``init`` and ``load`` both given, or of the wrong type.
        :raises ValueError: nothing is on ``meta``, or a tensor that was is still there
            or was never written (named).
        :raises KeyError: ``load`` lacks a tensor of the model (named).
        :raises accel.WeightTyingError: the ties changed (as in a move, by ``tie_check``).
        """
        return materialize_model(model, self.device, self.name, self._tie_check, init, load)

    def batch_to_device(self, batch: Any) -> Any:
        """Move every tensor in ``batch`` (nested dicts, lists, tuples, namedtuples,
        dataclasses) to :attr:`device`, keeping container types; other values pass
        through unchanged.
        """
        return self._hooks.batch_to_device(batch, self.device)

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], Any] | None = None,
        *,
        scaler: torch.amp.GradScaler | None = None,
    ) -> Any:
        """Step ``optimizer`` as this accelerator needs; return what the step returns.

        On XLA this reduces gradients across replicas when several processes train
        (torch_xla's own reduction; not again for gradients :meth:`clip_grad_norm_`
        reduced), steps, and marks the step, so a loop compiles a bounded number of
        graphs. Elsewhere it is ``optimizer.step(closure)``. With ``scaler`` (from
        :meth:`grad_scaler`) the step is ``scaler.step(optimizer)`` then
        ``scaler.update()``, inside the same reduction and mark.

        :raises TypeError: ``optimizer`` is not a ``torch.optim.Optimizer``,
            ``closure`` is neither ``None`` nor callable, or ``scaler`` is no scaler.
        :raises ValueError: both ``closure`` and an enabled ``scaler``.
        """
        checked_step_arguments(optimizer, closure, scaler)
        try:
            return self._hooks.optimizer_step(optimizer, closure, self.device, scaler)
        except Exception as exc:
            add_note(
                exc,
                f"accel: optimizer_step for accelerator {self.name!r} failed; the model "
                f"and optimizer are as the optimizer left them.",
            )
            raise

    def clip_grad_norm_(
        self,
        parameters: Iterable[torch.Tensor] | torch.Tensor,
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Scale the gradients of ``parameters`` so their total ``norm_type``-norm is at
        most ``max_norm``; return the norm before clipping, as a tensor (no host sync).

        Equal to ``torch.nn.utils.clip_grad_norm_`` on one device; with FSDP2's sharded
        gradients the norm is the whole model's. On XLA with several replicas the
        gradients are reduced across replicas first (so every replica clips the same,
        reduced gradients) and :meth:`optimizer_step` does not reduce them again. With a
        float16 ``scaler``, call ``scaler.unscale_(optimizer)`` first.

        :raises TypeError: ``parameters`` holds something other than tensors, or a norm
            is not a number.
        :raises ValueError: ``max_norm`` is negative or NaN, or ``norm_type`` is not
            positive.
        """
        params, maximum, norm = checked_clip_arguments(parameters, max_norm, norm_type)
        return self._hooks.clip_grad_norm_(params, maximum, norm, self.device)

    def no_sync(self, model: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """A context in which ``backward()`` does not all-reduce ``model``'s gradients:
        the micro-steps of gradient accumulation. ``enabled=False`` (the last micro-step)
        changes nothing, so one ``with`` serves every micro-step.

        DDP's ``no_sync()``; FSDP2's ``set_requires_gradient_sync(False)`` (set back to
        ``True`` on exit); on XLA, where gradients are reduced only in
        :meth:`clip_grad_norm_` and :meth:`optimizer_step`, and for a plain model,
        nothing to skip. Pass a DDP wrapper itself, not its ``.module``: that one's
        ``backward()`` all-reduces all the same, and accel warns
        (:class:`~accel.errors.GradientSyncWarning`) when a DDP forward runs it here.

        :raises TypeError: ``model`` is not a module, or ``enabled`` not a bool.
        """
        checked_no_sync_arguments(model, enabled)
        return self._hooks.no_sync(model, enabled, self.device)

    def grad_scaler(
        self, dtype: torch.dtype | str | None = None, **options: Any
    ) -> torch.amp.GradScaler | None:
        """A ``torch.amp.GradScaler`` for this device where training in ``dtype`` (by
        default the accelerator's :meth:`autocast` type) needs loss scaling, float16;
        ``None`` for bfloat16 and float32. ``options`` go to the scaler
        (``init_scale=``, ``growth_interval=``, ...). Pass the result to
        :meth:`optimizer_step` as ``scaler=``; ``None`` there means no scaling, so one
        loop serves both.

        :raises ValueError: the device cannot autocast to ``dtype``.
        """
        chosen = requested_dtype(dtype)
        if chosen is not torch.float32:
            # The same refusal as autocast(); with no dtype asked, the accelerator's
            # default, as its autocast hook chooses it.
            context = self._hooks.autocast(self.device, chosen)
            if chosen is None:
                chosen = getattr(context, "fast_dtype", None)
        if chosen is not torch.float16:
            return None
        return self._hooks.grad_scaler(self.device, options)

    def compile(self, model: _Compiled, **options: Any) -> _Compiled:
        """``torch.compile(model, **options)`` with this accelerator's backend (the
        ``compile_backend`` hook: inductor on the CPU and CUDA, ``openxla`` on TPU);
        ``backend=`` in ``options`` overrides it. The compiled module shares the
        model's parameters, so ties stay tied, and :meth:`state_dict` of it has the
        plain model's keys (no ``_orig_mod.`` prefix).

        :raises TypeError: ``model`` is neither a module nor a callable.
        """
        checked_compile_target(model)
        backend = options.pop("backend", None)
        if backend is None:
            backend = self._hooks.compile_backend(self.device)
        return torch.compile(model, backend=backend, **options)  # type: ignore[return-value]

    def mark_step(self) -> None:
        """End a step: on XLA, cut the pending lazy graph and run it; elsewhere nothing."""
        self._hooks.mark_step(self.device)

    def synchronize(self) -> None:
        """Block until the device has finished the work queued on it so far."""
        self._hooks.synchronize(self.device)

    def manual_seed(self, seed: int) -> None:
        """Seed torch on the host and on this accelerator's devices (XLA keeps its own
        random state), so the same seed gives the same run on this accelerator.

        :raises TypeError: ``seed`` is not an int.
        :raises ValueError: ``seed`` is outside what torch accepts.
        """
        checked_seed(seed)
        self._hooks.manual_seed(seed, self.device)

    def autocast(
        self, dtype: torch.dtype | str | None = None, *, enabled: bool = True
    ) -> AbstractContextManager[Any]:
        """A context manager running its block in mixed precision on this accelerator.

        ``dtype`` defaults to the accelerator's preferred low-precision type: bfloat16
        on TPU and CPU, on CUDA bfloat16 where the GPU supports it and float16
        otherwise, float16 on MPS. Uses ``torch.autocast``. A dtype may be given by
        name (``"bfloat16"``).

        ``enabled=False``, or ``dtype=torch.float32``, runs the block in full
        precision, also inside an enclosing ``autocast`` block (a loss computed in
        float32); that needs no plugin, so it asks no hook.

        :raises ValueError: the device cannot autocast to ``dtype`` (torch itself would
            only warn and run the block in full precision).
        """
        chosen = checked_autocast_arguments(dtype, enabled)
        if not enabled or chosen is torch.float32:
            return full_precision(self.device)
        return self._hooks.autocast(self.device, chosen)

    def memory_stats(self) -> MemoryStats:
        """This device's memory: ``allocated_bytes``, ``peak_allocated_bytes``,
        ``total_bytes``, the same keys on every accelerator; a value the runtime does not
        report is ``None``. On the CPU: the process's resident memory and the RAM.
        """
        return self._hooks.memory_stats(self.device)

    def device_loader(self, loader: Iterable[_Batch]) -> DeviceLoader[_Batch]:
        """Iterate ``loader``'s batches already on :attr:`device`, moved ahead of use.

        XLA uses torch_xla's parallel loader and marks the step as the next batch is
        handed out, except between the micro-steps of an accumulation; CUDA copies the
        next batch from pinned memory while the current one is used; the CPU yields the
        batches as they are. ``len()`` is the loader's, where it
        has one; every ``for`` over the result is a new epoch.

        :raises TypeError: ``loader`` is not iterable.
        """
        checked_loader(loader)
        # No plugin moves batches: the loader gets accel's own mover, which a loader
        # that moved a batch whole itself may skip.
        plugin_moves = self._hooks.answered_by_plugin("batch_to_device")
        move = self.batch_to_device if plugin_moves else BatchMover(self.device)
        batches = self._hooks.device_loader(loader, self.device, move)
        return DeviceLoader(loader, batches, f"{type(loader).__name__} -> {self.device}")

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        """``model``'s state dict with every tensor on the CPU; a tensor the model holds
        under several names (a tied weight) is one CPU tensor under all of them, so
        ``torch.save`` stores it once and ``load_state_dict`` restores the tie. Of a
        compiled model (:meth:`compile`), the plain model's keys.
        """
        checked_state_dict_model(model)
        return self._hooks.state_dict(unwrap_compiled(model))

    @overload
    def save(
        self, obj: Any, path: str | os.PathLike[str], *, asynchronous: Literal[False] = False
    ) -> None: ...

    @overload
    def save(
        self, obj: Any, path: str | os.PathLike[str], *, asynchronous: Literal[True]
    ) -> PendingSave: ...

    def save(
        self, obj: Any, path: str | os.PathLike[str], *, asynchronous: bool = False
    ) -> PendingSave | None:
        """Write ``obj`` to ``path`` atomically and durably, its tensors on the CPU
        (shared tensors stay shared); in a distributed job only the main process
        writes, and every process returns once the file is complete.

        Modules, optimizers, LR schedulers and grad scalers are stored as their state
        dicts (a module's through :meth:`state_dict`, a tied weight once), as ``obj``
        itself or anywhere in its dicts, lists and tuples; other values as they are.
        ``path`` holds the previous file or the new one at any moment, never a torn
        one. Saving leaves every random generator as it was.

        With ``asynchronous=True`` it returns once every tensor is copied off the
        device (a snapshot, CPU tensors included: a change made after it returns
        never reaches the file), and writes in a background thread; the pending save
        it returns has ``wait()`` and ``done()``. One save is in flight at a time:
        every save first waits for the pending one, and raises its failure.

        :raises TypeError: something in ``obj`` that :meth:`load` could not read back
            (``weights_only``), named by its key path; nothing is written.
        :raises OSError: the file could not be written; the message names ``path``,
            and the previous file there is unchanged. Also the failure of the
            pending asynchronous save, not raised before.
        """
        return save_checkpoint(
            obj, path, asynchronous=asynchronous, hooks=self._hooks, device=self.device
        )

    def wait_for_saves(self) -> None:
        """Wait until the pending asynchronous save (of :meth:`save` or
        :func:`accel.distributed.save_sharded`) is complete and durable.

        :raises OSError: it failed, and its failure was not raised before (by its
            ``wait()`` or the next save); the previous checkpoint at its path is
            unchanged.
        """
        wait_for_saves()

    def load(self, path: str | os.PathLike[str], state: Any = None) -> Any:
        """Read a checkpoint :meth:`save` wrote, with ``weights_only=True``.

        Without ``state``: the stored object, its tensors on the CPU. With ``state``
        (the dict that was saved, say): every value with ``load_state_dict`` gets its
        stored state in place (a module keeps its device and its ties, optimizer state
        lands on its parameters' device; a compiled model through the model it wraps),
        and the other stored entries are returned as a dict. ``state`` may also be the
        one object that was saved on its own (``save(model, path)`` stores the model's
        state dict; ``load(path, model)`` restores it and returns ``{}``). Nothing
        changes unless everything fits: modules' keys and shapes, optimizers' parameter
        groups and parameter-shaped state are all checked first.

        :raises FileNotFoundError: no file at ``path``.
        :raises KeyError: a key of ``state`` is not in the file (plain values too).
        :raises ValueError: the file is not a checkpoint, or a module's parameters differ
            in name or shape, or an optimizer's parameter groups (named).
        :raises pickle.UnpicklingError: the file holds objects ``weights_only`` refuses.
        """
        return load_and_restore(path, state, hooks=self._hooks, device=self.device)

    def rng_state(self) -> dict[str, Any]:
        """The state of every generator a run draws from: ``"python"``, ``"numpy"``
        (``None`` without NumPy), ``"torch"`` (the host) and ``"device"`` (this
        accelerator's generators; XLA keeps its own). Store it in a checkpoint and give
        it back to :meth:`set_rng_state`."""
        return {**host_rng_state(), "device": self._hooks.rng_state(self.device)}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Put every generator back as :meth:`rng_state` found it.

        :raises TypeError: ``state`` is not a dict.
        :raises ValueError: an entry is missing, or the device state is from another
            device type.
        """
        set_host_rng_state(state)
        if state.get("device") is not None:
            self._hooks.set_rng_state(state["device"], self.device)

    def preemption_guard(self, *, signals: tuple[int, ...] | None = None) -> PreemptionGuard:
        """A context manager that notes SIGTERM and SIGUSR1 instead of dying of them.

        Inside it, ``guard.requested`` turns true at the step where a signal was noted,
        on every process of a distributed job at the same step; save then and leave
        the loop. The previous signal handlers are back on exit. A signal that came
        before the guard was entered, from the run's first call into accel on (under
        SLURM, or everywhere with ``ACCEL_EARLY_SIGNALS=1``), shows at the first read.
        """
        return PreemptionGuard(self.device, signals=signals)
