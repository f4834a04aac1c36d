"""acc.save / acc.load / rng_state on XLA:CPU: restored onto the device with ties kept,
optimizer state on the parameters' device, XLA's own generator stored, and a save that
does not show in later draws."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import accel
from accel.errors import AcceleratorRuntimeError
from helpers.models import TiedLM

pytestmark = pytest.mark.xla


@pytest.fixture
def tpu() -> accel.Accelerator:
    pytest.importorskip("torch_xla", reason="the XLA tier has torch_xla")
    return accel.AcceleratorRegistry(entry_points=None).get_accelerator("tpu")


def _trained(tpu: accel.Accelerator) -> tuple[TiedLM, torch.optim.Optimizer]:
    model = tpu.model_to_device(TiedLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    tokens = tpu.batch_to_device(torch.tensor([[1, 2, 3]]))
    model(tokens).sum().backward()
    tpu.optimizer_step(optimizer)
    return model, optimizer


def test_a_checkpoint_loads_back_onto_xla_with_ties_and_optimizer_state(
    tpu: accel.Accelerator, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model, optimizer = _trained(tpu)
    tpu.save({"model": model, "optimizer": optimizer, "step": 1}, tmp_path / "c.pt")
    stored = torch.load(tmp_path / "c.pt", weights_only=True)  # loads without torch_xla
    assert stored["model"]["embed.weight"].device.type == "cpu"
    assert stored["model"]["embed.weight"] is stored["model"]["head.weight"]

    torch.manual_seed(1)
    fresh = tpu.model_to_device(TiedLM())
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    import torch_xla.debug.metrics as met

    tpu.mark_step()
    met.clear_all()
    remainder = tpu.load(tmp_path / "c.pt", {"model": fresh, "optimizer": fresh_optimizer})
    tpu.synchronize()
    # The restored tensors are uploaded as data: no graph compiled, per tensor or at all.
    assert met.metric_data("CompileTime") is None
    assert met.counter_value("MarkStep") == 1
    assert remainder == {"step": 1}
    assert fresh.head.weight is fresh.embed.weight and fresh.embed.weight.device.type == "xla"
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name].cpu(), tensor.cpu()), name
    moments = fresh_optimizer.state[fresh.embed.weight]["exp_avg"]
    assert moments.device == fresh.embed.weight.device
    assert torch.equal(moments.cpu(), optimizer.state[model.embed.weight]["exp_avg"].cpu())


def test_xla_generator_round_trips_and_a_save_does_not_show_in_later_draws(
    tpu: accel.Accelerator, tmp_path: Path
) -> None:
    tpu.manual_seed(3)
    state = tpu.rng_state()
    assert state["device"]["type"] == "xla"

    def draw() -> torch.Tensor:
        value = torch.rand(4, device=tpu.device)
        tpu.mark_step()
        return value.cpu()

    first = draw()
    tpu.set_rng_state(state)
    assert torch.equal(draw(), first)  # XLA's own generator came back

    # A save between steps (the step already marked, as optimizer_step does outside a
    # device_loader loop) leaves no trace in later draws, though it marks a step itself.
    model = tpu.model_to_device(TiedLM())  # its state_dict marks the step too
    tpu.set_rng_state(state)
    tpu.save({"x": draw(), "model": model}, tmp_path / "c.pt")
    with_save = draw()
    tpu.set_rng_state(state)
    draw()
    assert torch.equal(draw(), with_save)


def test_a_restore_uploads_every_tensor_in_one_transfer(
    tpu: accel.Accelerator, tmp_path: Path
) -> None:
    import torch_xla.debug.metrics as met

    torch.manual_seed(0)
    model, optimizer = _trained(tpu)
    tpu.save({"model": model, "optimizer": optimizer}, tmp_path / "c.pt")
    stored = torch.load(tmp_path / "c.pt", weights_only=True)
    # A bias stored in another dtype than the model's: load_state_dict casts it, as before.
    stored["model"]["body.bias"] = stored["model"]["body.bias"].double()
    torch.save(stored, tmp_path / "mixed.pt")

    torch.manual_seed(1)
    fresh = tpu.model_to_device(TiedLM())
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    tpu.mark_step()
    met.clear_all()
    tpu.load(tmp_path / "mixed.pt", {"model": fresh, "optimizer": fresh_optimizer})
    tpu.synchronize()
    # The tied weight once, body.weight, the two moments of each of the three
    # parameters: one upload for all of them; body.bias (float64 stored) on its own.
    assert met.metric_data("TransferToDeviceTime")[0] == 2
    assert met.metric_data("CompileTime") is None
    assert fresh.head.weight is fresh.embed.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name].cpu(), tensor.cpu()), name
    for parameter, trained in zip(fresh.parameters(), model.parameters(), strict=True):
        entries, expected = fresh_optimizer.state[parameter], optimizer.state[trained]
        assert entries["step"].device.type == "cpu"  # torch keeps AdamW's step on the host
        for name in ("exp_avg", "exp_avg_sq"):
            assert entries[name].device == parameter.device
            assert torch.equal(entries[name].cpu(), expected[name].cpu()), name


@pytest.mark.parametrize("word", [None, (28, "OSError: no space left on device"), (None, "E: x")])
def test_the_master_ordinals_word_travels_over_xlas_rendezvous(
    tpu: accel.Accelerator, word: object
) -> None:
    from accel.plugins._xla_training import _rendezvous

    # One replica here: what it says is what every replica hears, the same word.
    assert _rendezvous(word) == word  # type: ignore[arg-type]


def _replica_of_two(monkeypatch: pytest.MonkeyPatch, *, master: bool, job: bool) -> list[object]:
    """Make the TPU plugin's save see one of two replicas (``job``: with a
    torch.distributed group); returns the words it sent over XLA's rendezvous."""
    pytest.importorskip("torch_xla", reason="the XLA tier has torch_xla")
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    from accel.plugins import _xla_training

    told: list[object] = []
    monkeypatch.setattr(xr, "world_size", lambda: 2)
    monkeypatch.setattr(xm, "is_master_ordinal", lambda local=True: master)
    monkeypatch.setattr(_xla_training, "in_a_job", lambda: job)
    monkeypatch.setattr(_xla_training, "_rendezvous", lambda word: told.append(word))
    return told


