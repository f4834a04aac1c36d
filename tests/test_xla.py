"""The XLA tier: the TPU plugin on real torch_xla, running on XLA:CPU (PJRT_DEVICE=CPU).

Run by `bash scripts/test` in its torch 2.9.1 + torch_xla 2.9.0 environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from models import (
    ALL_MODELS,
    FrozenTie,
    OwnTieWeights,
    SharedBuffer,
    SharedSubmodule,
    TiedLM,
    UntiesOnPurpose,
)
from torch import nn

import accel
from accel.tying import count_unique_parameters, find_tied_parameters

pytestmark = pytest.mark.xla


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def _python(code: str, **env: str | None) -> str:
    environment = dict(os.environ)
    for key, value in env.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_tpu_runs_on_xla_cpu(tpu: accel.Accelerator, registry: accel.AcceleratorRegistry) -> None:
    assert os.environ["PJRT_DEVICE"] == "CPU"
    assert tpu.name == "tpu"
    assert str(tpu.device) == "xla:0"
    assert tpu.device_count() >= 1
    assert tpu.distributed_backend == "xla"
    assert registry.get_accelerator("XLA").name == "tpu"
    assert registry.get_accelerator("tpu:0").device == tpu.device


def test_auto_does_not_pick_tpu_on_xla_cpu(registry: accel.AcceleratorRegistry) -> None:
    info = {i.name: i for i in registry.list_accelerators()}["tpu"]
    assert info.available and not info.auto
    assert "CPU" in info.reason
    assert registry.get_accelerator("auto").name != "tpu"


def test_model_and_batch_move_to_xla(tpu: accel.Accelerator) -> None:
    model = tpu.model_to_device(nn.Linear(3, 2))
    assert all(p.device == tpu.device for p in model.parameters())
    batch = tpu.batch_to_device({"x": torch.ones(4, 3), "meta": ("id", [torch.zeros(1)])})
    assert batch["x"].device == tpu.device
    assert batch["meta"][0] == "id" and batch["meta"][1][0].device == tpu.device
    out = model(batch["x"]).sum()
    assert out.device == tpu.device and torch.isfinite(out.cpu())


def test_import_accel_does_not_import_torch_xla() -> None:
    out = _python("import sys, accel; print('torch_xla' in sys.modules, 'torch' in sys.modules)")
    assert out == "False False"


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


def test_plain_to_really_unties_on_xla(tpu: accel.Accelerator) -> None:
    model = TiedLM()
    assert count_unique_parameters(model) == 3
    model.to(tpu.device)  # what everyone else does
    assert model.head.weight is not model.embed.weight
    assert count_unique_parameters(model) == 4


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_every_tie_survives_the_move(tpu: accel.Accelerator, name: str) -> None:
    model = ALL_MODELS[name]()
    groups = find_tied_parameters(model)
    partition = {g.names for g in groups}
    count = count_unique_parameters(model)
    values = {k: v.detach().clone() for k, v in model.state_dict().items()}
    moved = tpu.model_to_device(model)
    assert {g.names for g in find_tied_parameters(moved)} == partition
    assert count_unique_parameters(moved) == count
    for group in groups:
        first, *rest = group.tensors()
        assert first is not None and first.device == tpu.device
        assert all(t is first for t in rest)
    for key, value in moved.state_dict().items():
        assert value.device == tpu.device
        assert torch.equal(value.cpu(), values[key])


def test_frozen_tie_on_xla(tpu: accel.Accelerator) -> None:
    model = tpu.model_to_device(FrozenTie())
    assert model.head.weight is model.embed.weight
    assert not model.embed.weight.requires_grad


def test_own_tie_weights_on_xla(tpu: accel.Accelerator) -> None:
    model = tpu.model_to_device(OwnTieWeights())
    assert model.tie_weights_calls == 2
    assert model.decoder.weight is model.encoder.weight


def test_untying_tie_weights_raises_and_restores_on_xla(tpu: accel.Accelerator) -> None:
    model = UntiesOnPurpose()
    before = model.embed.weight
    with pytest.raises(accel.WeightTyingError, match=r"Before: 3 After: 4") as info:
        tpu.model_to_device(model)
    assert info.value.broken_groups == [("embed.weight", "head.weight")]
    assert model.embed.weight is before and model.head.weight is before
    assert before.device.type == "cpu"


def test_shared_buffer_and_submodule_on_xla(tpu: accel.Accelerator) -> None:
    buffers = tpu.model_to_device(SharedBuffer())
    assert buffers.a.table is buffers.b.table and buffers.a.table.device == tpu.device
    shared = tpu.model_to_device(SharedSubmodule())
    assert shared.again is shared.block


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


def test_demo_on_tpu_reports_equal_counts_and_held_ties() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "accel", "demo", "--accelerator", "tpu", "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "device: xla:0" in result.stdout
    counts = next(line for line in result.stdout.splitlines() if line.startswith("unique"))
    before, after = (int(part.split()[-1]) for part in counts.split(","))
    assert before == after > 0
    assert "every tie held: yes" in result.stdout
