"""The built-in fallback hook implementations, asked after every plugin.

Registered in every registry (even one without the built-in accelerators), so a
third-party accelerator plugin only implements what it does differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accel.batch import move_batch
from accel.markers import hookimpl
from accel.types import Availability

if TYPE_CHECKING:
    import torch


@hookimpl(trylast=True)
def is_available(accelerator: str) -> Availability:
    return Availability(
        False,
        reason=f"no plugin answered is_available for {accelerator!r}",
        remedy="the accelerator's plugin must implement the is_available hook",
    )


@hookimpl(trylast=True)
def device_count() -> int:
    return 1


@hookimpl(trylast=True)
def get_device(accelerator: str, index: int | None) -> torch.device:
    import torch

    from accel.errors import PluginError

    # Out-of-tree backends register their device type under their own name.
    try:
        return torch.device(accelerator, 0 if index is None else index)
    except RuntimeError:
        raise PluginError(
            f"torch has no device type {accelerator!r}, so the plugin providing the "
            f"accelerator {accelerator!r} must implement the get_device hook"
        ) from None


@hookimpl(trylast=True)
def distributed_backend() -> str:
    return "gloo"


@hookimpl(trylast=True)
def model_to_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    return model.to(device)


@hookimpl(trylast=True)
def batch_to_device(batch: Any, device: torch.device) -> Any:
    return move_batch(batch, device)
