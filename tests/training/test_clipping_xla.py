"""Clipping and accumulation on torch_xla (XLA:CPU).

Real, single replica: the clipped gradients and norm equal torch's on the CPU, and a
loop with accumulation and clipping compiles no extra graph from 5 to 10 steps.
Faked, several replicas (one process cannot run two on XLA:CPU): ``xr.world_size()``
says 2 and ``xm.all_reduce`` is replaced by a counter that adds a second replica's
gradient (twice the local one), so a reduction shows in the values: clipping reduces
first, once, and the step does not reduce again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

import accel
from helpers.models import TiedLM

pytestmark = pytest.mark.xla


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def _tied_model_with_gradients(device: torch.device | str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = TiedLM().to(device)
    tokens = torch.arange(10, device=device).remainder(16).reshape(2, 5)
    model(tokens).pow(2).sum().mul(3).backward()
    return model


def test_clipping_on_xla_equals_torchs_on_the_cpu(tpu: accel.Accelerator) -> None:
    model = tpu.model_to_device(_tied_model_with_gradients("cpu"))  # moves the grads too
    model.zero_grad()
    tokens = torch.arange(10).remainder(16).reshape(2, 5)
    model(tokens.to(tpu.device)).pow(2).sum().mul(3).backward()
    reference = _tied_model_with_gradients("cpu")
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    norm = tpu.clip_grad_norm_(model.parameters(), max_norm=1.0)
    assert norm.device == tpu.device  # still on the device: no host sync
    assert expected.item() > 1.0
    torch.testing.assert_close(norm.cpu(), expected, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine.grad.cpu(), theirs.grad, rtol=1e-5, atol=1e-6)  # type: ignore[union-attr]


class FakeReplicas:
    """Two replicas as torch_xla's collectives would see them, in one process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        self.reductions: list[int] = []  # tensors in each all_reduce call
        monkeypatch.setattr(xr, "world_size", lambda: 2)
        monkeypatch.setattr(xm, "all_reduce", self.all_reduce)

    def all_reduce(self, op: str, inputs: list[torch.Tensor], scale: float = 1.0, **_: Any) -> Any:
        import torch_xla.core.xla_model as xm

        assert op == xm.REDUCE_SUM and scale == 0.5
        self.reductions.append(len(inputs))
        for tensor in inputs:
            tensor.mul_(3.0 * scale)  # this replica's g plus the other's 2g, averaged
        return inputs


def test_clipping_several_replicas_reduces_first_and_the_step_not_again(
    tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas = FakeReplicas(monkeypatch)
    model = tpu.model_to_device(TiedLM())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 3, dtype=torch.long, device=tpu.device)).pow(2).sum().backward()
    local = {name: p.grad.cpu() for name, p in model.named_parameters()}  # type: ignore[union-attr]
    local_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in local.values()]))
    norm = tpu.clip_grad_norm_(model.parameters(), max_norm=1.0)
    assert replicas.reductions == [3]  # embed/head (one tensor, tied), body weight and bias
    torch.testing.assert_close(norm.cpu(), local_norm * 1.5, rtol=1e-5, atol=1e-6)  # reduced
    before = {name: p.detach().cpu() for name, p in model.named_parameters()}
    clipped = {name: p.grad.cpu() for name, p in model.named_parameters()}  # type: ignore[union-attr]
    tpu.optimizer_step(optimizer)
    assert replicas.reductions == [3]  # the step did not reduce again
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.detach().cpu(), before[name] - 0.1 * clipped[name])


def test_a_step_without_clipping_still_reduces_and_a_stale_record_is_not_trusted(
    tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas = FakeReplicas(monkeypatch)
    model = tpu.model_to_device(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 3, device=tpu.device)).sum().backward()
    tpu.optimizer_step(optimizer)
    assert replicas.reductions == [2]  # torch_xla's own reduce_gradients
    # Clipped, then not stepped (a loop skipping a bad batch), then a new backward
    # accumulates into the same gradient tensors: they must be reduced again.
    tpu.clip_grad_norm_(model.parameters(), max_norm=10.0)
    model(torch.ones(1, 3, device=tpu.device)).sum().backward()
    tpu.optimizer_step(optimizer)
    assert replicas.reductions == [2, 2, 2]


def test_accumulating_on_several_replicas_reduces_once_per_optimizer_step(
    tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas = FakeReplicas(monkeypatch)
    model = tpu.model_to_device(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step in range(2):
        for micro_step in range(2):
            with tpu.no_sync(model, enabled=micro_step == 0):
                model(torch.ones(1, 3, device=tpu.device)).sum().backward()
            assert replicas.reductions == [2] * _step  # no reduction in backward
        tpu.clip_grad_norm_(model.parameters(), max_norm=1.0)
        tpu.optimizer_step(optimizer)
        optimizer.zero_grad()
    assert replicas.reductions == [2, 2]


def test_the_real_single_replica_path_reduces_nothing(
    tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch_xla.core.xla_model as xm

    calls: list[object] = []
    real = xm.all_reduce
    monkeypatch.setattr(xm, "all_reduce", lambda *a, **k: calls.append(a) or real(*a, **k))
    model = tpu.model_to_device(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 3, device=tpu.device)).sum().backward()
    tpu.clip_grad_norm_(model.parameters(), max_norm=1.0)
    tpu.optimizer_step(optimizer)
    assert calls == []


LOOP = """
import json
import torch
import torch_xla.debug.metrics as met
import accel
from helpers.models import TiedLM

tpu = accel.get_accelerator("tpu")
torch.manual_seed(0)
model = tpu.model_to_device(TiedLM())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
tokens = torch.arange(40).remainder(16).reshape(4, 10)
norms = []
for step in range({steps}):
    for micro_step in range(2):
        batch = tpu.batch_to_device(tokens.roll(step + micro_step))
        with tpu.no_sync(model, enabled=micro_step == 0), tpu.autocast():
            loss = model(batch).float().pow(2).mean() / 2
        loss.backward()
    norms.append(tpu.clip_grad_norm_(model.parameters(), max_norm=1.0))
    tpu.optimizer_step(optimizer)
    optimizer.zero_grad()
norms = [norm.item() for norm in norms]  # after the loop: no host sync inside it
print(json.dumps({{"compiled": (met.metric_data("CompileTime") or [0])[0], "norms": norms}}))
"""


def _loop(steps: int) -> dict[str, Any]:
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOOP.format(steps=steps))],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PJRT_DEVICE": "CPU",
            "PYTHONPATH": f"{tests}:{os.environ.get('PYTHONPATH', '')}",
        },
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_loop_with_accumulation_and_clipping_compiles_no_extra_graph_from_5_to_10_steps() -> None:
    short, long = _loop(5), _loop(10)
    assert short["compiled"] == long["compiled"] <= 4, (short["compiled"], long["compiled"])
    assert long["norms"][:5] == pytest.approx(short["norms"])
    assert all(norm > 0 for norm in long["norms"])
