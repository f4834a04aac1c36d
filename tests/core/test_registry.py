"""Registries: embedding, isolation, dispatch of hooks per accelerator."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest
import torch

import accel
from accel import tying
from helpers.fakes import FakeAccelerator, MetaTpuPlugin, MoveRecorder
from helpers.models import TiedLM


def test_two_registries_never_see_each_others_plugins() -> None:
    first = accel.AcceleratorRegistry(entry_points=None)
    second = accel.AcceleratorRegistry(entry_points=None)
    first.register(FakeAccelerator("npu"))
    assert first.get_accelerator("npu").name == "npu"
    with pytest.raises(accel.AcceleratorNotFoundError):
        second.get_accelerator("npu")
    with pytest.raises(accel.AcceleratorNotFoundError):
        accel.get_accelerator("npu")
    assert "npu" not in {info.name for info in accel.list_accelerators()}


def test_registry_without_builtins_has_only_what_is_registered() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    assert registry.list_accelerators() == []
    registry.register(FakeAccelerator("npu"))
    assert [info.name for info in registry.list_accelerators()] == ["npu"]
    with pytest.raises(accel.AcceleratorNotFoundError):
        registry.get_accelerator("cpu")


def test_unregister_removes_the_accelerator() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    plugin = FakeAccelerator("npu", aliases=("ascend",))
    registry.register(plugin)
    assert registry.get_accelerator("ascend").name == "npu"
    registry.unregister(plugin)
    with pytest.raises(accel.AcceleratorNotFoundError):
        registry.get_accelerator("ascend")


def test_constructing_a_registry_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel.plugins

    calls: list[str] = []

    def counted(name: str, factory: Callable[[], object]) -> Callable[[], object]:
        return lambda: (calls.append(name), factory())[1]

    builtins = tuple(
        (name, counted(name, factory)) for name, factory in accel.plugins.BUILTIN_PLUGINS
    )
    monkeypatch.setattr(accel.plugins, "BUILTIN_PLUGINS", builtins)
    registry = accel.AcceleratorRegistry()
    assert calls == []
    registry.names()
    assert calls == [name for name, _ in builtins]  # each built-in, once, on first use
    assert calls[:4] == ["cpu", "cuda", "mps", "tpu"]


def test_cpu_move_never_reaches_the_tpu_plugins_hooks(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accel.plugins.tpu import TpuPlugin

    reached: list[str] = []

    @accel.hookimpl
    def pre_move_hook(self: object) -> None:
        reached.append("pre")

    @accel.hookimpl
    def post_move_hook(self: object) -> None:
        reached.append("post")

    # The TPU plugin has no move hooks of its own (the handle keeps its ties): add some.
    monkeypatch.setattr(TpuPlugin, "pre_move_hook", pre_move_hook, raising=False)
    monkeypatch.setattr(TpuPlugin, "post_move_hook", post_move_hook, raising=False)
    monkeypatch.setattr(
        TpuPlugin, "is_available", accel.hookimpl(lambda self: accel.Availability(True))
    )
    monkeypatch.setattr(TpuPlugin, "get_device", accel.hookimpl(lambda self: torch.device("meta")))
    monkeypatch.setattr(TpuPlugin, "device_count", accel.hookimpl(lambda self: 1))
    # Registered after patching, so the patched methods are what pluggy calls.
    fresh = accel.AcceleratorRegistry(entry_points=None)
    model = fresh.get_accelerator("cpu").model_to_device(TiedLM())
    assert reached == []
    assert isinstance(model, TiedLM)
    # The same patched hooks do run for a TPU move: the check above can fail.
    fresh.get_accelerator("tpu").model_to_device(TiedLM())
    assert reached == ["pre", "post"]


def test_cpu_move_never_calls_the_tying_code(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for name in ("_scan", "find_tied_parameters", "count_unique_parameters", "retie"):
        original = getattr(tying, name)
        monkeypatch.setattr(
            tying, name, lambda *a, _o=original, _n=name, **k: (calls.append(_n), _o(*a, **k))[1]
        )
    model = TiedLM()
    moved = registry.get_accelerator("cpu").model_to_device(model)
    assert calls == []
    assert moved.head.weight is moved.embed.weight  # and the tie held by itself


def test_tpu_move_does_call_the_tying_code(
    meta_tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    original = tying._scan
    monkeypatch.setattr(
        tying, "_scan", lambda *a, **k: (calls.append("scan"), original(*a, **k))[1]
    )
    meta_tpu.model_to_device(TiedLM())
    # The one check, after the move and the post-move hooks (the groups before it are
    # read from the move's capture, which walks the model itself).
    assert calls == ["scan"]


def test_one_accelerators_hooks_do_not_run_for_another() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    npu, hpu = FakeAccelerator("npu"), FakeAccelerator("hpu")
    registry.register(npu)
    registry.register(hpu)
    registry.get_accelerator("npu").model_to_device(torch.nn.Linear(2, 2))
    registry.get_accelerator("npu").batch_to_device([torch.ones(1)])
    assert npu.calls == ["pre_move_hook", "post_move_hook", "batch_to_device"]
    assert hpu.calls == []
    registry.get_accelerator("cpu").model_to_device(torch.nn.Linear(2, 2))
    assert hpu.calls == [] and len(npu.calls) == 3


def test_a_cross_cutting_plugin_sees_cpu_and_tpu_moves_alike() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    from accel.plugins import CpuPlugin

    registry.register(CpuPlugin())
    registry.register(MetaTpuPlugin())
    recorder = MoveRecorder()
    registry.register(recorder)
    registry.get_accelerator("cpu").model_to_device(TiedLM())
    registry.get_accelerator("tpu").model_to_device(TiedLM())
    assert recorder.moves == [("cpu", "cpu"), ("tpu", "meta")]


def test_plugins_registered_later_join_dispatch() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.get_accelerator("cpu").model_to_device(torch.nn.Linear(1, 1))  # warm the cache
    recorder = MoveRecorder()
    registry.register(recorder)
    registry.get_accelerator("cpu").model_to_device(torch.nn.Linear(1, 1))
    npu = FakeAccelerator("npu")
    registry.register(npu)
    registry.get_accelerator("cpu").model_to_device(torch.nn.Linear(1, 1))
    assert recorder.moves == [("cpu", "cpu"), ("cpu", "cpu")]
    assert npu.calls == []


def test_a_failing_plugin_hook_is_named_in_the_error() -> None:
    class Faulty(FakeAccelerator):
        @accel.hookimpl
        def post_move_hook(self) -> None:
            raise RuntimeError("sensor offline")

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(Faulty("npu"), name="faulty-npu")
    with pytest.raises(RuntimeError, match="sensor offline") as info:
        registry.get_accelerator("npu").model_to_device(torch.nn.Linear(1, 1))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "hook 'post_move_hook' of plugin 'faulty-npu'" in notes
    assert "restored" in notes


def test_a_batch_plugin_registered_after_first_use_is_reached() -> None:
    # batch_to_device skips the hook call while only the fallback would answer;
    # registering a plugin that moves batches must end that shortcut.
    registry = accel.AcceleratorRegistry(entry_points=None)
    acc = registry.get_accelerator("cpu")
    batch = {"x": torch.ones(1)}
    assert acc.batch_to_device(batch)["x"] is batch["x"]

    class Tagging:
        @accel.hookimpl
        def batch_to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, object]:
            return {**batch, "tagged": True}

    registry.register(Tagging())
    assert acc.batch_to_device(batch)["tagged"] is True


# -- registry changes while selecting ------------------------------------------------

STRESS_SECONDS = 4.0


def test_register_and_unregister_while_other_threads_select_raise_only_accels_errors() -> None:
    """One thread registers and unregisters 'npu' (priority above the CPU, with an alias)
    as fast as it can; others select and list meanwhile. 'cpu', 'auto' and listing
    must always work (npu leaving is none of their business); 'npu' and its alias
    may be there or not, but only accel's documented errors say so."""
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.names()  # loaded before the race starts
    stop = threading.Event()
    problems: list[str] = []

    def churn() -> None:
        while not stop.is_set():
            plugin = FakeAccelerator("npu", aliases=("ascend",), priority=50)
            registry.register(plugin)
            registry.unregister(plugin)

    def select(name: str, may_be_missing: bool) -> None:
        while not stop.is_set():
            try:
                chosen = registry.get_accelerator(name).name
                if name in ("cpu", "auto") and chosen not in ("cpu", "npu"):
                    problems.append(f"{name!r} selected {chosen!r}")
            except (accel.AcceleratorNotFoundError, accel.AcceleratorUnavailableError) as exc:
                if not may_be_missing:
                    problems.append(f"{name!r}: {type(exc).__name__}: {exc}")
            except Exception as exc:
                problems.append(f"{name!r}: {type(exc).__name__}: {exc!r}")
            if problems:
                stop.set()

    def listing() -> None:
        while not stop.is_set():
            try:
                names = [info.name for info in registry.list_accelerators()]
                if "cpu" not in names:
                    problems.append(f"listing lacks the CPU: {names}")
                registry.names()
            except Exception as exc:
                problems.append(f"listing: {type(exc).__name__}: {exc!r}")
            if problems:
                stop.set()

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so interleavings happen
    threads = [
        threading.Thread(target=churn),
        threading.Thread(target=select, args=("cpu", False)),
        threading.Thread(target=select, args=("auto", False)),
        threading.Thread(target=select, args=("npu", True)),
        threading.Thread(target=select, args=("ascend", True)),
        threading.Thread(target=listing),
    ]
    try:
        for thread in threads:
            thread.start()
        stop.wait(timeout=STRESS_SECONDS)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        sys.setswitchinterval(before)
    assert not any(thread.is_alive() for thread in threads)
    assert problems == []


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (
            {"plugins": "fakedev"},
            "got a str: 'fakedev' (read as its letters); pass plugins=['fakedev']",
        ),
        ({"plugins": 5}, "plugins must be a list of entry-point or distribution names"),
        ({"plugins": ["ok", 3]}, "plugins must hold names (str), but holds int: 3"),
        ({"autoload": "no"}, "autoload must be True, False or None"),
        ({"entry_points": 5}, "entry_points must be an entry-point group name"),
        ({"builtins": "yes"}, "builtins must be True or False, got str: 'yes'"),
        ({"default_from_env": 1}, "default_from_env must be True, False or None"),
    ],
)
def test_a_constructor_argument_of_the_wrong_type_is_a_type_error_at_once(
    arguments: dict[str, object], says: str
) -> None:
    with pytest.raises(accel.AcceleratorTypeError) as caught:
        accel.AcceleratorRegistry(**arguments)  # type: ignore[arg-type]
    assert says in str(caught.value)


