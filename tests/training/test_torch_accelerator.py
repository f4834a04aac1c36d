"""The fallbacks answer through ``torch.accelerator`` for a device type torch drives
(here a fake ``hpu`` runtime): device count, synchronize, memory figures, seeding; and
only for that type: another type, the CPU and CUDA keep the plain fallbacks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import accel
from accel.training.memory import MEMORY_KEYS
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator


class HpuAccelerator(BareAccelerator):
    """A third-party accelerator on torch's `hpu` device type, with no training hooks."""

    def __init__(self) -> None:
        super().__init__("hpu")

    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        return torch.device("hpu", 0 if index is None else index)


class FakeRuntime:
    """What accel uses of ``torch.accelerator``, reporting ``device_type``; records calls."""

    def __init__(self, device_type: str, *, memory_info: bool = True) -> None:
        self.device_type = device_type
        self.calls: list[tuple[str, Any]] = []
        if memory_info:  # torch 2.10+ only
            self.get_memory_info = lambda device: (600, 1000)

    def current_accelerator(self) -> torch.device:
        return torch.device(self.device_type)

    def device_count(self) -> int:
        return 3

    def synchronize(self, device: torch.device) -> None:
        self.calls.append(("synchronize", device))

    def memory_allocated(self, device: torch.device) -> int:
        return 100

    def max_memory_allocated(self, device: torch.device) -> int:
        return 200


@pytest.fixture
def hpu_seeds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seeds: list[int] = []
    fake_module = SimpleNamespace(manual_seed_all=seeds.append)
    monkeypatch.setattr(torch, "hpu", fake_module, raising=False)
    return seeds


def _fake(monkeypatch: pytest.MonkeyPatch, runtime: object) -> None:
    monkeypatch.setattr(torch, "accelerator", runtime)


#: The fake runtime needs no torch_xla; the xla-marked copy runs it in the XLA tier too,
#: on that tier's torch 2.9.
BOTH_TIERS = pytest.mark.parametrize(
    "tier", ["main", pytest.param("xla", marks=pytest.mark.xla)], ids=["main", "xla-tier"]
)


@BOTH_TIERS
@pytest.mark.parametrize("memory_info", [True, False], ids=["torch-2.13", "torch-2.9"])
def test_a_device_torch_drives_gets_count_sync_memory_and_seed_from_torch_accelerator(
    monkeypatch: pytest.MonkeyPatch, hpu_seeds: list[int], memory_info: bool, tier: str
) -> None:
    runtime = FakeRuntime("hpu", memory_info=memory_info)
    _fake(monkeypatch, runtime)
    acc = isolated_registry(HpuAccelerator()).get_accelerator("hpu:2")
    assert acc.device == torch.device("hpu", 2) and acc.device_count() == 3
    acc.synchronize()
    assert runtime.calls == [("synchronize", torch.device("hpu", 2))]
    assert acc.memory_stats() == {
        "allocated_bytes": 100,
        "peak_allocated_bytes": 200,
        "total_bytes": 1000 if memory_info else None,
    }
    acc.manual_seed(7)
    assert hpu_seeds == [7]
    assert torch.initial_seed() == 7, "the host is seeded as before"


@BOTH_TIERS
def test_another_device_type_keeps_the_plain_fallbacks(
    monkeypatch: pytest.MonkeyPatch, hpu_seeds: list[int], tier: str
) -> None:
    runtime = FakeRuntime("mtia")  # torch drives another device type
    _fake(monkeypatch, runtime)
    acc = isolated_registry(HpuAccelerator()).get_accelerator("hpu")
    assert acc.device_count() == 1
    acc.synchronize()
    acc.manual_seed(3)
    assert runtime.calls == [] and hpu_seeds == []
    assert acc.memory_stats() == dict.fromkeys(MEMORY_KEYS)


