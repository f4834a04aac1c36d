"""XLA SPMD data parallelism: one process, several XLA devices, the batch sharded.

torch_xla reads CPU_NUM_DEVICES when its runtime starts, and the XLA tier's own
process may have started it with one device already, so the training runs in
fresh interpreters: SPMD over two XLA:CPU devices, and one device for reference."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
import accel.distributed as adist
from helpers.distributed import SCRIPTS, no_launcher_and_no_group  # noqa: F401
from helpers.models import TiedLM
from helpers.processes import run_python


def train(mode: str, tmp_path: Path) -> dict[str, Any]:
    report = tmp_path / f"{mode}.json"
    result = run_python(
        [SCRIPTS / "spmd_tied.py", mode, str(report), "3"],
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    loaded: dict[str, Any] = json.loads(report.read_text())
    return loaded


@pytest.mark.xla
def test_spmd_over_two_devices_matches_one_device_with_ties_kept(tmp_path: Path) -> None:
    spmd, single = train("spmd", tmp_path), train("single", tmp_path)
    assert spmd["is_spmd"] and spmd["num_devices"] == 2
    assert spmd["batch_sharding"] == "{devices=[2,1]0,1}"  # the batch split over both
    for report in (spmd, single):
        assert report["tied_after_move"] and report["tied"]
        assert report["unique_parameters"] == 3
    assert spmd["losses"] == pytest.approx(single["losses"], abs=1e-5)
    assert spmd["losses"][0] != pytest.approx(spmd["losses"][-1])  # it trained
    assert spmd["parameters"].keys() == single["parameters"].keys()
    for name, values in spmd["parameters"].items():
        assert values == pytest.approx(single["parameters"][name], abs=1e-5), name
    # No 'xla' process group under SPMD: refused with what to do instead.
    refusal = spmd["process_group_refused"]
    assert "SPMD mode" in refusal and "init_spmd()" in refusal and "shard_batch()" in refusal


@pytest.mark.xla
def test_init_spmd_refuses_a_runtime_that_already_handed_out_a_device() -> None:
    accel.get_accelerator("tpu")  # hands out xla:0: too late to switch to SPMD
    with pytest.raises(adist.DistributedSetupError, match=r"before init_spmd\(\)"):
        adist.init_spmd("tpu")
    assert adist.current_spmd_context() is None


@pytest.mark.xla
def test_init_spmd_refuses_a_handle_that_is_not_xla() -> None:
    with pytest.raises(adist.DistributedSetupError, match="'cpu' uses the 'gloo' backend"):
        adist.init_spmd(accel.get_accelerator("cpu"))


@pytest.mark.xla
def test_fsdp2_on_xla_is_pointed_at_spmd() -> None:
    context = adist.init_process_group("tpu")
    model = context.accelerator.model_to_device(TiedLM())
    with pytest.raises(adist.DistributedSetupError, match=r"init_spmd\(\)"):
        adist.fully_shard_tied(model)


def test_init_spmd_without_torch_xla_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # as if not installed
    with pytest.raises(adist.DistributedSetupError, match=r"needs torch_xla.*accel\[tpu\]"):
        adist.init_spmd("tpu")
    assert adist.current_spmd_context() is None


def test_shard_batch_needs_init_spmd() -> None:
    with pytest.raises(adist.DistributedSetupError, match=r"call it first"):
        adist.shard_batch(torch.zeros(2))


@pytest.mark.xla
@pytest.mark.parametrize("name", ["cpu", "CPU:0"])
def test_init_spmd_refuses_a_name_that_is_not_xla_before_switching_spmd_on(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch_xla.runtime as xr

    switched: list[object] = []
    monkeypatch.setattr(xr, "use_spmd", lambda *a, **k: switched.append(a))
    with pytest.raises(adist.DistributedSetupError, match="'cpu' uses the 'gloo' backend"):
        adist.init_spmd(name)
    assert switched == [] and not xr.is_spmd()
    assert adist.current_spmd_context() is None


def test_init_spmd_checks_the_name_before_it_needs_torch_xla(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # refused before it is imported
    with pytest.raises(adist.DistributedSetupError, match="'cpu' uses the 'gloo' backend"):
        adist.init_spmd("cpu")
    with pytest.raises(accel.AcceleratorNotFoundError, match="unknown accelerator 'tpx'"):
        adist.init_spmd("tpx")
    monkeypatch.setenv("ACCEL_ACCELERATOR", "cpu")
    with pytest.raises(adist.DistributedSetupError, match="'cpu' uses the 'gloo' backend"):
        adist.init_spmd(None)
    assert adist.current_spmd_context() is None
