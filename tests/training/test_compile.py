"""acc.compile: torch.compile with the accelerator's backend (the compile_backend hook),
ties kept, state_dict and save of a compiled model with the plain model's keys."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from helpers.models import TiedLM
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
