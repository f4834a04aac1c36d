"""acc.save(obj, path, asynchronous=True) on XLA:CPU: the snapshot crosses to the host
before save returns, so steps taken while the file is written never reach it; the
ties are stored once; XLA's generator is left as it was; the TPU plugin's own save
hook writes in the background."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import accel
from accel.training import _async_save
from helpers.async_saves import HeldWrites
from helpers.models import TiedLM

pytestmark = pytest.mark.xla


@pytest.fixture
def tpu() -> accel.Accelerator:
    pytest.importorskip("torch_xla", reason="the XLA tier has torch_xla")
    return accel.AcceleratorRegistry(entry_points=None).get_accelerator("tpu")


def _step(tpu: accel.Accelerator, model: TiedLM, optimizer: torch.optim.Optimizer) -> None:
    tokens = tpu.batch_to_device(torch.tensor([[1, 2, 3]]))
    model(tokens).sum().backward()
    tpu.optimizer_step(optimizer)
    optimizer.zero_grad()


def test_steps_taken_while_the_file_is_written_never_reach_it(
    tpu: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = tpu.model_to_device(TiedLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(tpu, model, optimizer)
    expected_model = {k: v.cpu() for k, v in model.state_dict().items()}
    expected_moment = optimizer.state[model.embed.weight]["exp_avg"].cpu()
    assert tpu._hooks.answered_by_plugin("save")  # the TPU plugin's hook will write
    held = HeldWrites(monkeypatch)
    rng_before = tpu.rng_state()["device"]
    pending = tpu.save(
        {"model": model, "optimizer": optimizer, "step": 1}, tmp_path / "c.pt", asynchronous=True
    )
    assert tpu.rng_state()["device"] == rng_before  # the save's step marks left no trace
    held.wait_started()
    for _ in range(2):
        _step(tpu, model, optimizer)  # the parameters and the moments change on the device
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    tpu.mark_step()
    held.release()
    pending.wait()
    stored = torch.load(tmp_path / "c.pt", weights_only=True)
    assert stored["model"]["embed.weight"] is stored["model"]["head.weight"]
    for name, value in expected_model.items():
        assert torch.equal(stored["model"][name], value), name
    assert torch.equal(stored["optimizer"]["state"][0]["exp_avg"], expected_moment)
    assert not torch.equal(model.embed.weight.cpu(), expected_model["embed.weight"])
    _async_save.wait_for_saves()
