"""Where ``acc.device_loader`` cuts the XLA graph (XLA:CPU): at the optimizer step, not
at every micro-batch of an accumulation; at every batch of a loop that runs no
backward pass, or whose model accel did not move, as torch_xla's own loader does.
And the batches it hands out without rebuilding them keep their types."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.training.batch import move_batch
from helpers.accumulation_loops import accumulate, data, xla_work
from helpers.processes import last_json_line, run_python

pytestmark = pytest.mark.xla

TESTS = Path(__file__).resolve().parents[1]


def _in_a_fresh_process(loop: str) -> dict[str, Any]:
    """``accumulate(loop)`` in a new process: its own graph cache, so graphs count."""
    return last_json_line(  # type: ignore[no-any-return]
        run_python(
            f"""
            import json, sys
            sys.path.insert(0, {str(TESTS)!r})
            from helpers.accumulation_loops import accumulate
            print(json.dumps(accumulate({loop!r})))
            """,
            env={"PJRT_DEVICE": "CPU"},
            timeout=300,
        )
    )


def test_an_accumulation_loop_through_device_loader_costs_no_more_than_one_mark_per_step() -> None:
    through_loader = _in_a_fresh_process("device_loader")
    by_step = _in_a_fresh_process("batch_to_device")  # acc.optimizer_step marks each step
    torch_xlas = _in_a_fresh_process("MpDeviceLoader")
    assert through_loader["executions"] <= by_step["executions"], (through_loader, by_step)
    assert through_loader["graphs"] <= by_step["graphs"], (through_loader, by_step)
    # The same computation, however the graph is cut.
    assert through_loader["losses"] == pytest.approx(by_step["losses"], rel=1e-5)
    assert torch_xlas["losses"] == pytest.approx(by_step["losses"], rel=1e-5)
    # What the loader saves: torch_xla's own loader runs every micro-batch on its own.
    assert torch_xlas["executions"] > by_step["executions"], (torch_xlas, by_step)


def test_a_step_taken_with_optimizer_step_itself_still_ends_the_graph() -> None:
    through_loader = accumulate("device_loader", step="plain")
    by_step = accumulate("batch_to_device", step="plain")  # acc.mark_step() after each step
    assert through_loader["executions"] <= by_step["executions"], (through_loader, by_step)
    assert through_loader["losses"] == pytest.approx(by_step["losses"], rel=1e-5)


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def _marks() -> int:
    import torch_xla.debug.metrics as met

    return met.counter_value("MarkStep") or 0


def test_the_marks_fall_at_the_optimizer_steps_not_between_micro_batches(
    tpu: accel.Accelerator,
) -> None:
    model = tpu.model_to_device(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    marked_before = []  # per batch: did the loader mark the step before handing it out
    marks = _marks()
    for index, x in enumerate(tpu.device_loader([torch.ones(2, 3) * i for i in range(7)])):
        marked_before.append(_marks() > marks)
        model(x).sum().backward()
        if index % 3 == 2:
            tpu.optimizer_step(optimizer)
            optimizer.zero_grad()
        marks = _marks()
    # Batch 0 starts the loop; batches 3 and 6 follow a step; the rest are micro-steps.
    assert marked_before == [True, False, False, True, False, False, True]


def test_a_loop_without_backward_is_cut_at_every_batch_as_torch_xlas_loader_does(
    tpu: accel.Accelerator,
) -> None:
    import torch_xla.distributed.parallel_loader as pl

    model = tpu.model_to_device(torch.nn.Linear(8, 16))  # watched, but nothing trains
    batches = [tokens.float()[:, :8] for tokens in data()]

    def evaluate(loader: Any) -> int:
        tpu.mark_step()
        executions = xla_work()[1]
        outputs = [model(x).sum() for x in loader]  # kept on the device, never read
        tpu.mark_step()
        assert len(outputs) == len(batches)
        return xla_work()[1] - executions

    with torch.no_grad():
        by_torch_xla = evaluate(pl.MpDeviceLoader(batches, tpu.device))
        through_loader = evaluate(tpu.device_loader(batches))
    assert through_loader == by_torch_xla >= len(batches)


def test_a_model_accel_did_not_move_is_cut_at_every_batch(tpu: accel.Accelerator) -> None:
    import torch_xla.distributed.parallel_loader as pl

    model = torch.nn.Linear(8, 1).to(tpu.device)  # not through acc.model_to_device
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [tokens.float()[:, :8] for tokens in data()]

    def train(loader: Any) -> int:
        tpu.mark_step()
        executions = xla_work()[1]
        for index, x in enumerate(loader):
            model(x).sum().backward()
            if index % 3 == 2:
                optimizer.step()
                optimizer.zero_grad()
        tpu.mark_step()
        return xla_work()[1] - executions

    by_torch_xla = train(pl.MpDeviceLoader(batches, tpu.device))
    through_loader = train(tpu.device_loader(batches))
    assert through_loader == by_torch_xla >= len(batches)


def test_plain_batches_keep_their_types_shared_tensors_and_plugins_hooks(
    registry: accel.AcceleratorRegistry,
) -> None:
    class CountsBatches:
        def __init__(self) -> None:
            self.calls = 0

        @accel.hookimpl
        def batch_to_device(self, batch: Any, device: torch.device) -> Any:
            self.calls += 1
            return move_batch(batch, device)

    shared = torch.arange(3)
    parameter = torch.nn.Parameter(torch.ones(2))  # a subclass: not a plain batch
    batches: list[Any] = [
        shared,
        (shared, shared + 1),
        [shared + 2, shared],
        {"a": shared, "b": shared},
        {"p": parameter, "x": shared},
    ]
    tpu = registry.get_accelerator("tpu")
    for plugin in (None, CountsBatches()):
        if plugin is not None:
            registry.register(plugin)
            tpu = registry.get_accelerator("tpu")
        seen = list(tpu.device_loader(batches))
        assert [type(batch) for batch in seen] == [torch.Tensor, tuple, list, dict, dict]
        assert seen[0].device == tpu.device and seen[0].tolist() == [0, 1, 2]
        assert [t.cpu().tolist() for t in seen[1]] == [[0, 1, 2], [1, 2, 3]]
        assert [t.cpu().tolist() for t in seen[2]] == [[2, 3, 4], [0, 1, 2]]
        assert seen[3]["a"] is seen[3]["b"] and seen[3]["a"].device == tpu.device
        assert seen[4]["p"].device == tpu.device and seen[4]["x"].device == tpu.device
        if plugin is not None:
            assert plugin.calls == len(batches)  # the plugin's hook saw every batch
