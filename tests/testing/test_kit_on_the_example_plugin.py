"""accel's own suite runs the kit on the example plugin (examples/accel-example-plugin),
without an Intel GPU: the plugin's own hooks answer, with only the device faked.

``torch.xpu`` is replaced by a stand-in whose work happens on the CPU, and a plugin
asked before the example one says the accelerator is available, on the CPU. What a
CPU cannot stand in for, the run declares, as a vendor would.
"""

from __future__ import annotations

import types

import accel_example_plugin as example  # installed by scripts/test, as in test_entry_points
import pytest
import torch

import accel
from accel.testing.conformance import Limits, Outcome, all_promises, run
from helpers.fakes import Available
from helpers.registries import isolated_registry

#: What this stand-in cannot do, for the kit: Intel's collective library needs the GPUs.
LIMITS = Limits(
    distributed="xccl, the example plugin's backend, needs Intel GPUs; this run fakes "
    "the device on the CPU"
)


class XpuOnTheCpu(Available):
    """Asked before the example plugin: available, one device, which is the CPU."""

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")


@pytest.fixture
def example_registry(monkeypatch: pytest.MonkeyPatch) -> accel.AcceleratorRegistry:
    synced: list[torch.device] = []
    monkeypatch.setattr(torch.xpu, "synchronize", synced.append)
    monkeypatch.setattr(torch.xpu, "memory_allocated", lambda device: 10)
    monkeypatch.setattr(torch.xpu, "max_memory_allocated", lambda device: 20)
    monkeypatch.setattr(
        torch.xpu, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=99)
    )
    monkeypatch.setattr(torch.xpu, "is_bf16_supported", lambda *args, **kwargs: True)
    registry = isolated_registry(builtins=True)
    registry.register(example, name="example")
    registry.register(XpuOnTheCpu(), name="xpu-on-the-cpu")
    return registry


def test_every_promise_the_stand_in_can_keep_holds_on_the_example_plugin(
    example_registry: accel.AcceleratorRegistry,
) -> None:
    outcomes = run("xpu", registry=example_registry, limits=LIMITS)
    skipped = {p.name for p in all_promises() if p.name.startswith("distributed.")}
    assert len(skipped) == 6
    assert [o for o in outcomes if o.promise not in skipped] == [
        Outcome(promise.name, "passed") for promise in all_promises() if promise.name not in skipped
    ]
    assert {o.promise: o.outcome for o in outcomes if o.promise in skipped} == dict.fromkeys(
        skipped, "skipped"
    )
