"""The training-step hooks of the ``tpu`` plugin, on torch_xla.

XLA traces operations into a lazy graph and compiles each distinct graph once. A
loop that never marks a step boundary traces one ever-growing graph, compiled anew
every step (30 steps: 30 compilations, minutes instead of seconds); these hooks put
the boundary after every optimizer step, or, inside an ``acc.device_loader`` loop,
at the next batch (:mod:`accel.plugins._xla_loader`, which cuts no graph between the
micro-batches of an accumulation).

Why not always right after the step: the gradients are still alive then, so the
graph has to write them out as results; one batch later ``zero_grad()`` has dropped
them. On GPT-2 small that is a quarter of the step's time and a gigabyte of memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from accel.errors import AcceleratorRuntimeError, AcceleratorValueError
from accel.markers import hookimpl
from accel.plugins._xla_cut import cut, hold_for_step, release_held
from accel.plugins._xla_gradients import note_reduced, reduce_for_clipping, reduce_for_step
from accel.plugins._xla_loader import XlaLoader, chain, watch_model
from accel.plugins._xla_loader import loop_state as _loop_state
from accel.training.checkpoint import writing_in_background
from accel.training.checkpoint._atomic import atomic_save
from accel.training.checkpoint._main_process import Word, in_a_job, written_by_main
from accel.training.device_loader import DeviceLoader
from accel.training.memory import unknown
from accel.training.precision import bfloat16_autocast
from accel.training.step import clip_grad_norm, step_optimizer
from accel.types import MemoryStats

if TYPE_CHECKING:
    import torch
    from torch import nn

    from accel.types import MemoryStats

__all__ = ["XlaTrainingHooks"]


class XlaTrainingHooks:
    """Gradient reduction and clipping, compiling, step marking, RNG, precision, memory,
    loading, saving."""

    @hookimpl
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], Any] | None,
        device: torch.device,
        scaler: torch.amp.GradScaler | None,
    ) -> Any:
        """The step, done here (accel's fallback then does not run): the gradients
        reduced across replicas, the step, and the XLA step marked after it."""
        hold_for_step(optimizer, device)  # XLA:CPU only: see accel.plugins._xla_cut
        if closure is None:
            # All-reduce, only when several replicas train, and not again what clipping
            # did; before a scaler's step, so every replica sees the same overflow.
            reduce_for_step(optimizer)
            step_closure = None
        else:
            # The optimizer evaluates the closure (LBFGS several times): each
            # evaluation's gradients are reduced before the optimizer uses them.
            def step_closure() -> Any:
                loss = closure()
                reduce_for_step(optimizer)
                return loss

        # With a closure, a scaler is a disabled one (the handle checks).
        result = step_optimizer(optimizer, step_closure, scaler)
        loop = _loop_state()
        if loop.active and loop.fetches != loop.fetches_at_last_step:
            loop.owed = True  # a device_loader loop: its next batch marks the step
        else:
            cut()
            loop.owed = False
        loop.fetches_at_last_step = loop.fetches
        return result

    @hookimpl
    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        reduce_for_clipping(parameters)  # every replica clips the same, reduced gradients
        norm = clip_grad_norm(parameters, max_norm, norm_type)
        note_reduced(parameters)  # so optimizer_step does not reduce them again
        return norm

    @hookimpl
    def compile_backend(self) -> str:
        return "openxla"  # torch_xla's dynamo backend

    @hookimpl
    def mark_step(self) -> None:
        cut()

    @hookimpl
    def synchronize(self) -> None:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()
        release_held()  # nothing runs any more that could read them

    @hookimpl
    def manual_seed(self, seed: int, device: torch.device) -> None:
        import torch_xla.core.xla_model as xm

        # accel seeded torch's host generator; XLA's is separate (seeds < 2**64).
        xm.set_rng_state(seed % 2**64, device=str(device))

    @hookimpl
    def autocast(
        self, accelerator: str, device: torch.device, dtype: torch.dtype | None
    ) -> AbstractContextManager[Any]:
        return bfloat16_autocast(accelerator, device, dtype)

    @hookimpl
    def memory_stats(self, device: torch.device) -> MemoryStats:
        import torch_xla.core.xla_model as xm

        try:
            info = xm.get_memory_info(device)
        except RuntimeError as exc:
            if "UNIMPLEMENTED" in str(exc) or "not supported" in str(exc):
                return unknown()  # XLA:CPU keeps no allocator statistics
            raise
        return MemoryStats(
            allocated_bytes=_int_or_none(info.get("bytes_used")),
            peak_allocated_bytes=_int_or_none(info.get("peak_bytes_used")),
            total_bytes=_int_or_none(info.get("bytes_limit")),
        )

    @hookimpl
    def device_loader(
        self, loader: Iterable[Any], device: torch.device, move: Callable[[Any], Any]
    ) -> Iterable[Any]:
        inner = loader.batches if isinstance(loader, DeviceLoader) else None
        if isinstance(inner, XlaLoader) and inner.device == device:
            # Wrapped twice: one parallel loader over the original loader, each batch
            # through both moves. Two nested ones would run torch_xla's loader inside
            # its own loader thread, which it refuses ("Expecting scope to be empty").
            return XlaLoader(inner.loader, device, chain(inner.move, move))
        return XlaLoader(loader, device, move)

    @hookimpl
    def post_move_hook(self, model: nn.Module, device: torch.device) -> None:
        # The gradients device_loader watches to cut the graph at the optimizer step
        # rather than at every micro-batch (accel.plugins._xla_loader).
        if device.type == "xla":
            watch_model(model)

    @hookimpl
    def state_dict(self) -> None:
        # Run what is pending first: each tensor then crosses to the CPU as data, not
        # as a graph of its own (one compilation per parameter otherwise).
        cut()
        return None  # the fallback copies each distinct tensor once

    @hookimpl
    def save(self, obj: Any, path: Any) -> None:
        import torch_xla.runtime as xr

        background = writing_in_background()
        if xr.world_size() == 1 or (background and in_a_job()):
            # Alone; or the background write of an asynchronous save on rank 0, whose
            # word accel carries to the other ranks over a gloo group of its own.
            atomic_save(obj, path)
            return
        if background:
            # Every replica writes in the background here; their word would travel as
            # an XLA collective, which a thread beside the loop's tracing must not run.
            raise AcceleratorRuntimeError(
                f"save: an asynchronous save of {str(path)!r} in a multi-process XLA run "
                f"needs a torch.distributed group (accel.distributed.init_process_group"
                f"('tpu')), so that rank 0 writes and the others hear from it over gloo; "
                f"start one, or save with asynchronous=False"
            )
        import torch_xla.core.xla_model as xm

        main = xm.is_master_ordinal(local=False)
        written_by_main(lambda: atomic_save(obj, path), path, main=main, tell=_rendezvous)

    @hookimpl
    def restore_to_device(
        self, tensors: list[torch.Tensor], device: torch.device
    ) -> list[torch.Tensor]:
        import torch_xla.core.xla_model as xm

        # One upload for the lot (torch_xla's _xla_tensors_from_aten); load_state_dict's
        # copy_ from a CPU tensor, and an optimizer's .to(), would upload each one
        # synchronously (445 uploads for GPT-2 small + AdamW).
        return list(xm.send_cpu_data_to_device(tensors, device))

    @hookimpl
    def rng_state(self, device: torch.device) -> dict[str, Any]:
        import torch_xla.core.xla_model as xm

        # XLA's generator is one seed per device, advanced at every step mark.
        return {"type": "xla", "seed": int(xm.get_rng_state(device=str(device)))}

    @hookimpl
    def set_rng_state(self, accelerator: str, state: Any, device: torch.device) -> None:
        import torch_xla.core.xla_model as xm

        if not isinstance(state, dict) or state.get("type") != "xla" or "seed" not in state:
            found = state.get("type") if isinstance(state, dict) else type(state).__name__
            raise AcceleratorValueError(
                f"set_rng_state: the device generator state is from {found!r}, but "
                f"accelerator {accelerator!r} runs on XLA; resume on the accelerator that "
                f"saved it, or leave the 'device' entry out (the device draws then differ)"
            )
        xm.set_rng_state(int(state["seed"]), device=str(device))


def _rendezvous(word: Word) -> Word:
    """The master ordinal's word for :func:`written_by_main`, over XLA's rendezvous (a
    replica of ``xmp.spawn`` may have no torch.distributed group)."""
    import torch_xla.core.xla_model as xm

    payload = b"" if word is None else json.dumps(word).encode()
    heard = [bytes(told) for told in xm.rendezvous("accel.save", payload=payload)]
    told = next((json.loads(payload) for payload in heard if payload), None)
    return None if told is None else (told[0], told[1])


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]
