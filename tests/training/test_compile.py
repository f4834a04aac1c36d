"""acc.compile: torch.compile with the accelerator's backend (the compile_backend hook),
ties kept, state_dict and save of a compiled model with the plain model's keys."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.training import _compiling as compiling
from helpers import python_device
from helpers.models import TiedLM
from helpers.processes import last_json_line, run_python
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator


class OwnBackend(BareAccelerator):
    """A vendor's accelerator compiling with a backend of its own (a callable)."""

    def __init__(self) -> None:
        super().__init__("vendor")
        self.compiled_graphs = 0

    def backend(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.compiled_graphs += 1
        return graph.forward  # runs the traced graph eagerly

    @accel.hookimpl
    def compile_backend(self) -> Callable[..., Any]:
        return self.backend


def _recording_compile(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def fake_compile(model: Any, **options: Any) -> Any:
        calls.append(options)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    return calls


def test_each_accelerator_compiles_with_its_backend(
    monkeypatch: pytest.MonkeyPatch, meta_tpu: accel.Accelerator
) -> None:
    calls = _recording_compile(monkeypatch)
    model = torch.nn.Linear(2, 2)
    accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu").compile(model)
    isolated_registry(BareAccelerator()).get_accelerator("bare").compile(model, dynamic=False)
    meta_tpu.compile(model, fullgraph=True)
    assert calls == [
        {"backend": "inductor"},  # the CPU: the fallback
        {"backend": "inductor", "dynamic": False},  # a plugin that says nothing
        {"backend": "openxla", "fullgraph": True},  # the TPU plugin
    ]


def test_a_backend_given_overrides_the_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _recording_compile(monkeypatch)
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    cpu.compile(torch.nn.Linear(2, 2), backend="eager", mode=None)
    assert calls == [{"backend": "eager", "mode": None}]


def test_a_plugins_backend_compiles_and_the_output_equals_eager() -> None:
    plugin = OwnBackend()
    acc = isolated_registry(plugin).get_accelerator("vendor")
    torch.manual_seed(0)
    model = TiedLM()
    compiled = acc.compile(model)
    tokens = torch.randint(0, 16, (2, 5))
    torch.testing.assert_close(compiled(tokens), model(tokens), rtol=0, atol=0)
    assert plugin.compiled_graphs == 1  # the backend really compiled the forward


def test_a_compiled_model_keeps_its_ties_and_saves_with_the_plain_keys(tmp_path: Path) -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    model = TiedLM()
    compiled = cpu.compile(model, backend="eager")  # compiling is lazy: no backend runs here
    assert compiled.head.weight is compiled.embed.weight is model.embed.weight
    assert all(key.startswith("_orig_mod.") for key in compiled.state_dict())  # torch's
    state = cpu.state_dict(compiled)
    assert list(state) == list(model.state_dict())
    assert state["head.weight"] is state["embed.weight"]  # the tie stored once
    cpu.save(state, tmp_path / "model.pt")
    fresh = TiedLM()
    fresh.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    torch.testing.assert_close(fresh.embed.weight, model.embed.weight)


def test_compile_refuses_what_it_cannot_compile() -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    with pytest.raises(
        TypeError, match=r"compile expects a torch\.nn\.Module or a function, got str"
    ):
        cpu.compile("model")  # type: ignore[type-var]


def test_a_plugin_naming_no_backend_is_named() -> None:
    class NumberBackend(BareAccelerator):
        @accel.hookimpl
        def compile_backend(self) -> int:
            return 3

    acc = isolated_registry(NumberBackend("numbered")).get_accelerator("numbered")
    with pytest.raises(accel.PluginError, match="expected a backend name or a backend callable"):
        acc.compile(torch.nn.Linear(1, 1))


def test_inductor_output_equals_eager_on_the_cpu_slow() -> None:
    """Slow: inductor generates and builds C++ (a minute on two busy cores); one tiny model."""
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    compiled = cpu.compile(model)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x))


# -- a device inductor has no backend for ------------------------------------------------

