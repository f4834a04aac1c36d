"""A batch holding every container kind the walker knows, and the check that a walked
copy kept each of them: used on the CPU, on `meta` and on XLA alike."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


class Pair(NamedTuple):
    left: torch.Tensor
    right: Any


@dataclass
class Sample:
    tokens: torch.Tensor
    # init=False, and __post_init__ would overwrite it: a walker that re-runs the
    # constructor (dataclasses.replace) loses the value the loader set afterwards.
    length: int = field(init=False, default=-1)
    created: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.length = 0
        self.created.append("init")


@dataclass(frozen=True)
class Frozen:
    mask: torch.Tensor


class TaggedList(list):  # type: ignore[type-arg]
    tag = "class"


class TupleSubclass(tuple):  # type: ignore[type-arg]
    pass


class ReadOnlyMapping(Mapping[str, Any]):
    """A Mapping that is not a dict: rebuilt from a dict of its items."""

    def __init__(self, items: dict[str, Any]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def every_container(offset: float = 0.0) -> dict[str, Any]:
    """One batch with every container kind, a shared tensor and a shared sub-container."""
    shared = torch.full((2,), 1.0 + offset)
    sub = [torch.full((2,), 2.0 + offset)]
    sample = Sample(torch.full((3,), 3.0 + offset))
    sample.length = 3  # set after construction, as a collate function would
    factory: defaultdict[str, list[Any]] = defaultdict(list)
    factory["x"].append(torch.full((1,), 4.0 + offset))
    tagged = TaggedList([torch.full((1,), 5.0 + offset)])
    tagged.tag = "instance"  # type: ignore[misc]
    return {
        "shared": shared,
        "again": [shared, shared],
        "sub": sub,
        "sub_again": sub,
        "factory": factory,
        "ordered": OrderedDict([("b", torch.zeros(1)), ("a", torch.ones(1))]),
        "mapping": ReadOnlyMapping({"m": torch.ones(1)}),
        "pair": Pair(torch.ones(1), "right"),
        "tuple": (torch.ones(1), 7),
        "tuple_sub": TupleSubclass([torch.ones(1)]),
        "tagged": tagged,
        "sample": sample,
        "frozen": Frozen(torch.ones(2)),
        "plain": ["text", 3, 2.5, None, {1, 2}],
    }


def check_walked(
    original: dict[str, Any], out: Any, converted: Callable[[torch.Tensor], bool]
) -> None:
    """``out`` is ``original`` walked: every container kind kept, every tensor
    converted (``converted(t)``), shared objects still shared, ``original`` unchanged."""
    assert type(out) is dict and list(out) == list(original)
    assert converted(out["shared"]) and not converted(original["shared"])
    assert out["again"][0] is out["shared"] and out["again"][1] is out["shared"]
    assert out["sub"] is out["sub_again"] and converted(out["sub"][0])
    assert type(out["factory"]) is defaultdict and out["factory"].default_factory is list
    assert converted(out["factory"]["x"][0])
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["b", "a"]
    assert type(out["mapping"]) is ReadOnlyMapping and converted(out["mapping"]["m"])
    assert type(out["pair"]) is Pair and converted(out["pair"].left)
    assert out["pair"].right == "right"
    assert type(out["tuple"]) is tuple and out["tuple"][1] == 7 and converted(out["tuple"][0])
    assert type(out["tuple_sub"]) is TupleSubclass and converted(out["tuple_sub"][0])
    assert type(out["tagged"]) is TaggedList and out["tagged"].tag == "instance"
    sample = out["sample"]
    assert type(sample) is Sample and converted(sample.tokens)
    assert sample.length == 3, "the init=False field must keep its value"
    assert sample.created == ["init"], "__post_init__ must not run again"
    assert type(out["frozen"]) is Frozen and converted(out["frozen"].mask)
    assert out["plain"][:4] == ["text", 3, 2.5, None]
    assert out["plain"][4] is original["plain"][4]
    assert not converted(original["sample"].tokens), "the input must not change"
