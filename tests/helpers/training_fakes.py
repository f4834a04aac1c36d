"""Plugins for the training-step tests: one that implements every training hook and
records the calls, and one that implements none (so accel's fallbacks answer)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

import accel
from accel.types import MemoryStats


class BareAccelerator:
    """A third-party accelerator implementing only what it must: the fallbacks do the rest."""

    def __init__(self, name: str = "bare") -> None:
        self.name = name

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec(self.name)]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True, auto=False)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")


class RecordingAccelerator(BareAccelerator):
    """Implements every training hook, recording (hook, arguments) in ``calls``."""

    def __init__(self, name: str = "rec") -> None:
        super().__init__(name)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @accel.hookimpl(wrapper=True)
    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Any, device: torch.device
    ) -> Generator[None, Any, Any]:
        self.calls.append(("optimizer_step", {"optimizer": optimizer, "closure": closure}))
        result = yield
        self.calls.append(("optimizer_step:after", {"result": result}))
        return result

    @accel.hookimpl
    def mark_step(self, device: torch.device) -> None:
        self.calls.append(("mark_step", {"device": device}))

    @accel.hookimpl
    def synchronize(self, device: torch.device) -> None:
        self.calls.append(("synchronize", {"device": device}))

    @accel.hookimpl
    def manual_seed(self, seed: int) -> None:
        self.calls.append(("manual_seed", {"seed": seed}))

    @accel.hookimpl
    def autocast(self, dtype: torch.dtype | None) -> AbstractContextManager[Any]:
        self.calls.append(("autocast", {"dtype": dtype}))
        return nullcontext()

    @accel.hookimpl
    def memory_stats(self) -> MemoryStats:
        self.calls.append(("memory_stats", {}))
        return MemoryStats(allocated_bytes=1, peak_allocated_bytes=2, total_bytes=None)

    @accel.hookimpl
    def device_loader(self, loader: Iterable[Any], move: Callable[[Any], Any]) -> Iterable[Any]:
        self.calls.append(("device_loader", {"loader": loader}))
        return [("seen", move(batch)) for batch in loader]

    @accel.hookimpl
    def state_dict(self, model: torch.nn.Module) -> None:
        self.calls.append(("state_dict", {"model": model}))
        return None  # the fallback copies

    @accel.hookimpl
    def save(self, obj: Any, path: Any) -> bool:
        self.calls.append(("save", {"obj": obj, "path": path}))
        return True  # "handled": nothing written

    def hooks_called(self) -> list[str]:
        return [name for name, _ in self.calls]


def linear_model_and_optimizer(lr: float = 0.1) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model, optimizer


def backward_once(model: torch.nn.Module) -> torch.Tensor:
    loss = model(torch.ones(4, 3)).pow(2).sum()
    loss.backward()
    return loss
