"""The capture's own walk and replacement lookup (accel.tying._capture), against torch.

Every capture, scan and parameter count walks the model with ``live_slots``; a move
whose plugin returns a replacement module finds the captured modules in it with
``counterparts``. Both must agree with ``named_modules()``, which users and the
rest of torch read names from.
"""

from __future__ import annotations

import copy

import pytest
from torch import nn

from accel.tying._capture import SlotContents, counterparts, live_slots, qualified_name
from helpers.models import ALL_MODELS, ThreeWayTie, TiedLM


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_live_slots_walks_as_named_modules_does(name: str) -> None:
    model = ALL_MODELS[name]()
    rows = live_slots(model)
    walked = [("" if path is None else qualified_name(*path), module) for module, path, *_ in rows]
    assert walked == list(model.named_modules())  # same order, a shared module once
    for module, _, parameters, buffers, submodules in rows:
        # The registries themselves: the scan must see the slots as they are now.
        assert parameters is module._parameters
        assert buffers is module._buffers
        assert submodules is module._modules


def test_counterparts_in_a_copy_are_found_by_name() -> None:
    model = ThreeWayTie()
    replacement = copy.deepcopy(model)
    found = counterparts(SlotContents(model), replacement)
    assert found[id(model)] is replacement
    assert found[id(model.blocks[1])] is replacement.blocks[1]
    assert found[id(model.heads["out"])] is replacement.heads["out"]
    assert len(found) == len(list(model.modules()))


def test_counterparts_held_by_a_wrapper_are_themselves_and_the_rest_left_out() -> None:
    model = TiedLM()
    # Holds the model's embedding itself, under another name, and a stranger as "body".
    wrapper = nn.ModuleDict({"first": model.embed, "body": nn.Linear(8, 8)})
    found = counterparts(SlotContents(model), wrapper)
    assert found[id(model.embed)] is model.embed  # by identity, whatever its name
    assert found[id(model.body)] is wrapper["body"]  # by its qualified name
    assert id(model.head) not in found  # in neither way: left out
    assert found[id(model)] is wrapper  # the root's name is "" in both
