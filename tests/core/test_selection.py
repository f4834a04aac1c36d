"""Selecting accelerators by name, alias, index, environment and "auto"."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
import torch

import accel
from accel.plugins.gpu import CudaPlugin, MpsPlugin
from helpers.fakes import FakeAccelerator
from helpers.registries import isolated_registry

BUILTIN_NAMES = {
    "cpu": "cpu",
    "cuda": "cuda",
    "gpu": "cuda",
    "mps": "mps",
    "tpu": "tpu",
    "xla": "tpu",
}


@pytest.mark.parametrize(("name", "canonical"), BUILTIN_NAMES.items())
def test_every_builtin_name_and_alias_resolves_to_its_accelerator(
    registry: accel.AcceleratorRegistry, name: str, canonical: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "gpu" means mps only where cuda is missing; pin that down for this test.
    monkeypatch.setattr(MpsPlugin, "is_available", _unavailable_hook)
    try:
        acc = registry.get_accelerator(name)
    except accel.AcceleratorUnavailableError as exc:
        assert exc.accelerator == canonical
    else:
        assert acc.name == canonical


def test_listing_shows_every_builtin_with_aliases(registry: accel.AcceleratorRegistry) -> None:
    infos = {info.name: info for info in registry.list_accelerators()}
    assert set(infos) == {"cpu", "cuda", "mps", "tpu"}
    assert infos["cuda"].aliases == ("gpu",)
    assert infos["mps"].aliases == ("gpu",)
    assert infos["tpu"].aliases == ("xla",)
    assert infos["cpu"].available and infos["cpu"].device_count == 1
    assert {info.provider for info in infos.values()} == {"built-in"}
    for info in infos.values():
        assert info.available or info.reason, f"{info.name} unavailable without a reason"
        assert info.description


@pytest.mark.parametrize("name", ["cpu", "CPU", "  cpu ", "\tCpU\n", "cpu:0", " CPU : 0 "])
def test_names_are_case_insensitive_and_stripped(
    registry: accel.AcceleratorRegistry, name: str
) -> None:
    acc = registry.get_accelerator(name)
    assert acc.name == "cpu"
    assert acc.device == torch.device("cpu")


def test_index_is_kept_on_the_handle(registry: accel.AcceleratorRegistry) -> None:
    assert registry.get_accelerator("cpu:0").index == 0
    assert registry.get_accelerator("cpu").index is None


def test_index_beyond_device_count_is_unavailable(registry: accel.AcceleratorRegistry) -> None:
    with pytest.raises(accel.AcceleratorUnavailableError, match=r"index 1.*1 device") as info:
        registry.get_accelerator("cpu:1")
    assert "The CPU accelerator has one device: use 'cpu'." in str(info.value)
    assert "VISIBLE_DEVICES" not in str(info.value)  # the CPU has no visibility variable


def test_index_checked_against_a_plugins_device_count() -> None:
    registry = isolated_registry(FakeAccelerator("npu", count=4))
    assert registry.get_accelerator("npu:3").index == 3
    with pytest.raises(accel.AcceleratorUnavailableError, match="'npu:0' to 'npu:3'") as info:
        registry.get_accelerator("npu:4")
    assert "VISIBLE_DEVICES" not in str(info.value)  # accel knows no variable of npu's


def test_index_beyond_cudas_device_count_names_its_visibility_variable() -> None:
    registry = isolated_registry()
    registry.register(FakeAccelerator("cuda", count=2), override=True)
    with pytest.raises(accel.AcceleratorUnavailableError, match="CUDA_VISIBLE_DEVICES"):
        registry.get_accelerator("cuda:2")


@pytest.mark.parametrize("name", ["cpu:x", "cpu:-1", "cpu:", "cpu:1.5", "cpu:0:0"])
def test_malformed_index_is_a_value_error(registry: accel.AcceleratorRegistry, name: str) -> None:
    with pytest.raises(ValueError, match="bad device index"):
        registry.get_accelerator(name)


@pytest.mark.parametrize("name", ["", "   ", "\n"])
def test_empty_name_is_a_value_error(registry: accel.AcceleratorRegistry, name: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        registry.get_accelerator(name)


@pytest.mark.parametrize("name", [0, 1.5, b"cpu", ["cpu"], torch.device("cpu")])
def test_non_string_name_is_a_type_error(registry: accel.AcceleratorRegistry, name: object) -> None:
    with pytest.raises(TypeError, match=r"must be a name \(a str such as"):
        registry.get_accelerator(name)  # type: ignore[arg-type]


def test_auto_takes_no_index(registry: accel.AcceleratorRegistry) -> None:
    with pytest.raises(ValueError, match="'auto' takes no device index"):
        registry.get_accelerator("auto:0")


def test_unknown_name_lists_known_names_and_the_closest(
    registry: accel.AcceleratorRegistry,
) -> None:
    with pytest.raises(accel.AcceleratorNotFoundError) as info:
        registry.get_accelerator("cdua")
    error = info.value
    assert isinstance(error, LookupError)
    assert isinstance(error, accel.AcceleratorError)
    assert error.suggestion == "cuda"
    assert "Did you mean 'cuda'?" in str(error)
    for known in ("auto", "cpu", "cuda", "gpu", "mps", "tpu", "xla"):
        assert known in error.known
        assert known in str(error)


def test_unknown_name_far_from_everything_has_no_suggestion(
    registry: accel.AcceleratorRegistry,
) -> None:
    with pytest.raises(accel.AcceleratorNotFoundError) as info:
        registry.get_accelerator("quantum")
    assert info.value.suggestion is None
    assert "Did you mean" not in str(info.value)


def test_unavailable_accelerator_says_why_and_what_to_do() -> None:
    registry = isolated_registry(FakeAccelerator("npu", available=False))
    with pytest.raises(accel.AcceleratorUnavailableError) as info:
        registry.get_accelerator("npu")
    assert isinstance(info.value, RuntimeError)
    assert info.value.accelerator == "npu"
    assert "fake says no" in str(info.value)
    assert "accel list" in str(info.value)


@accel.hookimpl
def _unavailable_hook(self: object) -> accel.Availability:
    return accel.Availability(False, reason="switched off by the test", remedy="nothing")


@accel.hookimpl
def _available_hook(self: object) -> accel.Availability:
    return accel.Availability(True)


def test_gpu_alias_means_mps_on_a_machine_with_mps_instead(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CudaPlugin, "is_available", _unavailable_hook)
    monkeypatch.setattr(MpsPlugin, "is_available", _available_hook)
    acc = registry.get_accelerator("gpu")
    assert acc.name == "mps"
    assert acc.device == torch.device("mps", 0)


def test_gpu_alias_prefers_cuda_when_both_exist(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CudaPlugin, "is_available", _available_hook)
    monkeypatch.setattr(MpsPlugin, "is_available", _available_hook)
    monkeypatch.setattr(CudaPlugin, "device_count", accel.hookimpl(lambda self: 2))
    assert registry.get_accelerator("gpu").name == "cuda"
    assert registry.get_accelerator("gpu:1").device == torch.device("cuda", 1)


def test_gpu_alias_with_no_gpu_explains_both(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CudaPlugin, "is_available", _unavailable_hook)
    monkeypatch.setattr(MpsPlugin, "is_available", _unavailable_hook)
    with pytest.raises(accel.AcceleratorUnavailableError, match="'mps' is not available either"):
        registry.get_accelerator("gpu")


def test_environment_variable_picks_the_default(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.register(FakeAccelerator("npu", priority=-5))
    monkeypatch.setenv("ACCEL_ACCELERATOR", " NPU ")
    assert registry.get_accelerator().name == "npu"
    # An explicit name wins over the environment.
    assert registry.get_accelerator("cpu").name == "cpu"


def test_environment_variable_with_unknown_name_says_where_it_came_from(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "nonsense")
    with pytest.raises(accel.AcceleratorNotFoundError, match=r"\$ACCEL_ACCELERATOR"):
        registry.get_accelerator()


def test_environment_variable_with_bad_index_says_where_it_came_from(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "cpu:zero")
    with pytest.raises(ValueError, match=r"read from \$ACCEL_ACCELERATOR"):
        registry.get_accelerator()


@pytest.mark.parametrize("value", ["", "   "])
def test_blank_environment_variable_means_auto(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    registry.register(FakeAccelerator("npu", priority=1000))
    monkeypatch.setenv("ACCEL_ACCELERATOR", value)
    assert registry.get_accelerator().name == "npu"


def test_auto_picks_the_highest_priority_available() -> None:
    registry = isolated_registry(
        FakeAccelerator("low", priority=10),
        FakeAccelerator("high", priority=1000),
        FakeAccelerator("higher_but_down", priority=5000, available=False),
        FakeAccelerator("higher_not_auto", priority=6000, auto=False),
    )
    assert registry.get_accelerator("auto").name == "high"
    assert registry.get_accelerator().name == "high"


def test_auto_breaks_priority_ties_by_registration_order() -> None:
    registry = isolated_registry(
        FakeAccelerator("first", priority=7), FakeAccelerator("second", priority=7), builtins=False
    )
    assert registry.get_accelerator("auto").name == "first"


def test_auto_falls_back_to_cpu_when_nothing_else_is_available(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CudaPlugin, "is_available", _unavailable_hook)
    monkeypatch.setattr(MpsPlugin, "is_available", _unavailable_hook)
    assert registry.get_accelerator("auto").name == "cpu"


def test_auto_with_nothing_available_explains_each() -> None:
    registry = isolated_registry(FakeAccelerator("npu", available=False), builtins=False)
    with pytest.raises(accel.AcceleratorUnavailableError, match="npu: fake says no"):
        registry.get_accelerator("auto")


def test_auto_with_nothing_available_but_builtins_registered_does_not_ask_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The built-in CPU replaced on purpose by an unavailable one, and no GPU here.
    monkeypatch.setattr(CudaPlugin, "is_available", _unavailable_hook)
    monkeypatch.setattr(MpsPlugin, "is_available", _unavailable_hook)
    registry = isolated_registry()
    registry.register(FakeAccelerator("cpu", available=False), override=True)
    with pytest.raises(accel.AcceleratorUnavailableError) as info:
        registry.get_accelerator("auto")
    message = str(info.value)
    assert "cpu: fake says no" in message
    assert "Register the built-in plugins" not in message
    assert "Install (or fix) a plugin for an accelerator this machine has" in message


def test_handle_reports_backend_count_and_availability(
    registry: accel.AcceleratorRegistry,
) -> None:
    acc = registry.get_accelerator("cpu")
    assert acc.distributed_backend == "gloo"
    assert acc.device_count() == 1
    assert acc.is_available() is True
    assert repr(acc) == "Accelerator(name='cpu', device='cpu')"


def test_builtin_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.plugins import CudaPlugin, MpsPlugin, TpuPlugin

    assert CudaPlugin().distributed_backend() == "nccl"
    assert MpsPlugin().distributed_backend() == "cpu:gloo"  # no backend carries MPS tensors
    assert TpuPlugin().distributed_backend() == "xla"


def test_tie_check_is_validated(registry: accel.AcceleratorRegistry) -> None:
    with pytest.raises(ValueError, match="tie_check must be one of"):
        registry.get_accelerator("cpu", tie_check="sometimes")  # type: ignore[arg-type]
    acc = registry.get_accelerator("cpu", tie_check="warn")
    assert acc.tie_check == "warn"
    acc.tie_check = "off"
    assert acc.tie_check == "off"
    with pytest.raises(ValueError, match="tie_check"):
        acc.tie_check = "loud"  # type: ignore[assignment]


def test_module_level_functions_use_one_lazy_default_registry() -> None:
    assert accel.default_registry() is accel.default_registry()
    assert accel.get_accelerator("cpu").name == "cpu"
    assert "cpu" in {info.name for info in accel.list_accelerators()}


@pytest.mark.parametrize("reverse", [False, True], ids=["installed-a-first", "installed-b-first"])
def test_auto_and_the_listing_do_not_depend_on_install_order(
    monkeypatch: pytest.MonkeyPatch, reverse: bool
) -> None:
    group = "accel-ordering-test"
    found = [
        importlib.metadata.EntryPoint("beta", "helpers.ordering_plugins:BetaPlugin", group),
        importlib.metadata.EntryPoint("alpha", "helpers.ordering_plugins:AlphaPlugin", group),
    ]
    real = importlib.metadata.entry_points

    def entry_points(**params: Any) -> Any:
        if params.get("group") == group:
            return found[::-1] if reverse else found  # as sys.path order would give them
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry = accel.AcceleratorRegistry(entry_points=group)

    # Equal priorities: the canonical name breaks the tie, whatever the order found.
    assert registry.get_accelerator("auto").name == "alpha"
    names = [info.name for info in registry.list_accelerators()]
    assert [name for name in names if name in ("alpha", "beta")] == ["alpha", "beta"]


# -- Unicode names -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["\uff43\uff50\uff55", "\uff23\uff30\uff35", "ｃpu "])
def test_full_width_names_are_the_letters_they_stand_for(
    registry: accel.AcceleratorRegistry, name: str
) -> None:
    assert registry.get_accelerator(name).name == "cpu"


def test_a_spec_name_in_full_width_is_normalised_too() -> None:
    assert accel.AcceleratorSpec("\uff4e\uff50\uff55").name == "npu"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("c\u0440u", "'р' (U+0440 CYRILLIC SMALL LETTER ER) at position 2 where 'cpu' has 'p'"),
        ("\u0441pu", "'с' (U+0441 CYRILLIC SMALL LETTER ES) at position 1 where 'cpu' has 'c'"),
        ("t\u03c1u", "'ρ' (U+03C1 GREEK SMALL LETTER RHO) at position 2 where 'tpu' has 'p'"),
    ],
)
def test_a_look_alike_character_is_pointed_at(
    registry: accel.AcceleratorRegistry, name: str, shown: str
) -> None:
    with pytest.raises(accel.AcceleratorNotFoundError) as info:
        registry.get_accelerator(name)
    assert f"{name!r} has {shown}." in str(info.value)


def test_a_plain_typo_gets_no_character_note(registry: accel.AcceleratorRegistry) -> None:
    with pytest.raises(accel.AcceleratorNotFoundError) as info:
        registry.get_accelerator("cpuu")
    assert "Did you mean 'cpu'? Known names" in str(info.value)


def test_a_superscript_index_stays_an_error(registry: accel.AcceleratorRegistry) -> None:
    with pytest.raises(ValueError, match="bad device index"):
        registry.get_accelerator("cpu:\u00b2")  # NFKC would make it '2'


def test_auto_with_an_index_from_the_environment_names_the_variable(
    registry: accel.AcceleratorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "auto:0")
    with pytest.raises(ValueError, match=r"\(got 'auto:0' in \$ACCEL_ACCELERATOR\)"):
        registry.get_accelerator()


def test_auto_passes_over_a_plugin_whose_device_count_raises() -> None:
    class Flaky(FakeAccelerator):
        @accel.hookimpl
        def device_count(self) -> int:
            raise OSError("smi gone")

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(Flaky("npu", priority=500))
    registry.register(FakeAccelerator("second", priority=400))
    assert registry.get_accelerator("auto").name == "second"
    rows = {row.name: row for row in registry.list_accelerators()}
    assert rows["npu"].reason == "device_count failed: OSError: smi gone"
    with pytest.raises(OSError, match="smi gone"):
        registry.get_accelerator("npu")  # by name: the plugin's own error


class _RecordingNpu(FakeAccelerator):
    """Records its probes and devices: asking for the backend must need neither."""

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        self.calls.append("is_available")
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        self.calls.append("get_device")
        return torch.device("cpu")

    @accel.hookimpl
    def distributed_backend(self) -> str:
        return "hccl"


def test_distributed_backends_come_from_declarations_without_probing_or_a_device() -> None:
    npu = _RecordingNpu("npu", aliases=("ascend",))
    registry = isolated_registry(npu)
    assert registry.distributed_backends("ASCEND:0") == {"npu": "hccl"}
    assert registry.distributed_backends("gpu") == {"cuda": "nccl", "mps": "cpu:gloo"}
    assert registry.distributed_backends("cpu") == {"cpu": "gloo"}
    assert npu.calls == []
    registry.get_accelerator("npu")  # the recording works: selecting probes
    assert npu.calls == ["is_available", "get_device"]
    with pytest.raises(ValueError, match="'auto' is decided by probing the machine"):
        registry.distributed_backends("auto")
    with pytest.raises(accel.AcceleratorNotFoundError, match="unknown accelerator 'npx'"):
        registry.distributed_backends("npx")


class _NonsenseDevice(FakeAccelerator):
    @accel.hookimpl
    def get_device(self, index: int | None) -> Any:
        return "npu:0"  # a string, not a torch.device


class _RaisingDevice(FakeAccelerator):
    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        raise RuntimeError("driver says no")


def test_auto_passes_over_a_plugin_whose_get_device_returns_nonsense_or_raises() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(_NonsenseDevice("npu", priority=500))
    registry.register(_RaisingDevice("npx", priority=450))
    registry.register(FakeAccelerator("second", priority=400))
    assert registry.get_accelerator("auto").name == "second"
    rows = {row.name: row for row in registry.list_accelerators()}
    assert not rows["npu"].available and not rows["npx"].available
    assert rows["npu"].reason.startswith(
        "get_device failed: PluginError: hook 'get_device' for accelerator 'npu' returned "
        "str ('npu:0'); expected device"
    )
    assert rows["npx"].reason == "get_device failed: RuntimeError: driver says no"
    assert "report this to its authors" in rows["npu"].remedy
    assert rows["second"].available
    with pytest.raises(accel.PluginError, match="returned str"):
        registry.get_accelerator("npu")  # by name: the error itself
    with pytest.raises(RuntimeError, match="driver says no"):
        registry.get_accelerator("npx")


def test_a_reason_ending_in_a_period_gets_no_second_one() -> None:
    class AnswersTrue(FakeAccelerator):
        @accel.hookimpl
        def is_available(self) -> Any:
            return True  # not an Availability: the reason is a sentence of its own

    registry = isolated_registry(AnswersTrue("npu"))
    with pytest.raises(accel.AcceleratorUnavailableError) as info:
        registry.get_accelerator("npu")
    message = str(info.value)
    assert "Report this to the plugin's authors. To use it: fix the plugin" in message
    assert ".." not in message


# -- "a handle or a name": one rule, the registry's ------------------------------------


def test_a_registry_returns_its_own_handle_and_refuses_another_registrys() -> None:
    mine, other = isolated_registry(), isolated_registry()
    handle = mine.get_accelerator("cpu")
    assert mine.get_accelerator(handle) is handle
    with pytest.raises(accel.AcceleratorValueError, match="belongs to another registry"):
        other.get_accelerator(handle)
    # Without a registry, a handle is used as it is, whichever registry selected it.
    assert accel.get_accelerator(handle) is handle


def test_every_handle_or_name_argument_follows_the_registrys_rule() -> None:
    import accel.distributed._devices as devices
    from accel.integrations.lightning import AccelAccelerator

    mine, other = isolated_registry(), isolated_registry()
    handle = mine.get_accelerator("cpu")
    assert devices.resolve_accelerator(handle, mine) is handle
    assert devices.resolve_accelerator(handle, None) is handle
    assert AccelAccelerator(handle, registry=mine).handle() is handle
    with pytest.raises(accel.AcceleratorValueError, match="belongs to another registry"):
        devices.resolve_accelerator(handle, other)
    with pytest.raises(accel.AcceleratorValueError, match="belongs to another registry"):
        AccelAccelerator(handle, registry=other)


@pytest.mark.parametrize("name", [":0", " :1", ":"])
def test_an_index_without_a_name_is_a_value_error_not_an_unknown_name(
    registry: accel.AcceleratorRegistry, name: str
) -> None:
    # docs/errors.md: a malformed name is a ValueError; ':0' names nothing to look up.
    with pytest.raises(accel.AcceleratorValueError, match="no name before the ':'") as caught:
        registry.get_accelerator(name)
    assert not isinstance(caught.value, LookupError)


@pytest.mark.parametrize(
    ("given", "mode"), [("WARN", "warn"), (" Off ", "off"), ("Error", "error")]
)
def test_tie_check_is_case_insensitive_like_names(
    registry: accel.AcceleratorRegistry, given: str, mode: str
) -> None:
    acc = registry.get_accelerator("cpu", tie_check=given)  # type: ignore[arg-type]
    assert acc.tie_check == mode


@pytest.mark.parametrize("given", [True, None, 1, ["warn"]])
def test_tie_check_of_another_type_is_a_type_error(
    registry: accel.AcceleratorRegistry, given: object
) -> None:
    with pytest.raises(accel.AcceleratorTypeError, match="tie_check must be a str") as caught:
        registry.get_accelerator("cpu", tie_check=given)  # type: ignore[arg-type]
    assert type(given).__name__ in str(caught.value) and repr(given) in str(caught.value)


class _IndexedFake(FakeAccelerator):
    """A fake whose devices differ by index, as a real accelerator's do."""

    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        return torch.device("cpu", index or 0)


def test_two_handles_of_one_accelerator_and_device_are_equal_and_hash_alike() -> None:
    registry = isolated_registry(_IndexedFake("npu", count=2))
    first, again = registry.get_accelerator("npu"), registry.get_accelerator("NPU")
    assert first == again and hash(first) == hash(again)
    # tie_check is a setting of the handle, not what it selects.
    assert registry.get_accelerator("npu", tie_check="off") == first
    assert registry.get_accelerator("npu:1") != first  # another device
    assert registry.get_accelerator("npu:1") == first.for_index(1)
    assert registry.get_accelerator("cpu") != first
    other = isolated_registry(_IndexedFake("npu", count=2)).get_accelerator("npu")
    assert other != first  # another registry's plugin: other hooks
    assert first != "npu"
    seen = {first: "a", other: "b"}
    seen[again] = "c"  # the same key as first
    assert seen == {first: "c", other: "b"}


def test_get_accelerator_cpu_twice_gives_equal_handles() -> None:
    assert accel.get_accelerator("cpu") == accel.get_accelerator("cpu")