def test_a_plugins_own_hooks_still_answer_first(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, FakeRuntime("hpu"))

    class CountsItself(HpuAccelerator):
        @accel.hookimpl
        def device_count(self) -> int:
            return 8

        @accel.hookimpl
        def memory_stats(self) -> dict[str, int | None]:
            return {"allocated_bytes": 1, "peak_allocated_bytes": 2, "total_bytes": 3}

    acc = isolated_registry(CountsItself()).get_accelerator("hpu")
    assert acc.device_count() == 8
    assert acc.memory_stats() == {"allocated_bytes": 1, "peak_allocated_bytes": 2, "total_bytes": 3}


class Untouchable:
    """A ``torch.accelerator`` that must not be asked at all."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"torch.accelerator.{name} was used")


@BOTH_TIERS
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_the_cpu_and_cuda_never_ask_torch_accelerator(
    monkeypatch: pytest.MonkeyPatch, device_type: str, tier: str
) -> None:

    class OnType(BareAccelerator):
        @accel.hookimpl
        def device_count(self) -> int:
            return 1  # counted by name, not device type: not what this test is about

        @accel.hookimpl
        def get_device(self) -> torch.device:
            return torch.device(device_type)

    # Loading a registry may ask torch which device type it drives (devices without a
    # plugin); the handles' operations below must not ask torch.accelerator anything.
    acc = isolated_registry(OnType(device_type + "-like")).get_accelerator(device_type + "-like")
    cpu = isolated_registry().get_accelerator("cpu")
    _fake(monkeypatch, Untouchable())
    acc.synchronize()
    acc.manual_seed(1)
    assert acc.memory_stats() == dict.fromkeys(MEMORY_KEYS)
    cpu.synchronize()
    assert cpu.memory_stats()["total_bytes"] is not None


@pytest.mark.xla  # the XLA tier's torch 2.9 is a CUDA build: torch.accelerator says "cuda"
def test_real_torch_accelerator_is_used_only_where_its_calls_exist() -> None:
    from accel.plugins._fallbacks import torch_accelerator

    runtime = torch.accelerator
    for name in ("current_accelerator", "device_count", "synchronize", "memory_allocated"):
        assert callable(getattr(runtime, name)), name
    reported = runtime.current_accelerator()
    assert torch_accelerator("cuda") is None and torch_accelerator("cpu") is None
    if reported is not None and reported.type not in ("cpu", "cuda"):
        assert torch_accelerator(reported.type) is runtime
    assert not torch.cuda.is_initialized()


class CannotTell(FakeRuntime):
    """A backend torch drives that can neither synchronise nor count its memory, as
    torch-opencl: torch raises for each."""

    def synchronize(self, device: torch.device) -> None:
        self.calls.append(("synchronize", device))
        raise RuntimeError("Backend doesn't support synchronizing events.")

    def memory_allocated(self, device: torch.device) -> int:
        raise NotImplementedError("memory_allocated is not implemented for this backend")

    def get_memory_info(self, device: torch.device) -> tuple[int, int]:
        raise RuntimeError("getMemoryInfo is not implemented")


def test_the_fallbacks_give_what_the_device_can_tell_and_never_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = CannotTell("hpu", memory_info=False)  # its own get_memory_info
    _fake(monkeypatch, runtime)
    acc = isolated_registry(HpuAccelerator()).get_accelerator("hpu")
    acc.synchronize()  # asked, refused, and the call returns
    assert runtime.calls == [("synchronize", acc.device)]
    assert acc.memory_stats() == {
        "allocated_bytes": None,
        "peak_allocated_bytes": 200,  # this one it can tell
        "total_bytes": None,
    }


def test_a_plugins_synchronize_answers_and_the_fallback_does_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = CannotTell("hpu", memory_info=False)  # its own get_memory_info
    _fake(monkeypatch, runtime)
    waited: list[torch.device] = []

    class WaitsItself(HpuAccelerator):
        @accel.hookimpl
        def synchronize(self, device: torch.device) -> bool:
            waited.append(device)
            return True

    acc = isolated_registry(WaitsItself()).get_accelerator("hpu")
    acc.synchronize()
    assert waited == [acc.device] and runtime.calls == []
