"""Promises of batch moves and the device loader (a loader wrapped twice too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

import accel
from accel.testing.conformance._catalog import Subject, promise

__all__ = ["PROMISES"]


class _Pair(NamedTuple):
    tokens: torch.Tensor
    length: int


@dataclass
class _Sample:
    features: torch.Tensor
    label: str


def _batch() -> dict[str, Any]:
    """Every container the batch walker knows, tensors of two dtypes, and plain values."""
    return {
        "inputs": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "nested": [torch.ones(2, dtype=torch.int64), (torch.zeros(3), 7)],
        "pair": _Pair(torch.arange(4), 4),
        "sample": _Sample(torch.full((2,), 2.5), "cat"),
        "name": "batch-0",
        "empty": None,
    }


def _pairs(got: Any, expected: Any, where: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Walk both structures together, asserting the same containers and plain values;
    return every tensor pair with its path."""
    if isinstance(expected, torch.Tensor):
        # A device's tensors may be a subclass of its own (a wrapper around its storage).
        assert isinstance(got, torch.Tensor), f"{where}: a tensor became {type(got).__name__}"
        return [(where, got, expected)]
    assert type(got) is type(expected), (
        f"{where}: {type(expected).__name__} became {type(got).__name__}"
    )
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected), f"{where}: keys {sorted(got)}"
        return [
            pair
            for key in expected
            for pair in _pairs(got[key], expected[key], f"{where}[{key!r}]")
        ]
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{where}: {len(got)} items, were {len(expected)}"
        return [
            pair
            for index, (item, original) in enumerate(zip(got, expected, strict=True))
            for pair in _pairs(item, original, f"{where}[{index}]")
        ]
    if isinstance(expected, _Sample):
        assert got.label == expected.label, f"{where}.label changed"
        return _pairs(got.features, expected.features, f"{where}.features")
    assert got == expected, f"{where}: {expected!r} became {got!r}"
    return []


def _compare(got: Any, expected: Any, device_type: str, where: str) -> None:
    """Same containers; every tensor on the device (all checked before any value, so
    that a tensor left behind is named as such), with its dtype and values."""
    pairs = _pairs(got, expected, where)
    for path, tensor, _ in pairs:
        assert tensor.device.type == device_type, f"{path}: left on {tensor.device}"
    for path, tensor, original in pairs:
        assert tensor.dtype == original.dtype, f"{path}: {original.dtype} became {tensor.dtype}"
        assert torch.equal(tensor.to("cpu"), original), f"{path}: changed value"


@promise(
    "batches.every_tensor_moved",
    "batch_to_device moves every tensor of nested dicts, lists, tuples, namedtuples and "
    "dataclasses, keeps the containers and passes other values through",
)
def every_tensor_moved(subject: Subject) -> None:
    acc = subject.accelerator
    moved = acc.batch_to_device(_batch())
    _compare(moved, _batch(), acc.device.type, "batch")


@promise(
    "batches.device_loader",
    "device_loader yields every batch on the device, in order, with the loader's length, "
    "again on every epoch",
)
def device_loader(subject: Subject) -> None:
    acc = subject.accelerator
    batches = _loader_batches()
    _yields_every_batch(acc.device_loader(batches), batches, acc.device.type, "")


def _loader_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, 2), float(i)), torch.tensor([i])) for i in range(4)]


def _yields_every_batch(loader: Any, batches: list[Any], device_type: str, which: str) -> None:
    """``loader`` has ``batches``' length and yields each once, in order, on the device,
    on each of two epochs."""
    assert len(loader) == len(batches), (
        f"{which}len() is {len(loader)}, the loader has {len(batches)}"
    )
    for epoch in range(2):
        seen = list(loader)
        assert len(seen) == len(batches), (
            f"{which}epoch {epoch}: {len(seen)} batches of {len(batches)}"
        )
        for index, (got, expected) in enumerate(zip(seen, batches, strict=True)):
            _compare(got, expected, device_type, f"{which}epoch {epoch}, batch {index}")


