"""Every device type torch drives is an accelerator without a plugin, and ``tpu``
follows the TPU to TorchTPU.

The devices are real PrivateUse1 backends registered from Python
(tests/helpers/python_device.py), each in a process of its own: renaming PrivateUse1
lasts for the process. ``tpu`` stands in for TorchTPU (``torch-tpu`` registers its
device only on a TPU); what that does and does not prove is in docs/tpu.md.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.plugins.torch_device import NO_PLUGIN, PRIORITY, TorchDevicePlugin, torch_device_types
from helpers import python_device
from helpers.processes import last_json_line, run_python

needs_python_backend = pytest.mark.skipif(
    not python_device.supported(),
    reason="this torch cannot register a PrivateUse1 backend from Python (torch 2.10+ can)",
)

_PRELUDE = """
    import json, sys, warnings
    import torch
    from torch import nn
    from helpers.python_device import install

    install(sys.argv[1])
    import accel

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 4)
            self.head = nn.Linear(4, 5, bias=False)
            self.head.weight = self.embed.weight

    def there_and_back(acc):
        model = Tied()
        before = model.embed.weight.detach().clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model = acc.model_to_device(model, optimizer=optimizer)
        there = [model.embed.weight.device.type, model.head.weight is model.embed.weight,
                 len(list(model.parameters())),
                 any(p is model.embed.weight for p in optimizer.param_groups[0]["params"])]
        model = accel.get_accelerator("cpu").model_to_device(model, optimizer=optimizer)
        back = [model.embed.weight.device.type, model.head.weight is model.embed.weight,
                len(list(model.parameters())), bool(torch.equal(model.embed.weight, before)),
                any(p is model.embed.weight for p in optimizer.param_groups[0]["params"])]
        return {"there": there, "back": back}

    def row(name):
        found = [r for r in accel.list_accelerators() if r.name == name]
        return found and {"provider": found[0].provider, "available": found[0].available,
                          "priority": found[0].priority, "aliases": list(found[0].aliases)}
"""

_A_DEVICE = """
    from accel.testing.conformance import Limits, run

    name = sys.argv[1]
    acc = accel.get_accelerator(name)
    result = {
        "row": row(name),
        "device": str(acc.device),
        "backend": acc.distributed_backend,
        "memory": acc.memory_stats(),
        "auto": accel.get_accelerator("auto").name,
        "moves": there_and_back(acc),
    }
    limits = Limits(
        autocast="the stand-in's device module has no AMP functions",
        distributed="the stand-in backend exists in this process only",
    )
    outcomes = run(name, limits=limits)
    result["kit"] = {o.promise: [o.outcome, o.reason] for o in outcomes}

    class VendorPlugin:  # the device's own plugin, registered after accel's stand-in
        @accel.hookimpl
        def register_accelerators(self):
            return [accel.AcceleratorSpec(name, description="the vendor's own")]

        @accel.hookimpl
        def is_available(self):
            return accel.Availability(True)

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.get_accelerator(name)  # the stand-in exists first
    registry.register(VendorPlugin())
    vendor = [r for r in registry.list_accelerators() if r.name == name][0]
    result["vendor"] = {"description": vendor.description, "provider": vendor.provider}
    print(json.dumps(result))
"""

_TORCHTPU = """
    import io
    from contextlib import redirect_stdout
    import torch._dynamo
    from accel.tools.cli import main

    compiled_graphs = []

    @torch._dynamo.register_backend(name="tpu")  # as torch_tpu._internal.compile does
    def tpu_backend(graph, example_inputs):
        compiled_graphs.append(graph)
        return graph.forward

    acc = accel.get_accelerator("tpu")
    result = {"row": row("tpu"), "xla_row": row("xla"), "device": str(acc.device)}
    try:
        accel.get_accelerator("xla")
    except accel.AcceleratorUnavailableError as exc:
        result["xla"] = str(exc)
    result["moves"] = there_and_back(acc)

    class DropsTheHead:  # a cross-cutting plugin whose move loses half of a tied group
        @accel.hookimpl
        def model_to_device(self, model, device):
            if device.type != "tpu":
                return None
            return nn.ModuleDict({"embed": nn.Embedding(5, 4).to(device)})

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(DropsTheHead())
    model = Tied()
    embed = model.embed.weight
    try:
        registry.get_accelerator("tpu").model_to_device(model)
    except accel.WeightTyingError as exc:
        result["tying_error"] = str(exc)
    result["restored"] = [model.embed.weight is embed, model.head.weight is embed,
                          model.embed.weight.device.type]
    compiled = acc.compile(acc.model_to_device(nn.Linear(3, 2)))
    result["compiled_output"] = list(compiled(torch.ones(1, 3, device=acc.device)).shape)
    result["compiled_graphs"] = len(compiled_graphs)
    listing = io.StringIO()
    with redirect_stdout(listing):
        main(["list"])
    result["listing"] = listing.getvalue()
    print(json.dumps(result))
