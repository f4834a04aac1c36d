"""Promises of checkpoints: state_dict on the CPU with a tie stored once, save and load
(synchronous and asynchronous), the restore into the model on the device (each tensor to
its own slot), a failed write
that leaves the previous file whole, and a load that never runs code."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from typing import Any

import torch

from accel.testing.conformance._catalog import Subject, promise
from accel.testing.conformance._models import TiedModel, cpu_copy, same_values, sgd_for

__all__ = ["PROMISES"]


def _trained(subject: Subject) -> tuple[TiedModel, torch.optim.SGD]:
    """A tied model on the device, with momentum in its optimizer's state, without a
    forward pass (gradients set by hand)."""
    model = subject.accelerator.model_to_device(TiedModel())
    optimizer = sgd_for(model, momentum=0.9)
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    subject.accelerator.optimizer_step(optimizer)
    return model, optimizer


def _other(subject: Subject) -> tuple[TiedModel, torch.optim.SGD]:
    """A second, different model to load into."""
    model = TiedModel()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(7.0)
    model = subject.accelerator.model_to_device(model)
    optimizer = sgd_for(model, momentum=0.9)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    subject.accelerator.optimizer_step(optimizer)  # creates momentum buffers to overwrite
    return model, optimizer


def _momentum(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        optimizer.state[p]["momentum_buffer"].detach().to("cpu")
        for group in optimizer.param_groups
        for p in group["params"]
    ]


def _restored(
    subject: Subject,
    model: TiedModel,
    optimizer: torch.optim.Optimizer,
    expected: dict[str, torch.Tensor],
    momentum: list[torch.Tensor],
) -> None:
    device_type = subject.accelerator.device.type
    same_values(cpu_copy(model), expected, "after load")
    for name, tensor in model.state_dict(keep_vars=True).items():
        assert tensor.device.type == device_type, f"after load: {name} is on {tensor.device}"
    assert model.head.weight is model.embed.weight, "after load: the tie came apart"
    got = _momentum(optimizer)
    assert len(got) == len(momentum), f"after load: {len(got)} momentum buffers"
    for index, (buffer, original) in enumerate(zip(got, momentum, strict=True)):
        assert torch.equal(buffer, original), f"after load: momentum buffer {index} differs"


@promise(
    "checkpoints.state_dict",
    "state_dict has every tensor on the CPU, the model's values, and a tied weight as one "
    "tensor that torch.save stores once",
)
def state_dict(subject: Subject) -> None:
    model, _ = _trained(subject)
    state = subject.accelerator.state_dict(model)
    for name, tensor in state.items():
        assert tensor.device.type == "cpu", f"state_dict: {name} is on {tensor.device}"
    same_values(state, cpu_copy(model), "state_dict")
    tied = state["embed.weight"], state["head.weight"]
    assert tied[0].untyped_storage().data_ptr() == tied[1].untyped_storage().data_ptr(), (
        "state_dict: embed.weight and head.weight are two tensors, so a checkpoint stores "
        "the tie twice and loading it unties"
    )
    path = subject.workdir / "state.pt"
    torch.save(state, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["embed.weight"].data_ptr() == loaded["head.weight"].data_ptr(), (
        "the saved state_dict stores the tied weight twice"
    )


@promise(
    "checkpoints.save_and_load",
    "save then load(path, state) restores the model and optimizer in place on the device, "
    "tied, and returns the other entries",
)
def save_and_load(subject: Subject) -> None:
    acc = subject.accelerator
    model, optimizer = _trained(subject)
    expected, momentum = cpu_copy(model), _momentum(optimizer)
    path = subject.workdir / "checkpoint.pt"
    acc.save({"model": model, "optimizer": optimizer, "step": 3}, path)
    target, target_optimizer = _other(subject)
    parameters = list(target.parameters())
    rest = acc.load(path, {"model": target, "optimizer": target_optimizer})
    assert rest == {"step": 3}, f"load returned {rest!r}, not the other entries"
    assert list(target.parameters()) == parameters, "load replaced the model's Parameters"
    _restored(subject, target, target_optimizer, expected, momentum)
    stored: Any = acc.load(path)
    for name, tensor in stored["model"].items():
        assert tensor.device.type == "cpu", f"load(path): {name} is on {tensor.device}"
    assert (
        stored["model"]["embed.weight"].data_ptr() == stored["model"]["head.weight"].data_ptr()
    ), "the checkpoint stores the tied weight twice"


def _same_shapes(offset: float) -> torch.nn.Sequential:
    """Three layers whose weights are all of one shape, each filled with a
    value of its own: a restore that puts a tensor in another's slot shows."""
    model = torch.nn.Sequential(*(torch.nn.Linear(3, 3, bias=False) for _ in range(3)))
    with torch.no_grad():
        for index, parameter in enumerate(model.parameters()):
            parameter.fill_(offset + index)
    return model


