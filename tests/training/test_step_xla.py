"""The training step on real torch_xla (XLA:CPU): bounded compilation, the same losses
as the CPU, seeds, the parallel device loader, and checkpoints of tied models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from helpers.models import TiedLM
from helpers.processes import last_json_line, run_python

pytestmark = pytest.mark.xla

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _python(code: str) -> Any:
    """Run ``code`` in a fresh process (its own XLA graph cache); parse its last line."""
    return last_json_line(run_python(code, env={"PJRT_DEVICE": "CPU"}, timeout=300))


def _docs_loop(steps: int) -> dict[str, Any]:
    return _python(  # type: ignore[no-any-return]
        f"""
        import json, sys
        sys.path.insert(0, {str(EXAMPLES)!r})
        import accel
        import torch_xla.debug.metrics as met
        from training_loop import train

        tpu = accel.get_accelerator("tpu")  # the XLA runtime starts before any backward()
        xla_losses = train(tpu, {steps})
        compiled = (met.metric_data("CompileTime") or [0])[0]
        cpu_losses = train(accel.get_accelerator("cpu"), {steps})
        print(json.dumps({{"compiled": compiled, "xla": xla_losses, "cpu": cpu_losses}}))
        """
    )


def test_the_docs_loop_compiles_a_bounded_number_of_graphs_and_matches_the_cpu() -> None:
    short, long = _docs_loop(10), _docs_loop(40)
    assert short["compiled"] == long["compiled"] <= 3, (short["compiled"], long["compiled"])
    for run in (short, long):
        assert run["xla"] == pytest.approx(run["cpu"], rel=1e-4, abs=1e-5)
    assert long["xla"][:10] == short["xla"]
    assert long["xla"][-1] < long["xla"][0] / 5  # it learns


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def test_manual_seed_repeats_xla_random_numbers(tpu: accel.Accelerator) -> None:
    def draw(seed: int) -> torch.Tensor:
        tpu.manual_seed(seed)
        return torch.rand(6, device=tpu.device).cpu()

    first = draw(11)
    assert torch.equal(draw(11), first)  # XLA's own generator was reset, not just torch's
    assert not torch.equal(draw(12), first)


def test_manual_seed_makes_two_xla_training_runs_identical() -> None:
    runs = _python(
        f"""
        import json, sys
        sys.path.insert(0, {str(EXAMPLES)!r})
        import accel
        from training_loop import train
        tpu = accel.get_accelerator("tpu")
        print(json.dumps([train(tpu, 5, seed=3), train(tpu, 5, seed=3), train(tpu, 5, seed=4)]))
        """
    )
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_device_loader_yields_xla_batches_as_the_loader_built_them_and_marks_steps(
    tpu: accel.Accelerator,
) -> None:
    import torch_xla.debug.metrics as met

    shared = torch.ones(2)
    batches = [{"x": shared * i, "pair": (shared, "tag"), "i": i} for i in range(3)]
    loader = tpu.device_loader(batches)
    assert len(loader) == 3
    marks_before = met.counter_value("MarkStep") or 0
    seen = []
    for batch in loader:
        assert batch["x"].device == tpu.device
        assert isinstance(batch["pair"], tuple) and batch["pair"][1] == "tag"
        seen.append((batch["i"], batch["x"].cpu().tolist()))
    assert seen == [(i, [float(i)] * 2) for i in range(3)]
    assert (met.counter_value("MarkStep") or 0) - marks_before >= 3  # one per batch


def test_an_xla_loader_error_reaches_the_loop_instead_of_ending_the_epoch(
    tpu: accel.Accelerator,
) -> None:
    def failing() -> Iterator[torch.Tensor]:
        yield torch.ones(1)
        yield torch.ones(1)
        raise OSError("shard 3 is unreadable")

    class Loader:
        def __iter__(self) -> Iterator[torch.Tensor]:
            return failing()

    seen: list[torch.Tensor] = []

    def consume() -> None:
        seen.extend(tpu.device_loader(Loader()))

    with pytest.raises(OSError, match=r"shard 3 is unreadable") as info:
        consume()
    assert len(seen) == 2
    assert "raised by the loader after 2 batches" in "\n".join(info.value.__notes__)


def test_optimizer_step_on_xla_steps_and_marks_the_step(tpu: accel.Accelerator) -> None:
    import torch_xla.debug.metrics as met

    model = tpu.model_to_device(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model.weight.detach().cpu()
    model.weight.grad = torch.ones_like(model.weight)
    model.bias.grad = torch.ones_like(model.bias)
    marks = met.counter_value("MarkStep") or 0
    assert tpu.optimizer_step(optimizer, lambda: 2.5) == 2.5
    assert (met.counter_value("MarkStep") or 0) == marks + 1
    assert torch.allclose(model.weight.detach().cpu(), before - 0.5)


def test_xla_memory_stats_have_the_common_keys(tpu: accel.Accelerator) -> None:
    stats = tpu.memory_stats()
    assert set(stats) == {"allocated_bytes", "peak_allocated_bytes", "total_bytes"}
    # XLA:CPU keeps no allocator statistics: unknown, not made up.
    assert set(stats.values()) == {None}


def test_xla_autocast_defaults_to_bfloat16(tpu: accel.Accelerator) -> None:
    layer = torch.nn.Linear(2, 2).to(tpu.device)
    with tpu.autocast():
        assert layer(torch.ones(1, 2, device=tpu.device)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"cannot autocast to torch.float64"):
        tpu.autocast(torch.float64)


def test_state_dict_of_a_tied_xla_model_round_trips_with_its_tie(
    tpu: accel.Accelerator, tmp_path: Path
) -> None:
    model = tpu.model_to_device(TiedLM())
    with torch.no_grad():
        model.embed.weight.mul_(2.0)  # a pending XLA op: state_dict must still see it
    state = tpu.state_dict(model)
    assert state["embed.weight"] is state["head.weight"]
    assert {tensor.device.type for tensor in state.values()} == {"cpu"}
    tpu.save(state, tmp_path / "tied.pt")
    loaded = torch.load(tmp_path / "tied.pt")
    assert loaded["embed.weight"] is loaded["head.weight"]
    fresh = TiedLM()
    fresh.load_state_dict(loaded)
    fresh = tpu.model_to_device(fresh)
    assert fresh.head.weight is fresh.embed.weight and fresh.embed.weight.device == tpu.device
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key].cpu(), value.cpu()), key


def test_in_a_device_loader_loop_the_next_batch_marks_the_step_and_break_marks_the_last(
    tpu: accel.Accelerator,
) -> None:
    import torch_xla.debug.metrics as met

    model = tpu.model_to_device(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def marks() -> int:
        return met.counter_value("MarkStep") or 0

    after_step = []
    for count, batch in enumerate(tpu.device_loader([torch.ones(1, 2)] * 3), start=1):
        model.weight.grad = batch.new_ones(1, 2)
        before = marks()
        tpu.optimizer_step(optimizer)
        # The gradients are still alive here: marking now would make the graph write
        # them out. The next batch marks the step instead, after zero_grad().
        after_step.append(marks() - before)
        optimizer.zero_grad()
        if count == 2:
            before_break = marks()
            break
    assert after_step == [0, 0]
    assert marks() == before_break + 1  # the loop's last step, marked on leaving it
    # Outside a loader loop, or a second step without a new batch, marks at once.
    before = marks()
    tpu.optimizer_step(optimizer)
    assert marks() == before + 1


def test_with_several_replicas_a_closure_runs_first_then_the_reduction_then_the_step(
    tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faked, two replicas: ``xr.world_size()`` says 2 and ``xm.all_reduce`` adds a second
    replica's gradient (twice the local one), so the step shows whether it used reduced
    gradients. The closure computes the gradients, so the reduction must come after it."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    events: list[str] = []

    def all_reduce(op: str, inputs: list[torch.Tensor], scale: float = 1.0, **_: Any) -> Any:
        events.append(f"all_reduce of {len(inputs)}")
        for tensor in inputs:
            tensor.mul_(3.0 * scale)  # this replica's g plus the other's 2g, averaged
        return inputs

    monkeypatch.setattr(xr, "world_size", lambda: 2)
    monkeypatch.setattr(xm, "all_reduce", all_reduce)
    model = tpu.model_to_device(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    real_step = optimizer.step
    monkeypatch.setattr(optimizer, "step", lambda c: (events.append("step"), real_step(c))[1])
    before = {name: p.detach().cpu() for name, p in model.named_parameters()}
    local: dict[str, torch.Tensor] = {}

    def closure() -> torch.Tensor:
        events.append("closure")
        optimizer.zero_grad()
        loss = model(torch.ones(1, 2, device=tpu.device)).sum()
        loss.backward()
        local.update({n: p.grad.cpu() for n, p in model.named_parameters()})  # type: ignore[union-attr]
        return loss

    loss = tpu.optimizer_step(optimizer, closure)
    assert isinstance(loss, torch.Tensor)
    assert events == ["step", "closure", "all_reduce of 2"]  # nothing reduced before the closure
    for name, param in model.named_parameters():  # stepped with the reduced gradients
        expected = before[name] - 0.1 * 1.5 * local[name]
        torch.testing.assert_close(param.detach().cpu(), expected)
