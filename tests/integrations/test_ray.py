"""Ray Train's TorchTrainer trains a tied model through accel.integrations.ray.

One local Ray cluster for the module (2 CPUs, no dashboard). Two CPU workers over
gloo, on ``cpu`` and on a vendor's plugin installed as an entry point with no Ray code
(tests/helpers/integration_plugins.py): the ranks end equal, equal to one process on
both ranks' batches, with the tie held. A worker SIGKILLed after a reported checkpoint
is restarted by Ray, and the run resumes from that checkpoint to the same parameters
as a run never interrupted. Bad input stops the trainer with accel's error, and the
cluster's CPUs come back. Runs in `bash scripts/test ray` (marker `ray`).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import ray
import ray.train
import ray.train.torch
import torch

import accel
from accel.distributed import DistributedSetupError
from accel.integrations.ray import torch_config
from helpers.integration_plugins import InstalledVendorPlugin, OwnBackendVendorPlugin
from helpers.processes import clean_environment
from helpers.ray_training import (
    CLUSTER_CPUS,
    EXAMPLES,
    REPO,
    fit,
    local_cluster,
    prepare_only,
    read_reports,
    train_tied,
    vendor_distribution,
)

pytestmark = pytest.mark.ray

WORKERS = 2


@pytest.fixture(scope="module")
def vendor_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = vendor_distribution(tmp_path_factory.mktemp("vendor"))
    sys.path.insert(0, str(root))  # the driver's registry finds the plugins too
    try:
        yield root
    finally:
        sys.path.remove(str(root))


@pytest.fixture(scope="module")
def cluster(vendor_path: Path) -> Iterator[None]:
    with local_cluster((vendor_path,)):
        yield


@pytest.fixture(scope="module")
def driver_registry(vendor_path: Path) -> accel.AcceleratorRegistry:
    """The driver's view: the built-ins and the installed vendor plugins."""
    return accel.AcceleratorRegistry()


def _train(
    root: Path, accelerator: str, registry: accel.AcceleratorRegistry, **config: Any
) -> tuple[list[dict[str, Any]], ray.train.Result]:
    reports = root / "reports"
    result = fit(
        train_tied,
        {"accelerator": accelerator, "report_dir": str(reports), **config},
        root / "storage",
        torch_config=torch_config(accelerator, registry=registry, timeout_s=120),
        max_failures=1,
    )
    return read_reports(reports, WORKERS), result


@pytest.fixture(scope="module")
def cpu_run(
    cluster: None,
    driver_registry: accel.AcceleratorRegistry,
    tmp_path_factory: pytest.TempPathFactory,
) -> list[dict[str, Any]]:
    """An uninterrupted run on ``cpu``: the cpu test's, and the recovery test's reference."""
    reports, _ = _train(tmp_path_factory.mktemp("cpu"), "cpu", driver_registry)
    return reports


def _assert_trained_together(reports: list[dict[str, Any]], accelerator: str) -> None:
    first = reports[0]
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        assert report["local_rank"] == rank  # one node
        assert report["world_size"] == WORKERS
        assert report["backend"] == "gloo"
        assert report["accelerator"] == accelerator
        assert report["wrapper"] == "DistributedDataParallel"
        assert report["tied"] is True, f"rank {rank}: the tie came apart"
        assert report["unique_parameters"] == 3  # embed/head weight, body weight and bias
        assert report["head_optimized"] is True
        assert report["resumed_from"] == 0
        # Every rank started from a different seed: equal parameters need DDP.
        assert report["parameters"] == first["parameters"], f"rank {rank} differs from rank 0"
        assert report["reference_max_difference"] < 1e-5


def test_two_cpu_workers_train_in_step_with_ties_kept(cpu_run: list[dict[str, Any]]) -> None:
    _assert_trained_together(cpu_run, "cpu")
    assert [report["device"] for report in cpu_run] == ["cpu", "cpu"]  # one device, shared
    # The vendor's plugin is installed in every worker, but none of its hooks ran.
    assert [report["vendor_calls"] for report in cpu_run] == [[], []]


def test_a_vendor_plugin_with_no_ray_code_trains_under_ray(
    cluster: None, driver_registry: accel.AcceleratorRegistry, tmp_path: Path
) -> None:
    name = InstalledVendorPlugin.NAME
    reports, _ = _train(tmp_path, name, driver_registry)
    _assert_trained_together(reports, name)
    # The plugin's two devices, one per worker by Ray's local rank; its hooks ran there.
    assert [report["device"] for report in reports] == ["cpu", "cpu"]
    for report in reports:
        assert {"pre_move_hook", "post_move_hook", "mark_step"} <= set(report["vendor_calls"])


