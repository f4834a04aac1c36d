"""Installed plugins claiming names: a built-in keeps its own, two third parties dispute."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
import torch

import accel

GROUP = "accel-name-claims-test"


class _Distribution:
    """What accel reads of an entry point's distribution: its name and version."""

    def __init__(self, name: str) -> None:
        self.metadata = {"Name": name}
        self.version = "1.0"


def _registry(
    monkeypatch: pytest.MonkeyPatch, *classes: str, distributions: tuple[str, ...] = ()
) -> accel.AcceleratorRegistry:
    """A registry with the built-ins and fake entry points for ``classes``, each from the
    distribution ``accel-CLASS`` or, given, from ``distributions`` (loaded in name order)."""
    found = []
    for index, cls in enumerate(classes):
        entry_point = importlib.metadata.EntryPoint(
            cls.lower(), f"helpers.claiming_plugins:{cls}", GROUP
        )
        # Each from a distribution of its own, as installed plugins are (the way
        # importlib.metadata itself attaches one).
        name = distributions[index] if distributions else f"accel-{cls.lower()}"
        vars(entry_point).update(dist=_Distribution(name))
        found.append(entry_point)
    real = importlib.metadata.entry_points

    def entry_points(**params: Any) -> Any:
        return found if params.get("group") == GROUP else real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return accel.AcceleratorRegistry(entry_points=GROUP)


def _load(registry: accel.AcceleratorRegistry) -> list[str]:
    """Load the registry's plugins; the PluginWarnings they gave."""
    with pytest.warns(accel.PluginWarning) as caught:
        registry.names()
    return [str(w.message) for w in caught if issubclass(w.category, accel.PluginWarning)]


def test_a_plugin_claiming_the_cpu_name_leaves_the_builtin_cpu_working(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = _registry(monkeypatch, "CpuClaimer")
    (warning,) = _load(registry)
    assert "'cpuclaimer' from accel-cpuclaimer 1.0 failed to load and was skipped" in warning
    assert "belongs to the built-in 'cpu'" in warning and "'cpu2'" in warning

    assert registry.get_accelerator("cpu").name == "cpu"
    rows = {info.name: info for info in registry.list_accelerators()}
    assert rows["cpu"].available and rows["cpu"].provider == "built-in"
    assert "cpu2" not in registry.names()
    # The rejected plugin is listed as a failure, saying why and what to do.
    assert "belongs to the built-in 'cpu'" in rows["cpuclaimer"].reason
    assert registry.plugin_failures()[0].conflicting_names == ("cpu",)


def test_auto_still_picks_the_builtin_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here, whatever torch build runs the test: "auto" comes down to the CPU.
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    registry = _registry(monkeypatch, "CpuClaimer")
    _load(registry)
    assert registry.get_accelerator("auto").name == "cpu"


def test_a_plugin_claiming_a_builtin_alias_keeps_its_own_names_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = _registry(monkeypatch, "GpuAliasClaimer")
    (warning,) = _load(registry)
    assert "declares the alias 'gpu' for 'npu'" in warning
    assert "the built-in 'cuda' and 'mps' has that alias" in warning
    assert "registered without it" in warning

    assert registry.plugin_failures() == []
    assert registry.get_accelerator("npu").name == "npu"
    assert registry.get_accelerator("ascend").name == "npu"  # its other alias is its own
    rows = {info.name: info for info in registry.list_accelerators()}
    assert rows["npu"].aliases == ("ascend",)
    assert "gpu" in rows["cuda"].aliases and "gpu" in rows["mps"].aliases
    # "gpu" still means the built-in GPU: on this machine unavailable or cuda/mps, never npu.
    try:
        assert registry.get_accelerator("gpu").name in ("cuda", "mps")
    except accel.AcceleratorUnavailableError as exc:
        assert exc.accelerator in ("cuda", "mps")


def test_an_alias_two_installed_plugins_claim_is_disputed_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = _registry(monkeypatch, "VendorAliasA", "VendorAliasB")
    (warning,) = _load(registry)
    assert "declares the alias 'vx' for 'vendorb'" in warning
    assert "'vendora' from accel-vendoraliasa 1.0 has it too" in warning
    assert "selects neither" in warning

    assert registry.plugin_failures() == []
    with pytest.raises(accel.PluginError, match=r"cannot select 'vx'"):
        registry.get_accelerator("vx")
    assert registry.get_accelerator("vendora").name == "vendora"
    assert registry.get_accelerator("vendorb").name == "vendorb"


def test_a_plugin_kept_out_by_a_dispute_is_not_said_to_be_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = _registry(monkeypatch, "VendorAliasA", "VendorLateGpu")
    (warning,) = _load(registry)
    assert "'vendorlategpu' from accel-vendorlategpu 1.0 failed to load and was skipped" in warning
    assert "'vendora' is claimed twice" in warning
    with pytest.raises(accel.PluginError, match="claimed by 2 installed plugins"):
        registry.get_accelerator("vendora")
    assert registry.get_accelerator("cpu").name == "cpu"  # the built-ins are untouched


@pytest.mark.parametrize("aliased_first", [True, False])
def test_an_alias_of_a_disputed_name_is_disputed_whichever_plugin_loads_first(
    monkeypatch: pytest.MonkeyPatch, aliased_first: bool
) -> None:
    first, second = ("accel-a-npx", "accel-b-npx")
    registry = _registry(
        monkeypatch,
        "NpxAliased",
        "NpxPlain",
        distributions=(first, second) if aliased_first else (second, first),
    )
    _load(registry)
    for name in ("npx", "neuralpx", "NeuralPX:0"):
        with pytest.raises(accel.PluginError) as info:
            registry.get_accelerator(name)
        message = str(info.value)
        assert f"cannot select {name!r}" in message
        assert "'npx' is claimed by 2 installed plugins" in message
        assert "accel-a-npx 1.0" in message and "accel-b-npx 1.0" in message
    (failure,) = registry.plugin_failures()
    assert failure.conflicting_names == (("npx",) if aliased_first else ("npx", "neuralpx"))
    assert registry.get_accelerator("cpu").name == "cpu"


def test_the_failure_record_names_every_disputed_name_aliases_included(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = _registry(monkeypatch, "VendorXOne", "VendorXTwo")
    _load(registry)
    (failure,) = registry.plugin_failures()
    assert failure.name == "vendorxtwo"
    assert failure.conflicting_names == ("vendorx", "vx")
    for name in ("vendorx", "vx"):
        with pytest.raises(accel.PluginError, match="'vendorx' is claimed by 2 installed plugins"):
            registry.get_accelerator(name)
