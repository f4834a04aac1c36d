"""Each worker's device and the group's backend, on CUDA, ROCm and MPS layouts
simulated on the CPU: the counts torch reports are faked per case, with
CUDA_VISIBLE_DEVICES and torch.version.hip set as a real job would have them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import accel
import accel.distributed as adist
from accel.plugins import gpu
from helpers.distributed import SingleGpu, no_launcher_and_no_group  # noqa: F401
from helpers.fakes import FakeAccelerator
from helpers.registries import isolated_registry


@pytest.fixture
def two_device_registry() -> accel.AcceleratorRegistry:
    return isolated_registry(FakeAccelerator("twin", count=2))


def worker(local_rank: int, world_size: int = 4) -> adist.LaunchEnvironment:
    return adist.LaunchEnvironment(
        rank=local_rank,
        world_size=world_size,
        local_rank=local_rank,
        master_addr="127.0.0.1",
        master_port=29500,
    )


def test_each_local_rank_gets_its_own_device(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    chosen = [
        adist.local_accelerator("twin", worker(rank), registry=two_device_registry).index
        for rank in (0, 1)
    ]
    assert chosen == [0, 1]


def test_single_process_keeps_an_explicit_index(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    assert adist.local_accelerator("twin:1", None, registry=two_device_registry).index == 1
    assert adist.local_accelerator("twin", None, registry=two_device_registry).index is None


def test_an_explicit_index_that_is_not_the_local_rank_is_an_error(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    with pytest.raises(
        adist.DistributedSetupError, match=r"twin:1.*LOCAL_RANK=0.*without an index"
    ):
        adist.local_accelerator("twin:1", worker(0), registry=two_device_registry)


def test_more_workers_than_devices_is_an_error(
    two_device_registry: accel.AcceleratorRegistry,
) -> None:
    with pytest.raises(accel.AcceleratorUnavailableError, match="device index 2") as caught:
        adist.local_accelerator("twin", worker(2), registry=two_device_registry)
    assert any("--nproc-per-node" in note for note in getattr(caught.value, "__notes__", []))


def test_cpu_workers_share_the_one_cpu(registry: accel.AcceleratorRegistry) -> None:
    acc = adist.local_accelerator("cpu", worker(1), registry=registry)
    assert (acc.name, acc.index, acc.device) == ("cpu", None, torch.device("cpu"))


def test_nccl_workers_never_share_a_device() -> None:
    registry = isolated_registry(SingleGpu("onegpu", count=1))
    assert adist.local_accelerator("onegpu", worker(0), registry=registry).index == 0
    with pytest.raises(accel.AcceleratorUnavailableError, match="device index 1"):
        adist.local_accelerator("onegpu", worker(1), registry=registry)


def test_accelerator_argument_is_type_checked() -> None:
    with pytest.raises(TypeError, match=r"or an accel\.Accelerator handle, got int"):
        adist.local_accelerator(3, None)  # type: ignore[arg-type]


# -- CUDA and ROCm, simulated ---------------------------------------------------------


@pytest.fixture
def fake_cuda_build(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A CUDA build of torch whose own CUDA queries must not run in this process.

    ``torch.cuda.device_count()`` falls back to initialising CUDA when NVML cannot
    count; here it fails the test if accel ever calls it in this process."""

    def initialising_count() -> int:
        raise AssertionError("torch.cuda.device_count() ran in the parent process")

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", initialising_count)
    monkeypatch.setattr(gpu, "_child_counts", {})
    return monkeypatch


@pytest.fixture
def cuda_registry() -> accel.AcceleratorRegistry:
    return isolated_registry()


def test_one_visible_gpu_per_worker_uses_device_0(
    fake_cuda_build: pytest.MonkeyPatch, cuda_registry: accel.AcceleratorRegistry
) -> None:
    # SLURM --gpus-per-task=1 or one GPU per pod: the worker sees GPU 3 as cuda:0.
    fake_cuda_build.setenv("CUDA_VISIBLE_DEVICES", "3")
    fake_cuda_build.setattr(torch.cuda, "_device_count_nvml", lambda: 1)
    acc = adist.local_accelerator("cuda", worker(3), registry=cuda_registry)
    assert (acc.index, acc.device) == (0, torch.device("cuda", 0))
    assert not torch.cuda.is_initialized()


def test_one_gpu_shared_by_the_machine_still_refuses_a_second_worker(
    fake_cuda_build: pytest.MonkeyPatch, cuda_registry: accel.AcceleratorRegistry
) -> None:
    fake_cuda_build.setattr(torch.cuda, "_device_count_nvml", lambda: 1)  # no partition
    with pytest.raises(accel.AcceleratorUnavailableError, match="device index 1"):
        adist.local_accelerator("cuda", worker(1), registry=cuda_registry)


def test_workers_on_a_shared_machine_take_their_local_rank(
    fake_cuda_build: pytest.MonkeyPatch, cuda_registry: accel.AcceleratorRegistry
) -> None:
    fake_cuda_build.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    fake_cuda_build.setattr(torch.cuda, "_device_count_nvml", lambda: 2)
    chosen = [
        adist.local_accelerator("cuda", worker(rank), registry=cuda_registry).device
        for rank in (0, 1)
    ]
    assert chosen == [torch.device("cuda", 0), torch.device("cuda", 1)]