def test_a_blank_entry_point_group_is_a_value_error() -> None:
    with pytest.raises(accel.AcceleratorValueError, match="entry_points is blank"):
        accel.AcceleratorRegistry(entry_points=" ")


def test_an_allow_list_argument_that_matches_nothing_names_the_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ACCEL_PLUGINS", raising=False)
    with pytest.warns(accel.PluginWarning) as caught:
        accel.AcceleratorRegistry(plugins=["fakedev", "other"]).names()
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("the registry's plugins= argument names 'fakedev', 'other', ")
    assert "ACCEL_PLUGINS" not in message
    # Two names: plural.
    assert "no installed accel plugin has any of these entry-point or distribution names" in (
        message
    )


def test_the_variable_is_named_when_the_variable_gave_the_allow_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCEL_PLUGINS", "fakedev")
    with pytest.warns(accel.PluginWarning) as caught:
        accel.AcceleratorRegistry().names()
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("ACCEL_PLUGINS names 'fakedev', but no installed accel plugin has")
    assert "has that entry-point or distribution name;" in message  # one name: singular


def test_registering_one_plugin_object_twice_says_it_is_registered_already() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    plugin = FakeAccelerator("npu")
    registry.register(plugin)
    with pytest.raises(accel.PluginError) as caught:
        registry.register(plugin)
    message = str(caught.value)
    assert "is already registered in this registry" in message
    assert "unregister it first (registry.unregister(plugin))" in message
    assert "ACCEL_PLUGINS" not in message and "Uninstall" not in message


