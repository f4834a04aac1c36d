"""Every rank's generators in a checkpoint: outside a job of several ranks a save stores
``acc.rng_state()`` as it is; a record of several ranks' states gives each loading rank
its own, and on another world size a rank that was not saved gets rank 0's, with a
RankGeneratorsWarning at the caller's line. (The saves of two gloo ranks:
tests/distributed/test_resume_ranks.py and test_sharded_reshard.py.)"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.errors import RankGeneratorsWarning
from accel.training.checkpoint._rank_generators import (
    RECORD_KEY,
    gathered_generators,
    own_generators,
    record_placeholders,
)


def _states(acc: accel.Accelerator, count: int) -> list[dict[str, Any]]:
    states = []
    for seed in range(count):
        acc.manual_seed(seed)
        states.append(acc.rng_state())
    return states


def _stored(states: list[dict[str, Any]]) -> dict[str, Any]:
    record = {RECORD_KEY: tuple(states)}
    return {"step": 3, "rng": record, "nested": [{"gen": record}]}


def test_a_lone_process_stores_its_generators_as_they_are(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    state = {"step": 1, "rng": acc.rng_state()}
    assert gathered_generators(state) is state
    acc.save(state, tmp_path / "c.pt")
    stored = torch.load(tmp_path / "c.pt", weights_only=True)
    assert set(stored["rng"]) == {"python", "numpy", "torch", "device"}


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_each_rank_of_the_saved_world_gets_its_own(acc: accel.Accelerator, rank: int) -> None:
    states = _states(acc, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same world size: no warning
        loaded = own_generators(_stored(states), rank, 3)
    assert loaded["step"] == 3
    for got in (loaded["rng"], loaded["nested"][0]["gen"]):
        assert torch.equal(got["torch"], states[rank]["torch"])
        assert got["python"] == states[rank]["python"]


def test_on_fewer_ranks_each_gets_its_own_and_is_told(acc: accel.Accelerator) -> None:
    states = _states(acc, 4)
    with pytest.warns(
        RankGeneratorsWarning, match=r"generators of 4 rank\(s\), but this job has 2: "
    ):
        loaded = own_generators(_stored(states), 1, 2)
    assert torch.equal(loaded["rng"]["torch"], states[1]["torch"])


def test_a_rank_beyond_the_saved_ones_gets_rank_0s(acc: accel.Accelerator) -> None:
    states = _states(acc, 2)
    with pytest.warns(
        RankGeneratorsWarning, match="rank 3 was not saved, so it gets rank 0's generators"
    ):
        loaded = own_generators(_stored(states), 3, 4)
    assert torch.equal(loaded["rng"]["torch"], states[0]["torch"])


def test_a_rank_that_had_no_value_there_gets_rank_0s(acc: accel.Accelerator) -> None:
    states = _states(acc, 2)
    with pytest.warns(RankGeneratorsWarning, match="rank 1 was not saved"):
        loaded = own_generators({"rng": {RECORD_KEY: (states[0], None)}}, 1, 2)
    assert torch.equal(loaded["rng"]["torch"], states[0]["torch"])


def test_a_lone_process_resuming_a_two_rank_checkpoint_is_rank_0(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    states = _states(acc, 2)
    torch.save(_stored(states), tmp_path / "c.pt")
    expected = r"2 rank\(s\), but this job has 1: rank 0 gets its own"
    with pytest.warns(RankGeneratorsWarning, match=expected) as record:
        remainder = acc.load(tmp_path / "c.pt", {})
    assert record[0].filename == __file__  # the line that called load
    acc.set_rng_state(remainder["rng"])
    assert torch.equal(torch.get_rng_state(), states[0]["torch"])


def test_the_stored_object_is_left_as_it_was(acc: accel.Accelerator) -> None:
    stored = _stored(_states(acc, 2))
    own_generators(stored, 1, 2)
    assert list(stored["rng"]) == [RECORD_KEY] and list(stored["nested"][0]["gen"]) == [RECORD_KEY]


def test_sharded_placeholders_follow_what_the_checkpoint_holds(acc: accel.Accelerator) -> None:
    plain = {"step": 0, "rng": acc.rng_state(), "other": acc.rng_state()}
    saved = {"accel.plain.step", f"accel.plain.rng.{RECORD_KEY}", "accel.plain.other.torch"}
    placeholders = record_placeholders(plain, saved, "accel.plain")
    assert placeholders["rng"] == {RECORD_KEY: ()}  # saved by several ranks
    assert placeholders["other"] is plain["other"]  # saved by one process: as it is
    assert set(plain["rng"]) == {"python", "numpy", "torch", "device"}