_ON_A_DEVICE_WITHOUT_INDUCTOR = """
    import copy, json, warnings
    import torch
    from helpers.python_device import install

    install("pydev")  # a PrivateUse1 backend: torch has kernels for it, inductor no codegen
    import accel

    class PyDev:  # a vendor's plugin naming no compile backend: the fallback's is asked
        @accel.hookimpl
        def register_accelerators(self):
            return [accel.AcceleratorSpec("pydev", unties_weights=True)]

        @accel.hookimpl
        def is_available(self):
            return accel.Availability(True, auto=False)

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(PyDev())
    acc = registry.get_accelerator("pydev")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 1))
    eager = copy.deepcopy(model)
    model = acc.model_to_device(model)
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = acc.compile(model)
        acc.compile(torch.nn.Linear(2, 2))  # the same device type: said once
        out = compiled(acc.batch_to_device(x))
        out.sum().backward()
    eager(x).sum().backward()
    torch.testing.assert_close(out.cpu(), eager(x).detach())
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad.cpu(), dict(eager.named_parameters())[name].grad)
    print(json.dumps({
        "device": str(out.device),
        "grad_device": str(model[0].weight.grad.device),
        "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
    }))
"""


@pytest.mark.skipif(
    not python_device.supported(),
    reason="this torch cannot register a PrivateUse1 backend from Python",
)
def test_compile_runs_forward_and_backward_where_inductor_has_no_backend() -> None:
    """Slow: a fresh process (renaming PrivateUse1 lasts for the process), dynamo and
    AOTAutograd trace forward and backward (about 15 s on two busy cores)."""
    tests = Path(__file__).resolve().parents[1]
    # A fresh interpreter: renaming PrivateUse1 cannot be undone in a process.
    report = last_json_line(
        run_python(_ON_A_DEVICE_WITHOUT_INDUCTOR, env={"PYTHONPATH": str(tests)}, timeout=300)
    )
    assert report["device"] == report["grad_device"] == "pydev:0"
    [(category, message, filename)] = report["warnings"]  # once, for two compiles
    assert category == "PluginWarning"
    assert "inductor has no backend for the device type 'pydev'" in message
    assert "compiles with 'aot_eager'" in message
    assert "register_backend_for_device" in message and "compile_backend hook" in message
    assert filename == "<string>"  # the user's line, not accel's


def test_inductor_stays_where_it_generates_code_and_other_backends_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compiling, "_warned", set())
    for device_type in ("cpu", "meta"):  # inductor keeps meta tensors out of its kernels
        assert compiling.runnable_backend("inductor", torch.device(device_type)) == "inductor"
    no_codegen = torch.device("privateuseone")  # in this process: no backend, no codegen
    assert not compiling.inductor_generates_code_for("privateuseone")
    for chosen in ("eager", "openxla", OwnBackend().backend):
        assert compiling.runnable_backend(chosen, no_codegen) is chosen
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = [compiling.runnable_backend("inductor", no_codegen) for _ in range(2)]
    assert chosen == ["aot_eager", "aot_eager"]
    [warning] = caught  # once per device type
    assert warning.category is accel.PluginWarning and "'privateuseone'" in str(warning.message)
    assert warning.filename == __file__


def test_a_plugin_naming_inductor_for_a_device_without_it_gets_a_backend_that_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NamesInductor(BareAccelerator):
        @accel.hookimpl
        def get_device(self) -> torch.device:
            return torch.device("privateuseone", 0)

        @accel.hookimpl
        def compile_backend(self) -> str:
            return "inductor"

    monkeypatch.setattr(compiling, "_warned", set())
    calls = _recording_compile(monkeypatch)
    acc = isolated_registry(NamesInductor("vendor")).get_accelerator("vendor")
    with pytest.warns(accel.PluginWarning, match="inductor has no backend"):
        acc.compile(torch.nn.Linear(2, 2))
    acc.compile(torch.nn.Linear(2, 2), backend="inductor")  # asked for by name: as asked
    assert calls == [{"backend": "aot_eager"}, {"backend": "inductor"}]