"""


def _run(script: str, device_type: str) -> dict[str, Any]:
    tests = Path(__file__).resolve().parents[1]
    # A fresh interpreter: renaming PrivateUse1 cannot be undone in a process.
    done = run_python(
        ["-c", _dedent(_PRELUDE) + _dedent(script), device_type],
        env={"PYTHONPATH": str(tests)},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return last_json_line(done)


def _dedent(code: str) -> str:
    return textwrap.dedent(code)


@needs_python_backend
def test_a_privateuse1_device_is_an_accelerator_that_keeps_ties_and_passes_the_kit() -> None:
    result = _run(_A_DEVICE, "npu")

    assert result["row"] == {
        "provider": NO_PLUGIN,
        "available": True,
        "priority": PRIORITY,
        "aliases": [],
    }
    assert result["device"] == "npu:0"
    assert result["backend"] == "gloo"  # torch names no collective backend for it
    assert result["memory"] == {
        "allocated_bytes": None,
        "peak_allocated_bytes": None,
        "total_bytes": None,
    }
    assert result["auto"] == "npu"  # above the CPU in "auto"
    assert result["moves"]["there"] == ["npu", True, 1, True]
    assert result["moves"]["back"] == ["cpu", True, 1, True, True]
    failed = {p: o for p, o in result["kit"].items() if o[0] == "failed"}
    assert failed == {}
    skipped = {p for p, o in result["kit"].items() if o[0] == "skipped"}
    assert skipped and all(p.startswith(("step.", "distributed.")) for p in skipped)
    assert "moves.ties_kept_to_device" in result["kit"]
    vendor = {"description": "the vendor's own", "provider": "__main__.VendorPlugin"}
    assert result["vendor"] == vendor  # the device's own plugin took the stand-in's place


@needs_python_backend
def test_tpu_follows_the_tpu_to_torchtpu_and_xla_names_torch_xla() -> None:
    result = _run(_TORCHTPU, "tpu")

    assert result["row"]["provider"] == NO_PLUGIN and result["row"]["available"]
    assert result["device"] == "tpu:0"
    assert result["xla_row"]["provider"] == "built-in" and result["xla_row"]["aliases"] == []
    assert "torch_xla is not installed" in result["xla"]
    assert result["moves"]["there"] == ["tpu", True, 1, True]
    assert result["moves"]["back"] == ["cpu", True, 1, True, True]
    # The layer count and the groups: a tie broken after the move is an error, and the
    # model is as it was.
    assert "head.weight" in result["tying_error"] and "embed.weight" in result["tying_error"]
    assert result["restored"] == [True, True, "cpu"]
    assert result["compiled_output"] == [1, 2]
    assert result["compiled_graphs"] >= 1  # TorchTPU's own compile backend was used
    lines = {line.split()[0]: line for line in result["listing"].splitlines() if line.strip()}
    assert NO_PLUGIN in lines["tpu"] and "built-in" in lines["xla"]


def test_torch_device_types_names_the_renamed_privateuse1_backend_and_no_builtin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "privateuseone")
    assert "privateuseone" not in torch_device_types()
    assert not {"cpu", "cuda", "mps", "xla", "meta"} & set(torch_device_types())
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")
    assert torch_device_types()[0] == "npu"


def test_a_device_without_a_plugin_is_listed_with_no_plugin_as_its_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")
    registry = accel.AcceleratorRegistry(entry_points=None)
    rows = {row.name: row for row in registry.list_accelerators()}
    # No torch.npu module is registered here: listed, unavailable, saying what to do.
    assert rows["npu"].provider == NO_PLUGIN and not rows["npu"].available
    assert "torch.npu" in rows["npu"].reason and "import the backend" in rows["npu"].remedy
    with pytest.raises(accel.AcceleratorUnavailableError, match=r"torch\.npu"):
        registry.get_accelerator("npu")


def test_a_plugin_registered_in_code_replaces_the_stand_in_for_its_device_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")

    class NpuPlugin:
        @accel.hookimpl
        def register_accelerators(self) -> list[accel.AcceleratorSpec]:
            return [accel.AcceleratorSpec("npu", description="Ascend, by its vendor")]

        @accel.hookimpl
        def is_available(self) -> accel.Availability:
            return accel.Availability(False, reason="no Ascend driver")

    registry = accel.AcceleratorRegistry(entry_points=None)
    assert registry.list_accelerators()[0].name != "npu"  # loaded, stand-in present
    registry.register(NpuPlugin())
    rows = [row for row in registry.list_accelerators() if row.name == "npu"]
    assert len(rows) == 1 and rows[0].description == "Ascend, by its vendor"


def test_a_backend_renamed_after_loading_is_added_at_the_next_selection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    assert "hpu" not in registry.names() and "mtia0" not in registry.names()
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "latecomer")
    assert "latecomer" in [row.name for row in registry.list_accelerators()]


def test_the_stand_in_turns_a_backend_refusal_into_an_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Refusing:
        @staticmethod
        def is_available() -> bool:
            raise RuntimeError("Allocator for npu is not a DeviceAllocator")

        @staticmethod
        def device_count() -> int:
            raise RuntimeError("internal assert")

    monkeypatch.setattr(torch, "get_device_module", lambda device_type: Refusing)
    plugin = TorchDevicePlugin("npu")
    assert plugin.is_available().available  # refused: unknown, not a crash
    assert plugin.device_count() == 1
    assert plugin.distributed_backend() == "gloo"
