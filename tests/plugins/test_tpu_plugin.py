"""The TPU plugin (accel.plugins.tpu): the accelerator on torch_xla, and which moves
keep ties (torch's rule, never the TPU plugin's code on other moves). The ties its
moves keep are tested in tests/plugins/test_tpu_moves.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import accel
from accel import tying
from accel._core.moving import move_unties
from accel.tying import count_unique_parameters
from accel.tying._capture import SlotContents
from helpers.fakes import CpuTpuPlugin, FakeAccelerator
from helpers.models import TiedLM
from helpers.processes import run_python
from helpers.registries import isolated_registry


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}


# -- which moves keep ties: torch's own rule, never the TPU plugin's code ----------------


def _samples(model: nn.Module) -> dict[str, torch.Tensor]:
    return {p.device.type: p for p in model.parameters()}


@pytest.fixture
def swap_mode() -> Iterator[None]:
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def test_torch_rule_says_which_moves_untie() -> None:
    cpu_model, meta_model = TiedLM(), TiedLM().to("meta")
    assert not move_unties(_samples(cpu_model), torch.device("cpu"))
    assert move_unties(_samples(cpu_model), torch.device("meta"))
    assert move_unties(_samples(meta_model), torch.device("cpu"))  # leaving unties too
    assert not move_unties(_samples(meta_model), torch.device("meta"))


def test_overwrite_mode_unties_every_move(overwrite_mode: None) -> None:
    assert move_unties(_samples(TiedLM()), torch.device("cpu"))


def test_swap_mode_keeps_every_parameter(swap_mode: None) -> None:
    assert not move_unties(_samples(TiedLM()), torch.device("meta"))
    moved = TiedLM().to("meta")  # torch agrees: swap_tensors keeps each Parameter
    assert moved.head.weight is moved.embed.weight


def test_a_cpu_move_never_runs_the_tying_code(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[str] = []
    original_scan = tying._scan_entries
    monkeypatch.setattr(
        tying, "_scan_entries", lambda *a: (scans.append("scan"), original_scan(*a))[1]
    )
    moved = registry.get_accelerator("cpu").model_to_device(TiedLM())
    assert scans == []
    assert moved.head.weight is moved.embed.weight


def test_a_move_that_unties_captures_the_model_once(
    overwrite_mode: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = isolated_registry()
    registry.register(CpuTpuPlugin(), override=True)
    captures: list[str] = []
    original = SlotContents.__init__

    def counting(self: SlotContents, model: nn.Module) -> None:
        captures.append(type(model).__name__)
        original(self, model)

    monkeypatch.setattr(SlotContents, "__init__", counting)
    monkeypatch.setattr(tying.TyingSnapshot, "capture", None)  # the move derives its groups
    model = registry.get_accelerator("tpu").model_to_device(TiedLM())
    assert captures == ["TiedLM"]
    assert model.head.weight is model.embed.weight


def test_another_accelerator_moving_to_meta_keeps_ties() -> None:
    registry = isolated_registry(FakeAccelerator("npu", device="meta"))
    model = registry.get_accelerator("npu").model_to_device(TiedLM())
    assert model.head.weight is model.embed.weight
    assert model.head.weight.device.type == "meta"


# -- XLA only: the accelerator itself ------------------------------------------------------


def _python(code: str, **env: str | None) -> str:
    """``code``'s stdout in a fresh process; ``env`` sets variables (None deletes one)."""
    result = run_python(code, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.xla
def test_tpu_runs_on_xla_cpu(tpu: accel.Accelerator, registry: accel.AcceleratorRegistry) -> None:
    assert os.environ["PJRT_DEVICE"] == "CPU"
    assert tpu.name == "tpu"
    assert str(tpu.device) == "xla:0"
    assert tpu.device_count() >= 1
    assert tpu.distributed_backend == "xla"
    assert registry.get_accelerator("XLA").name == "tpu"
    assert registry.get_accelerator("tpu:0").device == tpu.device


@pytest.mark.xla
def test_auto_does_not_pick_tpu_on_xla_cpu(registry: accel.AcceleratorRegistry) -> None:
    info = {i.name: i for i in registry.list_accelerators()}["tpu"]
    assert info.available and not info.auto
    assert "CPU" in info.reason
    assert registry.get_accelerator("auto").name != "tpu"


@pytest.mark.xla
def test_model_and_batch_move_to_xla(tpu: accel.Accelerator) -> None:
    model = tpu.model_to_device(nn.Linear(3, 2))
    assert all(p.device == tpu.device for p in model.parameters())
    batch = tpu.batch_to_device({"x": torch.ones(4, 3), "meta": ("id", [torch.zeros(1)])})
    assert batch["x"].device == tpu.device
    assert batch["meta"][0] == "id" and batch["meta"][1][0].device == tpu.device
    out = model(batch["x"]).sum()
    assert out.device == tpu.device and torch.isfinite(out.cpu())


@pytest.mark.xla
def test_import_accel_does_not_import_torch_xla() -> None:
    out = _python("import sys, accel; print('torch_xla' in sys.modules, 'torch' in sys.modules)")
    assert out == "False False"


@pytest.mark.xla
def test_probing_without_pjrt_device_does_not_import_torch_xla() -> None:
    out = _python(
        """
        import os, sys, accel
        infos = {i.name: i for i in accel.list_accelerators()}
        print('torch_xla' in sys.modules, infos['tpu'].available, 'PJRT_DEVICE' in os.environ)
        """,
        PJRT_DEVICE=None,
    )
    assert out == "False False False"


@pytest.mark.xla
def test_cuda_build_without_driver_probes_without_poisoning_fork() -> None:
    # torch 2.9.1 from PyPI is a CUDA build and this machine has no driver: exactly
    # where torch.cuda.device_count() would fall back to cuInit.
    out = _python(
        """
        import os, torch, accel
        assert torch.backends.cuda.is_built()
        infos = {i.name: i for i in accel.list_accelerators()}
        accel.get_accelerator("auto")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, str(torch.cuda._is_in_bad_fork()).encode()); os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(read, 16).decode(), torch.cuda.is_initialized(), infos['cuda'].available)
        print(infos['cuda'].reason)
        """,
        # Unset: with PJRT_DEVICE set, probing imports torch_xla, whose own import
        # poisons fork for CUDA; accel only promises not to do it itself.
        PJRT_DEVICE=None,
    )
    first, reason = out.splitlines()
    assert first == "False False False"
    assert "driver" in reason


@pytest.mark.xla
def test_training_on_xla_keeps_ties_and_learns(tpu: accel.Accelerator) -> None:
    torch.manual_seed(0)
    model = TiedLM(vocab=16, width=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    model = tpu.model_to_device(model, optimizer=optimizer)
    tokens = tpu.batch_to_device(torch.arange(16).repeat(2) % 8)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        logits = model(tokens[:-1])
        loss = nn.functional.cross_entropy(logits, tokens[1:])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        assert model.head.weight is model.embed.weight
        assert optimizer.param_groups[0]["params"][0] is model.embed.weight
    assert model.embed.weight.device == tpu.device
    assert losses[-1] < losses[0] * 0.7


@pytest.mark.xla
def test_a_model_trained_on_xla_exports_to_the_cpu_tied(
    tpu: accel.Accelerator, registry: accel.AcceleratorRegistry
) -> None:
    torch.manual_seed(0)
    model = TiedLM(vocab=16, width=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model = tpu.model_to_device(model, optimizer=optimizer)
    tokens = tpu.batch_to_device(torch.arange(8))
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(tokens[:-1]), tokens[1:]).backward()
        optimizer.step()
    trained = _values(model)
    logits = model(tokens).cpu()
    exported = registry.get_accelerator("cpu").model_to_device(model)
    assert exported.head.weight is exported.embed.weight
    assert count_unique_parameters(exported) == 3
    assert all(torch.equal(v, trained[k]) for k, v in exported.state_dict().items())
    torch.testing.assert_close(exported(torch.arange(8)), logits)


@pytest.mark.xla
def test_demo_on_tpu_reports_equal_counts_and_held_ties() -> None:
    result = run_python(
        ["-m", "accel", "demo", "--accelerator", "tpu", "--steps", "5"], timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "device: xla:0" in result.stdout
    counts = next(line for line in result.stdout.splitlines() if line.startswith("unique"))
    before, after = (int(part.split()[-1]) for part in counts.split(","))
    assert before == after > 0
    assert "every tie held: yes" in result.stdout
