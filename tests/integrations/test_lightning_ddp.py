"""Lightning's Trainer and Fabric train a tied model over 2 processes through accel.

Each case runs tests/integrations/scripts/lightning_ddp.py in a subprocess; Lightning
starts the second process itself (its subprocess launcher re-runs the script, or
``spawn``). Both ranks must end with the tie held, the same parameters, the values of
the plain torch loop over both ranks' batches, and a checkpoint written and read back
through AccelCheckpointIO equal to the trained weights. Two processes on gloo, on
loopback, bounded by a timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.distributed import free_port, read_reports, run_workers, worker_env
from helpers.integration_plugins import VendorPlugin

SCRIPT = Path(__file__).resolve().parent / "scripts" / "lightning_ddp.py"
PROCESSES = 2


def _train(tmp_path: Path, mode: str, accelerator: str, start_method: str) -> list[dict[str, Any]]:
    report_dir = tmp_path / "reports"
    env = worker_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    [result] = run_workers([str(SCRIPT), mode, accelerator, start_method, str(report_dir)], [env])
    assert result.returncode == 0, result.stdout[-4000:]
    return read_reports(report_dir, PROCESSES)


def _assert_trained_together(reports: list[dict[str, Any]], accelerator: str) -> None:
    first = reports[0]
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        assert report["world_size"] == PROCESSES
        assert report["launched"] is True
        assert report["backend"] == "gloo"
        assert report["accelerator"] == accelerator
        assert report["wrapper"] == "DistributedDataParallel"
        assert report["tied"] is True, f"rank {rank}: the tie came apart"
        assert report["unique_parameters"] == 3  # embed/head weight, body weight and bias
        assert report["head_optimized"] is True
        assert report["checkpoint_io"] == "AccelCheckpointIO"
        assert report["checkpoint_equal"] is True, f"rank {rank}: the checkpoint differs"
        # Every rank started from a different seed: equal parameters need DDP.
        assert report["parameters"] == first["parameters"], f"rank {rank} differs from rank 0"
        assert report["reference_max_difference"] < 1e-5
    if accelerator == VendorPlugin.NAME:
        for report in reports:
            assert {"pre_move_hook", "post_move_hook", "mark_step"} <= set(report["vendor_calls"])
            assert report["vendor_mark_steps"] >= 3  # one per optimizer step at least


@pytest.mark.parametrize("accelerator", ["cpu", VendorPlugin.NAME])
def test_fabric_trains_over_two_processes(tmp_path: Path, accelerator: str) -> None:
    _assert_trained_together(_train(tmp_path, "fabric", accelerator, "popen"), accelerator)


@pytest.mark.parametrize("accelerator", ["cpu", VendorPlugin.NAME])
def test_trainer_trains_over_two_processes(tmp_path: Path, accelerator: str) -> None:
    _assert_trained_together(_train(tmp_path, "trainer", accelerator, "popen"), accelerator)


@pytest.mark.parametrize("mode", ["fabric", "trainer"])
def test_trains_over_two_spawned_processes(tmp_path: Path, mode: str) -> None:
    # spawn pickles the strategy, AccelAccelerator and AccelCheckpointIO (the Trainer's
    # run with the model in it: its host tensors arrive in shared memory).
    _assert_trained_together(_train(tmp_path, mode, "cpu", "spawn"), "cpu")