@promise(
    "checkpoints.restore_order",
    "load(path, state) restores each of several tensors of one shape to its own slot "
    "(restore_to_device returns the device copies in the order given)",
)
def restore_order(subject: Subject) -> None:
    acc = subject.accelerator
    model = acc.model_to_device(_same_shapes(1.0))
    expected = cpu_copy(model)
    path = subject.workdir / "same-shapes.pt"
    acc.save({"model": model}, path)
    target = acc.model_to_device(_same_shapes(-10.0))
    acc.load(path, {"model": target})
    got = cpu_copy(target)
    for name, tensor in expected.items():
        value = got[name].flatten()[0].item()
        source = next(
            (other for other, stored in expected.items() if stored.flatten()[0].item() == value),
            None,
        )
        assert torch.equal(got[name], tensor), (
            f"after load: {name} holds the values of {source or 'no stored tensor'}: "
            "restore_to_device must return the device copies in the order of the tensors "
            "it was given"
        )


@promise(
    "checkpoints.save_asynchronously",
    "save(asynchronous=True) stores the model as it was when save returned, and loads "
    "like a synchronous save",
)
def save_asynchronously(subject: Subject) -> None:
    acc = subject.accelerator
    model, optimizer = _trained(subject)
    expected, momentum = cpu_copy(model), _momentum(optimizer)
    path = subject.workdir / "async.pt"
    pending = acc.save({"model": model, "optimizer": optimizer}, path, asynchronous=True)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(100.0)  # after the snapshot: must not reach the file
    pending.wait()
    assert pending.done(), "wait() returned before the save was done"
    target, target_optimizer = _other(subject)
    acc.load(path, {"model": target, "optimizer": target_optimizer})
    _restored(subject, target, target_optimizer, expected, momentum)


class FailsToStore:
    """Fails as a full disk does, partway through the write of a checkpoint."""

    def __reduce__(self) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device (planted by the conformance kit)")


@promise(
    "checkpoints.failed_save",
    "a save whose write fails raises an OSError and leaves the previous checkpoint whole, "
    "with no other file beside it",
)
def failed_save(subject: Subject) -> None:
    acc = subject.accelerator
    path = subject.workdir / "checkpoint.pt"
    acc.save({"step": 1, "weights": torch.ones(3)}, path)
    previous = path.read_bytes()
    try:
        # Allowed for the save's check of what load reads back: the write itself fails.
        with torch.serialization.safe_globals([FailsToStore]):
            acc.save({"step": 2, "weights": torch.zeros(3), "broken": FailsToStore()}, path)
    except OSError:
        pass
    else:
        raise AssertionError(
            "a save whose write failed (the kit's object raises OSError, as a full disk "
            "does) returned as if it had written; a save hook must raise the OSError"
        )
    assert path.read_bytes() == previous, (
        "the failed save changed the previous checkpoint: a save hook must write "
        "atomically (accel.training.checkpoint.atomic_save)"
    )
    left = sorted(entry.name for entry in subject.workdir.iterdir())
    assert left == [path.name], f"the failed save left {left} in the checkpoint's directory"


def _code_ran(marker: str) -> None:
    """What the crafted checkpoint asks the unpickler to call: it records that it ran
    (in the check's own directory) and does nothing else."""
    Path(marker).write_text("a checkpoint ran code while it was loaded\n", encoding="utf-8")


class _RunsCode:
    """Pickled as a call of :func:`_code_ran`: loading it with ``weights_only=False``
    runs that call, as a malicious checkpoint would run anything."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _code_ran, (self.marker,)


@promise(
    "checkpoints.load_runs_no_code",
    "load reads with weights_only=True: a checkpoint crafted to run code when unpickled "
    "is refused, and nothing in it runs",
)
def load_runs_no_code(subject: Subject) -> None:
    marker = subject.workdir / "code-ran"
    path = subject.workdir / "crafted.pt"
    torch.save({"step": 1, "payload": _RunsCode(marker)}, path)  # written as an attacker would
    # The refusal (torch's UnpicklingError, or the plugin's own) is the promise kept.
    with contextlib.suppress(Exception):
        subject.accelerator.load(path)
    assert not marker.exists(), (
        "loading a crafted checkpoint through acc.load ran code from it: a load hook must "
        "read with torch.load(..., weights_only=True)"
    )


PROMISES = (
    state_dict,
    save_and_load,
    restore_order,
    save_asynchronously,
    failed_save,
    load_runs_no_code,
)
