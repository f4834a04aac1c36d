"""The kit on a device that unties as every PrivateUse1 backend does (the fake of
tests/helpers/untying_device.py): ties kept both ways, the rollback, batches, the step.

The fake runs no kernels of its own and has no generator module, so only the promises
it can keep are asked for; the real backends run the whole kit in the devices stage.
"""

from __future__ import annotations

from accel.testing.conformance import Outcome, run
from helpers.registries import isolated_registry
from helpers.untying_device import HostMoves, UntyingDevicePlugin

#: What the fake can do: moves, elementwise updates, state on the host. Not
#: batches.failure_named: the fake's host moves intercept ``.to`` before the kit's
#: refusing tensor sees it.
PROMISES = [
    "selection",
    "devices",
    "moves",
    "batches.every_tensor_moved",
    "step.optimizer_step",
    "generators.manual_seed_host",
    "checkpoints.state_dict",
    "runtime.memory_stats",
]


def test_every_promise_the_fake_can_keep_holds_on_an_untying_device() -> None:
    registry = isolated_registry(UntyingDevicePlugin())
    with HostMoves():
        outcomes = run("untying", registry=registry, promises=PROMISES)
    assert [o for o in outcomes if o.outcome != "passed"] == []
    assert Outcome("moves.ties_kept_back_to_cpu", "passed") in outcomes
    assert len(outcomes) == 14  # 2 selection + 2 devices + 5 moves + 5 more
