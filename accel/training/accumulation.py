"""Gradient accumulation: switching off the gradient all-reduce on micro-steps.

With DDP every ``backward()`` all-reduces the gradients; over k micro-steps that is
k - 1 reductions too many. DDP has ``model.no_sync()`` for that, FSDP2 has
``set_requires_gradient_sync(False)``, and a plain model (one process, or XLA, where
accel reduces in ``clip_grad_norm_`` / ``optimizer_step`` only) has nothing to skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["gradient_sync_paused"]


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
    return nullcontext()


@contextmanager
def _fsdp2_without_sync(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        # FSDP2 has no getter: the next backward outside the block syncs, as with DDP.
        model.set_requires_gradient_sync(True)
