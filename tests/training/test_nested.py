"""One walker for batches, loaders, checkpoints and SPMD: every container kind comes out
the same whichever of them walked it, on the CPU, on `meta` and through plugins."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch

import accel
from accel.training.batch import move_batch
from accel.training.checkpoint._state import map_tensors, to_cpu
from accel.training.nested import map_nested, tensors_in
from helpers.nested_batches import (
    Pair,
    ReadOnlyMapping,
    Sample,
    check_walked,
    every_container,
)
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator

META = torch.device("meta")


def _on_meta(tensor: torch.Tensor) -> bool:
    return tensor.device == META


class MetaBare(BareAccelerator):
    """A third-party accelerator on `meta` that leaves batches to accel's fallbacks."""

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return META


def _first_batch(loader: Iterable[Any]) -> Any:
    return next(iter(loader))


WALKERS: dict[str, Callable[[Any], Any]] = {
    "map_nested": lambda batch: map_nested(batch, lambda t: t.to(META)),
    "move_batch": lambda batch: move_batch(batch, META),
    "checkpoint.map_tensors": lambda batch: map_tensors(batch, lambda t: t.to(META)),
    "batch_to_device (plugin)": lambda batch: (
        isolated_registry(MetaBare()).get_accelerator("bare").batch_to_device(batch)
    ),
    "device_loader (fallback)": lambda batch: _first_batch(
        isolated_registry(MetaBare()).get_accelerator("bare").device_loader([batch])
    ),
}


@pytest.mark.parametrize("walk", WALKERS.values(), ids=WALKERS.keys())
def test_every_container_kind_comes_out_the_same_from_every_walker(
    walk: Callable[[Any], Any],
) -> None:
    batch = every_container()
    check_walked(batch, walk(batch), _on_meta)


def test_the_tpu_plugins_batch_hooks_walk_the_same_way(meta_tpu: accel.Accelerator) -> None:
    batch = every_container()
    check_walked(batch, meta_tpu.batch_to_device(batch), _on_meta)


def test_to_cpu_keeps_every_container_kind_and_shared_tensors() -> None:
    # Tensors that need gradients: to_cpu detaches them, so its output is told apart.
    batch = map_nested(every_container(), lambda t: t.clone().requires_grad_())
    check_walked(batch, to_cpu(batch), lambda t: not t.requires_grad)


def test_a_state_dicts_metadata_survives_the_checkpoint_walk() -> None:
    state = torch.nn.Linear(2, 2).state_dict()
    copied = to_cpu(state)
    assert type(copied) is type(state) and copied._metadata == state._metadata
    assert copied is not state


def test_tensors_in_lists_each_distinct_tensor_once_in_walk_order() -> None:
    batch = every_container()
    found = tensors_in(batch)
    assert found[0] is batch["shared"] and found[1] is batch["sub"][0]
    assert len(found) == len({id(t) for t in found}) == 12
    ids = {id(t) for t in found}
    assert id(batch["sample"].tokens) in ids and id(batch["frozen"].mask) in ids


def test_an_unset_init_false_field_stays_unset() -> None:
    sample = Sample.__new__(Sample)
    sample.tokens = torch.ones(1)
    moved = move_batch(sample, META)
    assert _on_meta(moved.tokens) and "length" not in vars(moved)


@pytest.mark.parametrize(
    ("walk", "what"),
    [
        (lambda b: move_batch(b, META), "batch"),
        (lambda b: to_cpu(b), "checkpoint"),
        (lambda b: tensors_in(b), "batch"),
    ],
    ids=["move_batch", "to_cpu", "tensors_in"],
)
def test_a_cycle_is_refused_with_its_path(walk: Callable[[Any], Any], what: str) -> None:
    inner: dict[str, Any] = {"t": torch.ones(1)}
    batch = {"a": [torch.ones(1), inner]}
    inner["loop"] = (batch["a"],)
    with pytest.raises(ValueError, match="contains itself") as info:
        walk(batch)
    assert str(info.value).startswith(
        f"the {what} contains itself: {what}['a'][1]['loop'][0] is {what}['a'] again "
        f"(a list nested inside itself)"
    )


def test_the_fast_paths_keep_the_walkers_rules() -> None:
    shared = torch.ones(2)
    flat = {"a": shared, "b": shared, "c": torch.zeros(1)}
    moved = move_batch(flat, META)
    assert type(moved) is dict and list(moved) == ["a", "b", "c"]
    assert moved["a"] is moved["b"] and _on_meta(moved["c"])
    mixed = {"a": shared, "n": 3, "b": shared}  # not all tensors: the walker takes over
    moved_mixed = move_batch(mixed, META)
    assert moved_mixed["a"] is moved_mixed["b"] and moved_mixed["n"] == 3
    assert _on_meta(move_batch(shared, META))
    pair, listed = move_batch((shared, shared), META), move_batch([shared, flat["c"]], META)
    assert type(pair) is tuple and pair[0] is pair[1] and _on_meta(pair[0])
    assert type(listed) is list and _on_meta(listed[1])
    named = move_batch(Pair(shared, shared), META)  # a namedtuple: the walker's rebuild
    assert type(named) is Pair and named.left is named.right


def test_the_cuda_loaders_pinning_walks_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.plugins._gpu_training import pin_batch

    # No CUDA here: "pinning" moves to `meta`, so the test sees which tensors it reached.
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: self.to(META))
    batch = every_container()
    check_walked(batch, pin_batch(batch), _on_meta)


def test_a_mapping_that_builds_its_values_on_access_gets_each_value_converted() -> None:
    class Lazy(ReadOnlyMapping):
        def __getitem__(self, key: str) -> Any:
            return torch.full((1,), float(super().__getitem__(key)))  # a new tensor per access

    # Freed tensors' ids are reused at once; a memo that let them go would hand out
    # the first conversion again.
    lazy = Lazy({str(i): i for i in range(50)})
    out = map_nested(lazy, lambda t: t.item())
    assert [out[str(i)] for i in range(50)] == [float(i) for i in range(50)]