def _in_a_thread(run: Callable[[], None]) -> BaseException | None:
    failures: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return failures[0] if failures else None


def test_a_synchronous_save_from_a_loop_thread_is_written_by_the_master_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray Train runs the loop in a thread: that is no background write, so a replica
    # other than the master waits for its word rather than writing.
    from accel.plugins._xla_training import XlaTrainingHooks

    told = _replica_of_two(monkeypatch, master=False, job=True)
    path = tmp_path / "c.pt"
    assert _in_a_thread(lambda: XlaTrainingHooks().save({"x": torch.ones(2)}, path)) is None
    assert not path.exists()
    assert told == [None]


@pytest.mark.parametrize("job", [True, False])
def test_the_background_write_only_writes_or_asks_for_a_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: bool
) -> None:
    from accel.plugins._xla_training import XlaTrainingHooks
    from accel.training.checkpoint import _async_save

    told = _replica_of_two(monkeypatch, master=True, job=job)
    path = tmp_path / "c.pt"
    with _async_save.one_save_at_a_time():
        pending = _async_save.start_background(
            path, lambda obj: XlaTrainingHooks().save(obj, path), {"x": torch.ones(2)}
        )
    if job:
        pending.wait()
        assert torch.equal(torch.load(path)["x"], torch.ones(2))
    else:
        with pytest.raises(AcceleratorRuntimeError, match=r"needs a torch\.distributed group"):
            pending.wait()
        assert not path.exists()
    assert told == []  # no collective from the writer's thread