def test_registering_a_second_plugin_for_one_name_in_code_says_what_code_can_do() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(FakeAccelerator("npu"))
    with pytest.raises(accel.PluginError) as caught:
        registry.register(FakeAccelerator("npu"))
    message = str(caught.value)
    assert "accelerator name 'npu' is claimed twice" in message
    assert "unregister the registered plugin first" in message
    assert "pass override=True to replace it on purpose" in message
    # Advice for installed distributions is beside the point in code.
    assert "ACCEL_PLUGINS" not in message and "Uninstall" not in message


def test_a_registry_with_a_group_of_its_own_ignores_accel_accelerator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The user's variable names a plugin of accel's group (installed here: the example
    # plugin's xpu), which a library's private registry does not load.
    monkeypatch.setenv("ACCEL_ACCELERATOR", "xpu")
    private = accel.AcceleratorRegistry(entry_points="mylib.accelerators")
    assert private.get_accelerator() == private.get_accelerator("auto")
    asked = accel.AcceleratorRegistry(entry_points="mylib.accelerators", default_from_env=True)
    with pytest.raises(accel.AcceleratorNotFoundError, match=r"'xpu' in \$ACCEL_ACCELERATOR"):
        asked.get_accelerator()


@pytest.mark.parametrize("entry_points", ["accel", None])
def test_a_registry_of_accels_group_or_none_reads_accel_accelerator(
    monkeypatch: pytest.MonkeyPatch, entry_points: str | None
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "nonsense")
    registry = accel.AcceleratorRegistry(entry_points=entry_points)
    with pytest.raises(accel.AcceleratorNotFoundError, match=r"\$ACCEL_ACCELERATOR"):
        registry.get_accelerator()
    opted_out = accel.AcceleratorRegistry(entry_points=entry_points, default_from_env=False)
    assert opted_out.get_accelerator() == opted_out.get_accelerator("auto")