def test_a_killed_worker_is_restarted_and_the_run_resumes_exactly(
    cluster: None,
    driver_registry: accel.AcceleratorRegistry,
    cpu_run: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    reports, result = _train(tmp_path, "cpu", driver_registry, kill_after=1)
    assert (tmp_path / "reports" / "killed").read_text() == "1", "no worker was killed"
    pids = (tmp_path / "reports" / "pids1.txt").read_text().split()
    assert len(pids) == 2 and pids[0] != pids[1], f"rank 1 was not restarted: {pids}"
    for report in reports:
        assert report["resumed_from"] == 2, "did not resume after the checkpoint of step 1"
        assert report["tied"] is True
        # Exactly the uninterrupted run's parameters.
        assert report["parameters"] == cpu_run[0]["parameters"]
    assert result.checkpoint is not None  # Ray kept the last one reported


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    """examples/ray_train.py, whose loop docs/integrations.md shows."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("ray_train")
    finally:
        sys.path.remove(str(EXAMPLES))


def test_the_documented_example_trains_and_checkpoints_the_tie_once(
    cluster: None, example: ModuleType, tmp_path: Path
) -> None:
    result = example.train("cpu", workers=WORKERS, storage=str(tmp_path), epochs=2)
    assert result.metrics["epoch"] == 1  # the last of the 2 epochs, with its checkpoint
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        state = torch.load(Path(directory) / "state.pt", weights_only=True)
    assert state["epoch"] == 1
    assert state["model"]["head.weight"] is state["model"]["embed.weight"]  # stored once


def test_torch_config_carries_the_accelerators_backend(
    driver_registry: accel.AcceleratorRegistry,
) -> None:
    config = torch_config("cpu", registry=driver_registry, timeout_s=99)
    assert isinstance(config, ray.train.torch.TorchConfig)
    assert (config.backend, config.timeout_s) == ("gloo", 99)
    handle = driver_registry.get_accelerator(InstalledVendorPlugin.NAME)
    assert torch_config(handle).backend == handle.distributed_backend == "gloo"


def test_torch_config_refuses_what_ray_cannot_start(
    driver_registry: accel.AcceleratorRegistry,
) -> None:
    with pytest.raises(accel.AcceleratorNotFoundError, match="unknown accelerator 'quantum'"):
        torch_config("quantum", registry=driver_registry)
    with pytest.raises(DistributedSetupError, match="which Ray Train cannot start") as info:
        torch_config(OwnBackendVendorPlugin.NAME, registry=driver_registry)
    assert "worker_process_setup_hook" in str(info.value)


@pytest.mark.parametrize(
    ("accelerator", "error", "fragment"),
    [
        ("quantum", accel.AcceleratorNotFoundError, "unknown accelerator 'quantum'"),
        # Ray's default group is gloo; this plugin's backend is its own.
        (OwnBackendVendorPlugin.NAME, DistributedSetupError, "torch_config('vendorccl')"),
    ],
)
def test_bad_input_stops_the_trainer_and_frees_the_cluster(
    cluster: None, tmp_path: Path, accelerator: str, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(ray.train.TrainingFailedError) as info:
        fit(prepare_only, {"accelerator": accelerator}, tmp_path)  # bounded by a timeout
    # Ray hands back the error of the worker(s) it saw fail first: accel's own, whole.
    failures = getattr(info.value, "worker_failures", {})
    assert failures and set(failures) <= {0, 1}, info.value
    for failure in failures.values():
        assert isinstance(failure, error), repr(failure)
        assert fragment in str(failure)
    # The workers are gone: every CPU of the cluster is free again.
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < CLUSTER_CPUS:
        assert time.monotonic() < deadline, f"CPUs still held: {ray.available_resources()}"
        time.sleep(0.5)


def test_accel_imports_no_ray() -> None:
    code = (
        "import sys, torch, accel, accel.integrations, accel.distributed\n"
        "accel.get_accelerator('cpu').model_to_device(torch.nn.Linear(2, 2))\n"
        "before = sorted(m for m in sys.modules if m.split('.')[0] == 'ray')\n"
        "import accel.integrations.ray\n"
        "print(before, 'ray.train.torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean_environment(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["[]", "True"], done.stdout + done.stderr
