"""Gradient accumulation: switching off the gradient all-reduce on micro-steps.

With DDP every ``backward()`` all-reduces the gradients; over k micro-steps that is
k - 1 reductions too many. DDP has ``model.no_sync()`` for that, FSDP2 has
``set_requires_gradient_sync(False)``, and a plain model (one process, or XLA, where
accel reduces in ``clip_grad_norm_`` / ``optimizer_step`` only) has nothing to skip.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import pluggy

from accel.errors import GradientSyncWarning

if TYPE_CHECKING:
    from torch import nn

__all__ = ["gradient_sync_paused"]

# Frames skipped to find the caller's line: accel's own and pluggy's (hook calls).
_INTERNAL_DIRECTORIES: Final = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(inspect.getfile(pluggy))) + os.sep,
)


def gradient_sync_paused(model: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
    """A context in which ``backward()`` does not reduce ``model``'s gradients across
    processes (``enabled=False``: a context that changes nothing, for the last
    micro-step)."""
    if not enabled:
        return nullcontext()
    no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel (and FSDP1)
    if callable(no_sync):
        return no_sync()  # type: ignore[no-any-return]
    if callable(getattr(model, "set_requires_gradient_sync", None)):  # FSDP2's fully_shard
        return _fsdp2_without_sync(model)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # Nothing to skip on a plain module, unless it is the one a DDP wrapper wraps
        # (``ddp.module``): that one's backward() all-reduces all the same.
        return _watching_for_a_wrapper(model, _caller())
    return nullcontext()


@contextmanager
def _watching_for_a_wrapper(model: nn.Module, caller: _Line | None) -> Iterator[None]:
    """Warn, once, at the caller's line, if a DDP forward runs ``model`` in the block."""
    from torch.nn.parallel import DistributedDataParallel

    def check(module: nn.Module, args: Any) -> None:
        active = getattr(DistributedDataParallel, "_get_active_ddp_module", lambda: None)()
        if active is not None and active.module is model:
            handle.remove()
            _warn_at(
                caller,
                f"acc.no_sync() was given the {type(model).__name__} that a "
                f"{type(active).__name__} wraps (its .module), so backward() still "
                f"all-reduces the gradients on every micro-step (the results are right, "
                f"the saving is lost). Pass the wrapper itself: acc.no_sync(ddp, ...), "
                f"the model wrap_data_parallel() returned, not its .module.",
            )

    handle = model.register_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()


class _Line(NamedTuple):
    """A line of the caller's code, as warnings need it."""

    filename: str
    lineno: int
    module_globals: dict[str, Any]


def _caller() -> _Line | None:
    """The line outside accel and pluggy that called ``acc.no_sync``, read now (a
    frame's line number moves on as its code runs)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRECTORIES):
        frame = frame.f_back
    if frame is None:
        return None
    return _Line(frame.f_code.co_filename, frame.f_lineno, frame.f_globals)


def _warn_at(line: _Line | None, message: str) -> None:
    if line is None:
        warnings.warn(message, GradientSyncWarning, stacklevel=2)
        return
    warnings.warn_explicit(
        message,
        GradientSyncWarning,
        line.filename,
        line.lineno,
        module=line.module_globals.get("__name__"),
        registry=line.module_globals.setdefault("__warningregistry__", {}),
        module_globals=line.module_globals,
    )


@contextmanager
def _fsdp2_without_sync(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        # FSDP2 has no getter: the next backward outside the block syncs, as with DDP.
        model.set_requires_gradient_sync(True)