def torch_in_children_counts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Child interpreters see a torch whose device_count() returns how many devices
    the inherited visibility variable names, as the CUDA runtime would."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\n"
        "import torch.cuda\n"
        "def _count():\n"
        "    names = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        "    names = names or os.environ.get('HIP_VISIBLE_DEVICES') or ''\n"
        "    return len([n for n in names.split(',') if n])\n"
        "torch.cuda.device_count = _count\n"
    )
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.setattr(gpu, "_gpu_driver_present", lambda rocm: True)


def test_mig_devices_are_counted_as_torch_does_without_initialising_cuda(
    fake_cuda_build: pytest.MonkeyPatch, tmp_path: Path, registry: accel.AcceleratorRegistry
) -> None:
    # torch's own NVML count gives up (-1) on MIG UUIDs, then asks the CUDA runtime.
    fake_cuda_build.setenv("CUDA_VISIBLE_DEVICES", "MIG-4b1a0d6e-aaaa,MIG-4b1a0d6e-bbbb")
    assert torch.cuda._device_count_nvml() == -1  # the real function, no NVML needed
    torch_in_children_counts(fake_cuda_build, tmp_path)
    assert gpu.cuda_device_count_without_init() == 2
    info = {i.name: i for i in registry.list_accelerators()}["cuda"]
    assert info.available and registry.get_accelerator("cuda").device_count() == 2
    assert not torch.cuda.is_initialized()


def test_rocm_without_amdsmi_is_counted_as_torch_does(
    fake_cuda_build: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_cuda_build.setattr(torch.version, "hip", "6.2.41133")
    fake_cuda_build.setattr(torch.cuda, "_device_count_amdsmi", lambda: -1)  # no amdsmi module
    fake_cuda_build.setenv("HIP_VISIBLE_DEVICES", "0,1,2")
    torch_in_children_counts(fake_cuda_build, tmp_path)
    assert gpu.cuda_device_count_without_init() == 3
    assert gpu.CudaPlugin().is_available().available


def test_no_driver_for_the_fallback_is_reported_as_such(
    fake_cuda_build: pytest.MonkeyPatch,
) -> None:
    fake_cuda_build.setattr(torch.cuda, "_device_count_nvml", lambda: -1)
    fake_cuda_build.setattr(gpu, "_gpu_driver_present", lambda rocm: False)
    assert gpu.cuda_device_count_without_init() is None
    availability = gpu.CudaPlugin().is_available()
    assert not availability.available and "no GPU driver found" in availability.reason


def test_a_child_that_cannot_count_means_unknown(
    fake_cuda_build: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_cuda_build.setattr(torch.cuda, "_device_count_nvml", lambda: -1)
    fake_cuda_build.setattr(gpu, "_gpu_driver_present", lambda rocm: True)
    (tmp_path / "sitecustomize.py").write_text("raise SystemExit(3)\n")
    fake_cuda_build.setenv("PYTHONPATH", str(tmp_path))
    assert gpu.cuda_device_count_without_init() is None


def test_cuda_group_carries_cpu_tensors_over_gloo(
    fake_cuda_build: pytest.MonkeyPatch, cuda_registry: accel.AcceleratorRegistry
) -> None:
    # NCCL alone has no CPU tensors: the group is started as torch does with no
    # backend named, "cpu:gloo,cuda:nccl". Recorded, then run as gloo on this CPU.
    fake_cuda_build.setattr(torch.cuda, "_device_count_nvml", lambda: 1)
    fake_cuda_build.setattr(torch.cuda, "set_device", lambda device: None)
    calls: list[tuple[str, Any]] = []
    real_init = dist.init_process_group

    def recording_init(backend: str, **options: Any) -> None:
        calls.append((backend, options.get("device_id")))
        real_init("gloo", store=dist.HashStore(), rank=0, world_size=1)

    fake_cuda_build.setattr(dist, "init_process_group", recording_init)
    context = adist.init_process_group("cuda", registry=cuda_registry)
    assert calls == [("cpu:gloo,cuda:nccl", torch.device("cuda", 0))]
    assert (context.backend, context.device) == ("nccl", torch.device("cuda", 0))


# -- MPS, simulated ------------------------------------------------------------------


@pytest.fixture
def mps(monkeypatch: pytest.MonkeyPatch) -> accel.Accelerator:
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    return isolated_registry().get_accelerator("mps")


def test_mps_claims_gloo_for_cpu_tensors_only(mps: accel.Accelerator) -> None:
    assert mps.distributed_backend == "cpu:gloo"
    context = adist.init_process_group(mps)
    assert context.device == torch.device("mps", 0)
    total = torch.ones(1)
    dist.all_reduce(total)  # CPU collectives work in the group
    assert total.item() == 1.0
    with pytest.raises(adist.DistributedSetupError, match=r"no backend for mps tensors"):
        adist.wrap_data_parallel(torch.nn.Linear(2, 2), context)


def test_mps_workers_share_the_one_device(mps: accel.Accelerator) -> None:
    assert adist.local_accelerator(mps, worker(1)).device == torch.device("mps", 0)


def test_a_backend_without_the_devices_tensors_is_refused_before_wrapping() -> None:
    registry = isolated_registry(FakeAccelerator("metaonly", device="meta"))  # gloo, on meta
    context = adist.init_process_group("metaonly", registry=registry)
    with pytest.raises(adist.DistributedSetupError, match=r"\('gloo'\) has no backend for meta"):
        adist.wrap_data_parallel(torch.nn.Linear(2, 2).to("meta"), context)
