"""accel's own suite runs the kit on ``tpu``, on XLA:CPU (the XLA tier)."""

from __future__ import annotations

import pytest

from accel.testing.conformance import Limits, Outcome, all_promises, run
from helpers.registries import isolated_registry

pytestmark = pytest.mark.xla

#: One XLA:CPU process per test run here: the kit's two processes would each need their
#: own PJRT runtime; accel's XLA tests launch those with torch_xla's own launcher.
LIMITS = Limits(
    distributed="the kit's two workers start through torchrun's variables, and torch_xla "
    "starts its processes itself (torch_xla.launch); tests/distributed covers XLA there"
)


def test_every_promise_holds_on_xla_but_the_declared_distributed_ones() -> None:
    outcomes = run("tpu", registry=isolated_registry(), limits=LIMITS)
    expected = [
        Outcome(promise.name, "skipped" if "distributed" in promise.needs else "passed")
        for promise in all_promises()
    ]
    assert [(o.promise, o.outcome) for o in outcomes] == [
        (o.promise, o.outcome) for o in expected
    ], [o for o in outcomes if o.outcome == "failed"]
