"""The kit catches a plugin with a planted bug, for each kind of promise.

Each plugin below is an accelerator on the CPU (or on ``meta``, where a tensor left on
the CPU shows) with one realistic mistake; the kit's promise for it must fail, naming
what went wrong, while the same promise holds for the built-in CPU.
"""

from __future__ import annotations

import types
from collections.abc import Generator
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel.testing.conformance import Outcome, run
from helpers.fakes import FakeAccelerator
from helpers.registries import isolated_registry


class UntiesOnTheWay(FakeAccelerator):
    """Moves parameter by parameter, giving each slot a copy of its own."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        for module in model.modules():
            for name, parameter in list(module.named_parameters(recurse=False)):
                setattr(module, name, nn.Parameter(parameter.detach().clone().to(device)))
        return model


class UntiesOnTheWayBack(FakeAccelerator):
    """Registers, next to its accelerator, a cross-cutting post-move hook that re-creates
    the head's weight when a model lands on the CPU (the bug every PrivateUse1
    backend's moves back had)."""

    def plugins(self) -> list[object]:
        return [self, _UntiesOnCpu()]


class _UntiesOnCpu:
    """Declares no accelerator, so its hooks see every move (the CPU's too)."""

    @accel.hookimpl
    def post_move_hook(self, accelerator: str, model: nn.Module) -> None:
        head = getattr(model, "head", None)
        if accelerator == "cpu" and head is not None:
            head.weight = nn.Parameter(head.weight.detach().clone())


class TiesByValue(FakeAccelerator):
    """ "Saves memory" by sharing parameters whose values are equal."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        model.to(device)
        seen: list[nn.Parameter] = []
        for module in model.modules():
            for name, parameter in list(module.named_parameters(recurse=False)):
                twin = next(
                    (p for p in seen if p.shape == parameter.shape and torch.equal(p, parameter)),
                    None,
                )
                if twin is not None and twin is not parameter:
                    setattr(module, name, twin)
                else:
                    seen.append(parameter)
        return model


class BestEffortMove(FakeAccelerator):
    """Moves each submodule on its own and skips the ones that fail: the failure never
    reaches accel, so nothing is rolled back."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        for child in model.children():
            try:
                child.to(device)
            except RuntimeError:
                continue
        return model


class TopLevelBatches(FakeAccelerator):
    """Moves a batch's top-level tensors only (on ``meta``, so the rest shows)."""

    @accel.hookimpl
    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        if isinstance(batch, dict):
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return None


class HidesBatchFailures(FakeAccelerator):
    """Hands a batch it could not move back as it was, so the step runs on the host."""

    @accel.hookimpl
    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        try:
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        except RuntimeError:
            return batch


class DrawsAfterSeeding(FakeAccelerator):
    """Warms the generator up after seeding, a little longer each time."""

    seeded = 0

    @accel.hookimpl(wrapper=True)
    def manual_seed(self) -> Generator[None, None, None]:
        result = yield
        self.seeded += 1
        torch.rand(self.seeded)
        return result


class OpaqueRngState(FakeAccelerator):
    """Keeps its generator state in an object of its own, which weights_only refuses."""

    @accel.hookimpl
    def rng_state(self) -> Any:
        return types.SimpleNamespace(state=torch.get_rng_state())

    @accel.hookimpl
    def set_rng_state(self, state: Any) -> bool:
        torch.set_rng_state(state.state)
        return True


class CopiesEachTensor(FakeAccelerator):
    """A state_dict hook that copies every tensor to the CPU on its own."""

    @accel.hookimpl
    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


class ZeroingRestore(FakeAccelerator):
    """A restore_to_device hook that allocates the device tensors but copies nothing."""

    @accel.hookimpl
    def restore_to_device(
        self, tensors: list[torch.Tensor], device: torch.device
    ) -> list[torch.Tensor]:
        return [torch.zeros_like(tensor, device=device) for tensor in tensors]


