"""batch_to_device: every container kind, any depth, types kept, the rest untouched."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import torch

import accel
from accel.training.batch import move_batch

META = torch.device("meta")


def _on_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device == META


class Pair(NamedTuple):
    left: torch.Tensor
    right: Any


LegacyPair = namedtuple("LegacyPair", ["first", "second"])


@dataclass
class Sample:
    tokens: torch.Tensor
    label: str
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FrozenSample:
    tokens: torch.Tensor
    derived: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "derived", int(self.tokens.numel()))


class TupleSubclass(tuple):  # type: ignore[type-arg]
    pass


class ListSubclass(list):  # type: ignore[type-arg]
    pass


def test_tensor_alone_moves() -> None:
    assert _on_meta(move_batch(torch.ones(2), META))


def test_dict_list_tuple_keep_types_and_order() -> None:
    batch = {"b": [torch.ones(1), (torch.zeros(2), 3)], "a": torch.ones(3)}
    moved = move_batch(batch, META)
    assert list(moved) == ["b", "a"]
    assert type(moved["b"]) is list and type(moved["b"][1]) is tuple
    assert _on_meta(moved["b"][0]) and _on_meta(moved["b"][1][0]) and _on_meta(moved["a"])
    assert moved["b"][1][1] == 3
    assert batch["a"].device.type == "cpu", "the input batch must not change"


def test_mapping_subclasses_keep_their_state() -> None:
    ordered = OrderedDict([("x", torch.ones(1)), ("y", torch.ones(1))])
    factory = defaultdict(list, {"x": torch.ones(1)})
    moved_ordered = move_batch(ordered, META)
    moved_factory = move_batch(factory, META)
    assert type(moved_ordered) is OrderedDict and list(moved_ordered) == ["x", "y"]
    assert type(moved_factory) is defaultdict and moved_factory.default_factory is list
    assert _on_meta(moved_ordered["y"]) and _on_meta(moved_factory["x"])


def test_namedtuples_and_sequence_subclasses() -> None:
    moved = move_batch(
        [
            Pair(torch.ones(1), LegacyPair(torch.ones(1), "s")),
            TupleSubclass([torch.ones(1)]),
            ListSubclass([torch.ones(1)]),
        ],
        META,
    )
    pair, tuple_sub, list_sub = moved
    assert type(pair) is Pair and type(pair.right) is LegacyPair
    assert _on_meta(pair.left) and _on_meta(pair.right.first) and pair.right.second == "s"
    assert type(tuple_sub) is TupleSubclass and _on_meta(tuple_sub[0])
    assert type(list_sub) is ListSubclass and _on_meta(list_sub[0])


def test_dataclasses_including_frozen_and_init_false_fields() -> None:
    sample = Sample(torch.ones(2), "cat", {"mask": torch.ones(2)})
    frozen = FrozenSample(torch.ones(5))
    moved, moved_frozen = move_batch((sample, frozen), META)
    assert type(moved) is Sample and moved.label == "cat"
    assert _on_meta(moved.tokens) and _on_meta(moved.extras["mask"])
    assert sample.tokens.device.type == "cpu"
    assert type(moved_frozen) is FrozenSample and _on_meta(moved_frozen.tokens)
    assert moved_frozen.derived == 5


def test_deep_nesting() -> None:
    batch: Any = torch.ones(1)
    for depth in range(200):
        batch = {"level": [batch, depth]} if depth % 2 else (batch,)
    moved = move_batch(batch, META)
    for depth in reversed(range(200)):
        moved = moved["level"][0] if depth % 2 else moved[0]
    assert _on_meta(moved)


def test_everything_else_passes_through_unchanged() -> None:
    marker = object()
    values = [marker, "text", b"bytes", 3, 2.5, None, True, {1, 2}, range(3)]
    moved = move_batch(values, META)
    assert all(a is b for a, b in zip(moved, values, strict=True))


def test_a_tensor_shared_in_the_batch_stays_shared() -> None:
    shared = torch.ones(3)
    moved = move_batch({"a": shared, "b": [shared]}, META)
    assert moved["a"] is moved["b"][0]


@pytest.mark.parametrize("kind", [dict, list, tuple])
def test_a_flat_batch_keeps_a_tensor_it_holds_twice_as_one(kind: type) -> None:
    # Flat batches of tensors take a fast path; it must keep the walker's promise.
    shared, other = torch.ones(3), torch.zeros(2)
    values = [shared, other, shared]
    batch = dict(zip("abc", values, strict=True)) if kind is dict else kind(values)
    moved = move_batch(batch, META)
    items = list(moved.values()) if kind is dict else list(moved)
    assert type(moved) is kind and all(_on_meta(t) for t in items)
    assert items[0] is items[2] and items[0] is not items[1]


def test_a_flat_batch_with_other_values_or_tensor_subclasses_moves_every_tensor() -> None:
    parameter = torch.nn.Parameter(torch.ones(2))
    moved = move_batch({"weight": parameter, "x": torch.ones(1), "n": 1, "s": "text"}, META)
    assert _on_meta(moved["weight"]) and _on_meta(moved["x"])
    assert moved["n"] == 1 and moved["s"] == "text"
    assert move_batch((torch.ones(1), 2), META)[1] == 2


def test_self_referential_batch_is_a_clear_error() -> None:
    batch: list[Any] = [torch.ones(1)]
    batch.append(batch)
    with pytest.raises(ValueError, match="contains itself"):
        move_batch(batch, META)
    looping: dict[str, Any] = {}
    looping["me"] = {"again": looping}
    with pytest.raises(ValueError, match="contains itself"):
        move_batch(looping, META)


def test_the_same_container_twice_is_not_a_cycle() -> None:
    inner = [torch.ones(1)]
    moved = move_batch([inner, inner], META)
    assert _on_meta(moved[0][0]) and _on_meta(moved[1][0])


def test_non_blocking_only_for_pinned_memory_to_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    original = torch.Tensor.to

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(bool(kwargs.get("non_blocking")))
        return original(self, META)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a: self.numel() == 2)
    move_batch([torch.ones(1), torch.ones(2)], torch.device("cuda", 0))
    assert seen == [False, True]
    seen.clear()
    move_batch([torch.ones(2)], META)
    assert seen == [False]


def test_handle_batch_to_device_uses_the_plugin_hook_chain(
    meta_tpu: accel.Accelerator,
) -> None:
    moved = meta_tpu.batch_to_device({"x": torch.ones(2), "n": 1})
    assert _on_meta(moved["x"]) and moved["n"] == 1
