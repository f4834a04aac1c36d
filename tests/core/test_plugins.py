"""Plugin validation, conflicts, call-time failures and thread-safe first use."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import accel
from accel.plugins import CpuPlugin
from helpers.fakes import FakeAccelerator
from helpers.registries import isolated_registry


def _plugin(**hooks: Any) -> object:
    """A plugin object whose methods are the given hook implementations."""
    methods = {name: staticmethod(accel.hookimpl(fn)) for name, fn in hooks.items()}
    return type("TestPlugin", (), methods)()


def _accelerator_plugin(name: str = "npu", **hooks: Any) -> object:
    base = {
        "register_accelerators": lambda: [accel.AcceleratorSpec(name)],
        "is_available": lambda: accel.Availability(True),
        "get_device": lambda: torch.device("cpu"),
    }
    return _plugin(**{**base, **hooks})


# -- validation at registration ----------------------------------------------------


def test_an_unknown_hook_name_is_rejected_with_a_suggestion() -> None:
    registry = isolated_registry()
    with pytest.raises(accel.PluginError, match=r"unknown hook 'is_availabel'") as info:
        registry.register(_plugin(is_availabel=lambda: True), name="typo")
    assert "Did you mean 'is_available'?" in str(info.value)
    assert "'typo'" in str(info.value)
    # Rejected means not registered: the registry still works and knows nothing of it.
    assert registry.get_accelerator("cpu").name == "cpu"
    assert registry.register(_accelerator_plugin(), name="typo") is None


def test_an_argument_the_hook_does_not_have_is_rejected() -> None:
    registry = isolated_registry()
    plugin = _accelerator_plugin(device_count=lambda accelerator, flavour: 1)
    with pytest.raises(accel.PluginError, match=r"device_count.*flavour") as info:
        registry.register(plugin, name="extra-arg")
    assert "'extra-arg'" in str(info.value)
    with pytest.raises(accel.AcceleratorNotFoundError):
        registry.get_accelerator("npu")


@pytest.mark.parametrize(
    "returned", [None, "npu", 42, [accel.AcceleratorSpec("npu"), "gpu"], {"name": "npu"}]
)
def test_register_accelerators_must_return_specs(returned: object) -> None:
    registry = isolated_registry()
    plugin = _plugin(register_accelerators=lambda: returned)
    with pytest.raises(accel.PluginError, match="must return AcceleratorSpec objects"):
        registry.register(plugin, name="junk")


def test_an_accelerator_torch_has_no_device_type_for_must_implement_get_device() -> None:
    registry = isolated_registry()
    registry.register(
        _plugin(
            register_accelerators=lambda: [accel.AcceleratorSpec("npu")],
            is_available=lambda: accel.Availability(True),
        ),
        name="incomplete",
    )
    with pytest.raises(accel.PluginError, match="implement the get_device hook"):
        registry.get_accelerator("npu")


def test_a_single_spec_is_accepted_without_a_list() -> None:
    registry = isolated_registry()
    registry.register(
        _accelerator_plugin(register_accelerators=lambda: accel.AcceleratorSpec("npu"))
    )
    assert registry.get_accelerator("npu").name == "npu"


@pytest.mark.parametrize(
    ("spec_kwargs", "error", "match"),
    [
        ({"name": "has:colon"}, ValueError, "not a valid accelerator name"),
        ({"name": ""}, ValueError, "not a valid accelerator name"),
        ({"name": 7}, TypeError, "must be a str"),
        ({"name": "npu", "aliases": "ascend"}, TypeError, "tuple of str"),
        ({"name": "npu", "priority": "high"}, TypeError, "priority"),
    ],
)
def test_spec_validation(spec_kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        accel.AcceleratorSpec(**spec_kwargs)


def test_spec_names_are_normalised() -> None:
    spec = accel.AcceleratorSpec(" NPU ", aliases=("Ascend", "npu"))
    assert (spec.name, spec.aliases) == ("npu", ("ascend",))


@pytest.mark.parametrize(
    ("hook", "value", "expected"),
    [
        ("device_count", "2", "int"),
        ("device_count", True, "int"),
        ("get_device", "npu:0", "device"),
        ("distributed_backend", 5, "str"),
    ],
)
def test_a_hook_returning_the_wrong_type_is_reported_naming_the_plugin(
    hook: str, value: object, expected: str
) -> None:
    registry = isolated_registry()
    registry.register(_accelerator_plugin(**{hook: lambda: value}), name="sloppy")
    with pytest.raises(accel.PluginError) as info:
        _backend_of(registry.get_accelerator, "npu")
    message = str(info.value)
    assert f"hook {hook!r}" in message
    assert "plugin 'sloppy'" in message
    assert f"expected {expected}" in message


def _backend_of(get: Any, name: str) -> str:
    backend: str = get(name).distributed_backend
    return backend


def test_is_available_returning_a_bool_makes_it_unavailable_with_the_reason() -> None:
    registry = isolated_registry()
    registry.register(_accelerator_plugin(is_available=lambda: True), name="boolish")
    info = {i.name: i for i in registry.list_accelerators()}["npu"]
    assert not info.available
    assert "plugin 'boolish'" in info.reason and "expected Availability" in info.reason


def test_auto_is_a_reserved_name() -> None:
    registry = isolated_registry()
    with pytest.raises(accel.PluginError, match="'auto' is a reserved name"):
        registry.register(FakeAccelerator("npu", aliases=("auto",)))


def test_an_unhashable_plugin_is_rejected_clearly() -> None:
    import types

    registry = isolated_registry()
    plugin = types.SimpleNamespace(is_available=accel.hookimpl(lambda: None))
    with pytest.raises(accel.PluginError, match="must be hashable"):
        registry.register(plugin)


# -- conflicts --------------------------------------------------------------------


def test_a_plugin_never_silently_replaces_a_builtin() -> None:
    registry = isolated_registry()
    with pytest.raises(accel.PluginError) as info:
        registry.register(FakeAccelerator("cpu"))
    message = str(info.value)
    assert "'cpu' is claimed twice" in message
    assert "from built-in" in message and "helpers.fakes.FakeAccelerator" in message
    assert "override=True" in message
    assert registry.get_accelerator("cpu").device == torch.device("cpu")


def test_an_alias_conflict_names_both_providers() -> None:
    registry = isolated_registry()
    with pytest.raises(accel.PluginError, match=r"'xla' is claimed twice: by 'tpu' from built-in"):
        registry.register(FakeAccelerator("mytpu", aliases=("xla",)))
    assert "mytpu" not in registry.names()


def test_override_replaces_a_builtin_on_purpose() -> None:
    registry = isolated_registry()
    better_cpu = FakeAccelerator("cpu", device="meta")
    registry.register(better_cpu, override=True)
    acc = registry.get_accelerator("cpu")
    assert acc.device == torch.device("meta")
    acc.model_to_device(torch.nn.Linear(1, 1))
    assert better_cpu.calls == ["pre_move_hook", "post_move_hook"]
    providers = {i.name: i.provider for i in registry.list_accelerators()}
    assert providers["cpu"] == "helpers.fakes.FakeAccelerator"


def test_one_provider_may_share_an_alias_among_its_accelerators() -> None:
    registry = isolated_registry(builtins=False)

    class TwoChips:
        @accel.hookimpl
        def register_accelerators(self) -> list[accel.AcceleratorSpec]:
            return [
                accel.AcceleratorSpec("chip-a", aliases=("chip",), priority=2),
                accel.AcceleratorSpec("chip-b", aliases=("chip",), priority=1),
            ]

        @accel.hookimpl
        def is_available(self, accelerator: str) -> accel.Availability:
            return accel.Availability(accelerator == "chip-b")

        @accel.hookimpl
        def get_device(self) -> torch.device:
            return torch.device("cpu")

    registry.register(TwoChips())
    assert registry.get_accelerator("chip").name == "chip-b"  # a is down: the alias falls to b


def test_a_bad_result_is_blamed_without_calling_any_implementation_again() -> None:
    calls: list[str] = []

    def state_dict_as_a_list(model: torch.nn.Module) -> Any:
        calls.append("plugin")
        return list(model.state_dict().values())

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(_accelerator_plugin(state_dict=state_dict_as_a_list), name="listy")
    with pytest.raises(accel.PluginError) as info:
        registry.get_accelerator("npu").state_dict(torch.nn.Linear(2, 2))
    assert calls == ["plugin"]  # once: finding the culprit re-runs nothing
    assert "hook 'state_dict'" in str(info.value) and "plugin 'listy'" in str(info.value)


def test_a_wrapper_among_the_implementations_leaves_the_call_to_pluggy() -> None:
    order: list[str] = []

    class Wrapping:
        @accel.hookimpl(wrapper=True)
        def batch_to_device(self, batch: Any) -> Any:
            order.append("wrapper in")
            result = yield
            order.append("wrapper out")
            return {"wrapped": result}

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(Wrapping(), name="wrapping")
    moved = registry.get_accelerator("cpu").batch_to_device({"x": torch.ones(1)})
    assert order == ["wrapper in", "wrapper out"]
    assert set(moved) == {"wrapped"} and torch.equal(moved["wrapped"]["x"], torch.ones(1))


# -- failures at call time ----------------------------------------------------------


def test_an_exception_in_a_hook_names_the_plugin_and_the_hook() -> None:
    registry = isolated_registry()

    def explode(batch: Any) -> Any:
        raise KeyError("tokens")

    registry.register(_accelerator_plugin(batch_to_device=explode), name="vendor-npu")
    with pytest.raises(KeyError) as info:
        registry.get_accelerator("npu").batch_to_device({"x": torch.ones(1)})
    assert "raised in hook 'batch_to_device' of plugin 'vendor-npu'" in "\n".join(
        info.value.__notes__
    )


def test_a_cross_cutting_hook_failure_names_that_plugin() -> None:
    registry = isolated_registry()

    def refuse(model: torch.nn.Module) -> None:
        raise PermissionError("moves are frozen during the maintenance window")

    registry.register(_plugin(pre_move_hook=refuse), name="policy")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(PermissionError) as info:
        registry.get_accelerator("cpu").model_to_device(model)
    notes = "\n".join(info.value.__notes__)
    assert "hook 'pre_move_hook' of plugin 'policy'" in notes
    assert "restored" in notes


# -- first use from many threads ------------------------------------------------------


def test_first_use_from_32_threads_initialises_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel.plugins

    loads: list[int] = []

    def counting_cpu() -> object:
        loads.append(threading.get_ident())
        threading.Event().wait(0.05)  # widen the window in which a race could happen
        return CpuPlugin()

    builtins = (("cpu", counting_cpu), *accel.plugins.BUILTIN_PLUGINS[1:])
    monkeypatch.setattr(accel.plugins, "BUILTIN_PLUGINS", builtins)
    registry = isolated_registry()
    barrier = threading.Barrier(32)
    results: list[object] = []
    errors: list[BaseException] = []

    def first_use(index: int) -> None:
        try:
            barrier.wait()
            if index % 2:
                results.append(tuple(i.name for i in registry.list_accelerators()))
            else:
                results.append(registry.get_accelerator("cpu").name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(loads) == 1
    assert len(results) == 32
    assert {r for r in results if isinstance(r, tuple)} == {("tpu", "cuda", "mps", "cpu")}
    assert {r for r in results if isinstance(r, str)} == {"cpu"}


def test_a_cpu_plugin_instance_can_serve_two_registries() -> None:
    shared = CpuPlugin()
    first = isolated_registry(builtins=False)
    second = isolated_registry(builtins=False)
    first.register(shared)
    second.register(shared)
    first.unregister(shared)
    assert second.get_accelerator("cpu").name == "cpu"
    with pytest.raises(accel.AcceleratorNotFoundError):
        first.get_accelerator("cpu")
