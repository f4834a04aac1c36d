"""The CUDA, MPS and TPU plugins' training hooks, exercised on a CPU-only machine by
faking the runtime calls they make (CUDA is never initialised here)."""

from __future__ import annotations

import sys
import types
from contextlib import nullcontext
from typing import Any

import pytest
import torch

import accel
from accel.plugins import CudaPlugin, MpsPlugin
from accel.training.device_loader import PrefetchingLoader
from accel.training.memory import MEMORY_KEYS
from helpers.fakes import Available, MetaTpuPlugin
from helpers.registries import isolated_registry


class AvailableCuda(Available, CudaPlugin):
    count = 2


class AvailableMps(Available, MpsPlugin):
    pass


def _accelerator(plugin: object, name: str) -> accel.Accelerator:
    registry = isolated_registry(plugin, builtins=False)
    return registry.get_accelerator(name)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> accel.Accelerator:
    acc = _accelerator(AvailableCuda(), "cuda:1")
    assert not torch.cuda.is_initialized()
    return acc


def test_cuda_memory_stats_come_from_torch_cuda(
    cuda: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: asked.append(d) or 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 250)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=8000)
    )
    stats = cuda.memory_stats()
    assert stats == {"allocated_bytes": 100, "peak_allocated_bytes": 250, "total_bytes": 8000}
    assert asked == [torch.device("cuda", 1)]


def test_cuda_synchronize_and_seed_use_torch_cuda(
    cuda: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(("sync", d)))
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: calls.append(("seed", s)))
    cuda.synchronize()
    assert calls == [("sync", torch.device("cuda", 1))]
    cuda.manual_seed(5)
    assert calls[1:] == [("seed", 5)]  # every GPU, by the fallback's torch.manual_seed
    cuda.mark_step()  # eager: nothing to cut
    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize(
    ("bf16", "asked", "expected"),
    [
        (True, None, torch.bfloat16),
        (False, None, torch.float16),
        (True, torch.float16, torch.float16),
    ],
)
def test_cuda_autocast_prefers_bfloat16_where_the_gpu_has_it(
    cuda: accel.Accelerator,
    monkeypatch: pytest.MonkeyPatch,
    bf16: bool,
    asked: torch.dtype | None,
    expected: torch.dtype,
) -> None:
    made: list[tuple[str, torch.dtype]] = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(
        "accel.training.precision.torch_autocast",
        lambda accelerator, device, dtype: made.append((device.type, dtype)) or nullcontext(),
    )
    with cuda.autocast(asked):
        pass
    assert made == [("cuda", expected)]


def test_cuda_autocast_to_bfloat16_without_it_says_why(
    cuda: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(ValueError, match=r"supports: torch.float16 \(this GPU has no bfloat16"):
        cuda.autocast(torch.bfloat16)


def test_prefetching_loader_moves_the_next_batch_before_handing_out_the_current() -> None:
    events: list[str] = []

    def pin(batch: int) -> int:
        events.append(f"pin {batch}")
        return batch

    def move(batch: int) -> int:
        events.append(f"move {batch}")
        return batch

    for batch in PrefetchingLoader([0, 1, 2], move, pin):
        events.append(f"use {batch}")
    assert events == [
        "pin 0", "move 0", "pin 1", "move 1", "use 0", "pin 2", "move 2", "use 1", "use 2",
    ]  # fmt: skip
    assert list(PrefetchingLoader([], move, pin)) == []


def test_mps_hooks_use_torch_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = _accelerator(AvailableMps(), "mps")
    calls: list[Any] = []
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 64)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 4096)
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.mps, "manual_seed", lambda s: calls.append(("seed", s)))
    assert acc.memory_stats() == {
        "allocated_bytes": 64,
        "peak_allocated_bytes": None,  # torch.mps has no peak counter: not made up
        "total_bytes": 4096,
    }
    acc.synchronize()
    acc.manual_seed(3)
    assert calls == ["sync", ("seed", 3)]
    with pytest.raises(ValueError, match=r"cannot autocast to torch.float64"):
        acc.autocast(torch.float64)


def _fake_torch_xla(monkeypatch: pytest.MonkeyPatch, memory_info: Any) -> None:
    """Just enough of torch_xla for the TPU plugin's memory_stats hook."""
    xla = types.ModuleType("torch_xla")
    core = types.ModuleType("torch_xla.core")
    xla_model = types.ModuleType("torch_xla.core.xla_model")
    xla_model.get_memory_info = memory_info  # type: ignore[attr-defined]
    xla.core = core  # type: ignore[attr-defined]
    core.xla_model = xla_model  # type: ignore[attr-defined]
    for name, module in [("torch_xla", xla), ("torch_xla.core", core),
                         ("torch_xla.core.xla_model", xla_model)]:  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)


def test_tpu_memory_stats_come_from_torch_xlas_memory_info(
    meta_tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = {"bytes_used": 10, "bytes_limit": 1000, "peak_bytes_used": 20}
    _fake_torch_xla(monkeypatch, lambda device: info)
    assert meta_tpu.memory_stats() == {
        "allocated_bytes": 10,
        "peak_allocated_bytes": 20,
        "total_bytes": 1000,
    }


def test_tpu_memory_stats_are_unknown_where_the_runtime_keeps_none(
    meta_tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unimplemented(device: Any) -> None:
        raise RuntimeError("Bad StatusOr access: UNIMPLEMENTED: GetAllocatorStats")

    _fake_torch_xla(monkeypatch, unimplemented)
    assert meta_tpu.memory_stats() == dict.fromkeys(MEMORY_KEYS)

    def broken(device: Any) -> None:
        raise RuntimeError("device lost")

    _fake_torch_xla(monkeypatch, broken)
    with pytest.raises(RuntimeError, match=r"device lost") as info:
        meta_tpu.memory_stats()
    assert "raised in hook 'memory_stats'" in "\n".join(info.value.__notes__)


def test_every_builtin_implements_the_hooks_its_device_needs() -> None:
    from accel.plugins import CpuPlugin, TpuPlugin

    def implemented(plugin: object) -> set[str]:
        return {name for name in dir(plugin) if hasattr(getattr(plugin, name), "accel_impl")}

    training = {"autocast", "memory_stats", "device_loader"}
    assert training <= implemented(CpuPlugin())
    assert training | {"synchronize"} <= implemented(CudaPlugin())
    assert {"autocast", "memory_stats", "synchronize"} <= implemented(MpsPlugin())
    assert {
        "optimizer_step", "mark_step", "synchronize", "manual_seed", "autocast",
        "memory_stats", "device_loader", "state_dict", "save",
    } <= implemented(TpuPlugin())  # fmt: skip
    assert isinstance(MetaTpuPlugin(), TpuPlugin)