class StepsNothing(FakeAccelerator):
    """An optimizer_step hook that forgets to step."""

    @accel.hookimpl
    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> str:
        return "stepped"


class MeasuresButDoesNotClip(FakeAccelerator):
    @accel.hookimpl
    def clip_grad_norm_(self, parameters: list[torch.Tensor], norm_type: float) -> torch.Tensor:
        grads = [p.grad for p in parameters if p.grad is not None]
        return torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads]), norm_type
        )


class FullPrecisionAutocast(FakeAccelerator):
    @accel.hookimpl
    def autocast(self) -> Any:
        return nullcontext()


class PeakBelowUse(FakeAccelerator):
    """Reports the peak since the last step as the peak since the start."""

    @accel.hookimpl
    def memory_stats(self) -> accel.MemoryStats:
        return accel.MemoryStats(allocated_bytes=100, peak_allocated_bytes=10, total_bytes=None)


class DropsTheLastBatch(FakeAccelerator):
    @accel.hookimpl
    def device_loader(self, loader: Any, move: Any) -> Any:
        return (move(batch) for batch in list(loader)[:-1])


class CountsNoDevice(FakeAccelerator):
    def __init__(self) -> None:
        super().__init__("buggy", count=0)


class NoBackend(FakeAccelerator):
    @accel.hookimpl
    def distributed_backend(self) -> str:
        return ""


CASES = [
    (UntiesOnTheWay(), "moves.ties_kept_to_device", "no longer one Parameter"),
    (UntiesOnTheWayBack(), "moves.ties_kept_back_to_cpu", "back to the CPU: head.weight"),
    (TiesByValue(), "moves.no_tie_created", "a tie was created"),
    (BestEffortMove(), "moves.rollback", "did not raise"),
    (TopLevelBatches(device="meta"), "batches.every_tensor_moved", "['nested'][0]: left on cpu"),
    (HidesBatchFailures(), "batches.failure_named", "a tensor that cannot move was moved"),
    (DrawsAfterSeeding(), "generators.manual_seed_host", "the same seed gave other draws"),
    (OpaqueRngState(), "generators.rng_state_weights_only", "does not load with weights_only"),
    (CopiesEachTensor(), "checkpoints.state_dict", "stores the tie twice"),
    (ZeroingRestore(), "checkpoints.save_and_load", "changed value"),
    (StepsNothing(), "step.optimizer_step", "after one step"),
    (MeasuresButDoesNotClip(), "step.clip_grad_norm_", "after clipping to norm 1"),
    (FullPrecisionAutocast(), "step.autocast", "autocast computed in torch.float32"),
    (PeakBelowUse(), "runtime.memory_stats", "peak 10 is below the 100 bytes in use"),
    (DropsTheLastBatch(), "batches.device_loader", "epoch 0: 3 batches of 4"),
    (CountsNoDevice(), "devices.count_and_index", "device_count() is 0"),
    (NoBackend(), "devices.distributed_backend", "distributed_backend is ''"),
]


def _outcome(plugin: FakeAccelerator, promise: str) -> Outcome:
    plugins = plugin.plugins() if isinstance(plugin, UntiesOnTheWayBack) else [plugin]
    registry = isolated_registry(*plugins)
    (outcome,) = run("buggy", registry=registry, promises=[promise])
    return outcome


@pytest.mark.parametrize(
    ("plugin", "promise", "says"), CASES, ids=[type(case[0]).__name__ for case in CASES]
)
def test_the_kit_catches_a_planted_bug(plugin: FakeAccelerator, promise: str, says: str) -> None:
    plugin.spec = accel.AcceleratorSpec("buggy")
    outcome = _outcome(plugin, promise)
    assert outcome.outcome == "failed", outcome
    assert says in outcome.reason


@pytest.mark.parametrize("promise", sorted({case[1] for case in CASES}))
def test_each_promise_a_bug_breaks_holds_on_the_cpu(promise: str) -> None:
    (outcome,) = run("cpu", registry=isolated_registry(), promises=[promise])
    assert outcome == Outcome(promise, "passed")