@promise(
    "batches.device_loader_wrapped_twice",
    "device_loader given a loader it already wrapped (a DeviceLoader) yields every batch "
    "once, on the device, in order, with the loader's length, again on every epoch",
)
def device_loader_wrapped_twice(subject: Subject) -> None:
    acc = subject.accelerator
    batches = _loader_batches()
    twice = acc.device_loader(acc.device_loader(batches))
    _yields_every_batch(twice, batches, acc.device.type, "wrapped twice: ")


class _SeesBatchMoves:
    """A cross-cutting plugin (it declares no accelerator, so its hooks run for every
    one) whose ``batch_to_device`` notes each batch's number and lets the next plugin
    move it: a user's logging plugin, say, which ``device_loader`` must not bypass."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @accel.hookimpl
    def batch_to_device(self, batch: Any) -> None:
        number = batch[1] if isinstance(batch, tuple) and len(batch) == 2 else None
        if isinstance(number, torch.Tensor):
            self.seen.append(int(number.to("cpu").item()))


@promise(
    "batches.device_loader_uses_move",
    "device_loader passes every batch through move, so every plugin's batch_to_device "
    "runs for each batch, on every epoch",
)
def device_loader_uses_move(subject: Subject) -> None:
    acc = subject.accelerator
    batches = _loader_batches()
    seeing = _SeesBatchMoves()
    subject.registry.register(seeing, "accel-conformance-sees-batch-moves")
    try:
        loader = acc.device_loader(batches)
        for epoch in range(2):
            seeing.seen.clear()
            for _ in loader:
                pass
            assert sorted(seeing.seen) == list(range(len(batches))), (
                f"epoch {epoch}: of batches {list(range(len(batches)))} only "
                f"{sorted(seeing.seen)} passed through move: device_loader must call move "
                "(the handle's batch_to_device) on every batch, or other plugins' batch "
                "hooks never run"
            )
    finally:
        subject.registry.unregister(seeing)


@promise(
    "batches.on_device_unchanged",
    "batch_to_device returns a tensor already on the device as it is: the same object, no copy",
)
def on_device_unchanged(subject: Subject) -> None:
    acc = subject.accelerator
    tensor = torch.arange(4, dtype=torch.float32).to(acc.device)
    nested = torch.ones(2, dtype=torch.int64).to(acc.device)
    moved = acc.batch_to_device({"inputs": tensor, "nested": [nested]})
    for path, got, original in (
        ("batch['inputs']", moved["inputs"], tensor),
        ("batch['nested'][0]", moved["nested"][0], nested),
        ("batch (a bare tensor)", acc.batch_to_device(tensor), tensor),
    ):
        assert got is original, (
            f"{path}: batch_to_device gave another tensor for one already on "
            f"{original.device} (a copy on every step; device_loader's batches may already "
            "be on the device): return it unchanged"
        )


class _RefusesToMove(torch.Tensor):
    """A tensor whose ``to`` fails: a batch the device refuses (torch-opencl refuses a
    non-contiguous one)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.to:
            raise _RefusedBatchError("the conformance kit's planted refusal")
        return super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]


class _RefusedBatchError(RuntimeError):
    """The refusal the kit plants in a batch move."""


@promise(
    "batches.failure_named",
    "a batch move that fails raises the device's error, with a note naming the hook",
)
def failure_named(subject: Subject) -> None:
    batch = {"ok": torch.ones(2), "refused": torch.ones(2).as_subclass(_RefusesToMove)}
    try:
        subject.accelerator.batch_to_device(batch)
    except _RefusedBatchError as exc:
        notes = getattr(exc, "__notes__", [])
        assert any("'batch_to_device'" in note for note in notes), (
            f"the failed batch move has no note naming the hook (notes: {notes})"
        )
    else:
        raise AssertionError("a batch with a tensor that cannot move was moved")


PROMISES = (
    every_tensor_moved,
    on_device_unchanged,
    device_loader,
    device_loader_wrapped_twice,
    device_loader_uses_move,
    failure_named,
)
