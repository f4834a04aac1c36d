"""Who a bad answer is blamed on: the plugin that gave it, or, where a wrapper may have
changed it, every plain implementation that may have, in pluggy's call order."""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

import pytest
import torch

import accel
from helpers.fakes import FakeAccelerator


class _ListyNpu(FakeAccelerator):
    @accel.hookimpl
    def state_dict(self, model: torch.nn.Module) -> Any:
        return list(model.state_dict().values())


class _Passes:
    """A cross-cutting plain implementation that gives no answer."""

    @accel.hookimpl
    def state_dict(self, model: torch.nn.Module) -> Any:
        return None


class _Wraps:
    @accel.hookimpl(wrapper=True)
    def state_dict(self, model: torch.nn.Module) -> Generator[None, Any, Any]:
        return (yield)


def _refusal(*plugins: tuple[object, str]) -> str:
    registry = accel.AcceleratorRegistry(entry_points=None)
    for plugin, name in plugins:
        registry.register(plugin, name=name)
    with pytest.raises(accel.PluginError) as info:
        registry.get_accelerator("npu").state_dict(torch.nn.Linear(2, 2))
    return str(info.value)


def test_a_bad_answer_names_the_plugin_that_gave_it() -> None:
    message = _refusal((_ListyNpu("npu"), "listy"), (_Passes(), "passes"))
    assert re.search(r"from plugin 'listy' \([^)]*_ListyNpu\)\. ", message), message


def test_behind_a_wrapper_every_plain_implementation_that_may_have_answered_is_named() -> None:
    message = _refusal((_ListyNpu("npu"), "listy"), (_Passes(), "passes"), (_Wraps(), "wraps"))
    # Registered later, asked first; the wrapper and accel's fallback are not named.
    named = r"from plugin 'passes' \([^)]*_Passes\) or 'listy' \([^)]*_ListyNpu\)\. "
    assert re.search(named, message), message


def test_an_answer_of_the_fallback_alone_names_the_fallback() -> None:
    class Wrong(FakeAccelerator):
        @accel.hookimpl(wrapper=True)
        def state_dict(self, model: torch.nn.Module) -> Generator[None, Any, Any]:
            yield
            return ["not", "a", "dict"]

    assert "from accel's built-in fallback." in _refusal((Wrong("npu"), "wrong"))


def test_an_exception_is_blamed_on_the_innermost_implementation_only() -> None:
    class Raises(FakeAccelerator):
        @accel.hookimpl
        def state_dict(self, model: torch.nn.Module) -> Any:
            raise RuntimeError("device lost")

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(Raises("npu"), name="raises")
    registry.register(_Wraps(), name="wraps")
    with pytest.raises(RuntimeError, match="device lost") as info:
        registry.get_accelerator("npu").state_dict(torch.nn.Linear(2, 2))
    blame = [n for n in info.value.__notes__ if n.startswith("raised in hook")]
    assert len(blame) == 1 and "plugin 'raises'" in blame[0], blame


def test_a_move_that_returns_no_module_is_refused_naming_the_plugin() -> None:
    class MovesToAList(FakeAccelerator):
        @accel.hookimpl
        def model_to_device(self, model: torch.nn.Module) -> Any:
            return [model]

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(MovesToAList("npu"), name="lists")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(accel.PluginError) as info:
        registry.get_accelerator("npu").model_to_device(model)
    message = str(info.value)
    assert "hook 'model_to_device' for accelerator 'npu' returned list, not a torch.nn.Module" in (
        message
    )
    assert re.search(r"from plugin 'lists' \([^)]*MovesToAList\)\. ", message), message
