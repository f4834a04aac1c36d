"""accel's errors cross process boundaries: pickled (as Ray Train, multiprocessing and
concurrent.futures hand a worker's error back), each comes back whole."""

from __future__ import annotations

import pickle

import pytest

import accel
from accel.distributed import DistributedSetupError

ERRORS = [
    accel.AcceleratorNotFoundError(
        "unknown accelerator 'quantum'.", requested="quantum", known=["cpu"], suggestion=None
    ),
    accel.AcceleratorUnavailableError("no GPU here", accelerator="cuda", reason="no driver"),
    accel.WeightTyingError(
        "ties came apart", count_before=2, count_after=3, broken_groups=[("a", "b")]
    ),
    accel.PluginError("two plugins claim 'npu'", conflicting_names=("npu",)),
    DistributedSetupError("half-set variables", missing=("RANK",)),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_every_error_survives_pickling(error: accel.AcceleratorError) -> None:
    error.add_note("a note from the worker")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)  # the attributes and the notes
    assert copy.__notes__ == ["a note from the worker"]
