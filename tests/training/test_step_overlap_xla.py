"""On XLA:CPU an optimizer step donates no buffer, so the host traces the next step
while this one runs (accel.plugins._xla_cut); the values stay those of a plain step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import accel
from accel.plugins import _xla_cut
from helpers.processes import last_json_line, run_python

pytestmark = pytest.mark.xla


def test_a_step_through_accel_compiles_the_plain_steps_graphs_and_ends_where_it_does() -> None:
    # What accel keeps alive is data, never a graph output: the same graphs, donating
    # the same buffers. Each loop in a process of its own: torch_xla counts compilations
    # and aliases as it compiles, and reuses a graph compiled once.
    loop = """
        import json, torch, torch_xla, torch_xla.debug.metrics as met
        import accel
        tpu = accel.get_accelerator("tpu")
        torch.manual_seed(0)
        model = tpu.model_to_device(torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        data = torch.randn(4, 8, 8)
        for batch in data:
            model(batch.to(tpu.device)).square().mean().backward()
            {step}
            optimizer.zero_grad(set_to_none=True)
        aliased = met.metric_data("InputOutputAliasCount")
        print(json.dumps({{
            "compiled": met.metric_data("CompileTime")[0],
            "aliased": aliased[1] if aliased else 0,
            "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        }}))
    """

    def run(step: str) -> dict[str, Any]:
        code = loop.format(step=step)
        return last_json_line(run_python(code, env={"PJRT_DEVICE": "CPU"}, timeout=300))  # type: ignore[no-any-return]

    by_hand = run("optimizer.step(); torch_xla.sync()")
    through_accel = run("tpu.optimizer_step(optimizer)")
    assert through_accel["weights"] == by_hand["weights"]
    assert through_accel["compiled"] == by_hand["compiled"] == 2  # a first step, then the rest
    # 4 parameters; then 4 parameters and their 8 AdamW moments.
    assert through_accel["aliased"] == by_hand["aliased"] == 4 + 12


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> Iterator[accel.Accelerator]:
    _xla_cut.release_held()
    yield registry.get_accelerator("tpu")
    _xla_cut.release_held()


def _stepped(tpu: accel.Accelerator) -> torch.optim.Optimizer:
    """Two AdamW steps of a linear layer (the moments exist from the first on)."""
    model = tpu.model_to_device(torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.ones(1, 3, device=tpu.device)).sum().backward()
        tpu.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    return optimizer


def test_what_a_step_overwrote_is_kept_one_cut_longer_then_dropped(
    tpu: accel.Accelerator,
) -> None:
    _stepped(tpu)  # optimizer_step cut the graph itself (no device_loader loop)
    # The second step's two parameters and their two moments each, read by its graph.
    assert len(_xla_cut._HELD.in_flight) == 2 + 2 * 2
    assert _xla_cut._HELD.for_next_cut == []
    tpu.mark_step()
    assert _xla_cut._HELD.in_flight == []


def test_synchronize_drops_what_was_kept(tpu: accel.Accelerator) -> None:
    _stepped(tpu)
    assert _xla_cut._HELD.in_flight
    tpu.synchronize()  # nothing runs any more: a trained model's memory is not pinned
    assert _xla_cut._HELD.in_flight == [] and _xla_cut._HELD.for_next_cut == []


def test_on_a_device_other_than_the_host_nothing_is_kept(
    tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch_xla.runtime as xr

    monkeypatch.setattr(xr, "device_type", lambda: "TPU")
    _xla_cut._host_is_the_device.cache_clear()
    try:
        _stepped(tpu)
        assert _xla_cut._HELD.in_flight == []  # HBM: donation keeps one copy, not two
    finally:
        _xla_cut._host_is_the_device.cache_clear()
