"""Loading third-party plugins from entry points.

Each entry point loads inside its own guard: one that fails to import, to build or to
register becomes a :class:`~accel.PluginFailure` and a :class:`~accel.PluginWarning`,
and the others keep working. Entry points load in a fixed order (normalised
distribution name, then entry-point name), so what a registry holds never depends on
the order in which distributions were installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint
from typing import Final

from accel._core.names import (
    DISABLE_AUTOLOAD_ENV,
    PLUGINS_ENV,
    env_flag,
    normalize_distribution_name,
)
from accel.errors import PluginError, PluginWarning
from accel.types import PluginFailure

__all__ = ["EntryPointLoader"]

_SKIP_HINT: Final = f"set {DISABLE_AUTOLOAD_ENV}=1 or {PLUGINS_ENV}=... to skip third-party plugins"

#: Registers one loaded plugin: ``(plugin, entry-point name, provider)``.
Register = Callable[[object, str, str], None]


class EntryPointLoader:
    """The settings that decide which entry points a registry loads."""

    def __init__(
        self, group: str | None, *, allowed: Iterable[str] | None, autoload: bool | None
    ) -> None:
        self._group = group
        self._allowed = None if allowed is None else _normalised_set(allowed)
        self._autoload = autoload

    def enabled(self) -> bool:
        if self._group is None:
            return False
        if self._autoload is not None:
            return self._autoload
        return not env_flag(DISABLE_AUTOLOAD_ENV)

    def allowed(self) -> set[str] | None:
        """The allow-list, normalised: the registry's own, else ``$ACCEL_PLUGINS``."""
        if self._allowed is not None:
            return self._allowed
        raw = os.environ.get(PLUGINS_ENV, "")
        return _normalised_set(raw.split(",")) if raw.strip() else None

    def load(self, register: Register) -> list[PluginFailure]:
        """Load every allowed entry point of the group into ``register``."""
        if not self.enabled():
            return []
        assert self._group is not None
        allowed = self.allowed()
        found = sorted(importlib.metadata.entry_points(group=self._group), key=_load_order)
        failures: list[PluginFailure] = []
        loaded_names: set[str] = set()
        for entry_point in found:
            dist_name, provider = _provider(entry_point)
            keys = {normalize_distribution_name(entry_point.name), dist_name}
            if allowed is not None and not keys & allowed:
                continue
            if entry_point.name in loaded_names:
                continue  # the same distribution on sys.path twice
            loaded_names.add(entry_point.name)
            try:
                loaded = entry_point.load()
                # An entry point may name a class: accel builds one with no arguments.
                plugin = loaded() if isinstance(loaded, type) else loaded
                register(plugin, entry_point.name, provider)
            except Exception as exc:
                failures.append(_failure(entry_point.name, provider, exc))
        if allowed is not None:
            _warn_unmatched(allowed, found)
        return failures


def _load_order(entry_point: EntryPoint) -> tuple[str, str]:
    return (_provider(entry_point)[0], entry_point.name)


def _provider(entry_point: EntryPoint) -> tuple[str, str]:
    """(normalised distribution name, ``"Name version"``) of an entry point."""
    dist = entry_point.dist
    if dist is None:
        return "", "unknown distribution"
    name = dist.metadata["Name"]
    return normalize_distribution_name(name), f"{name} {dist.version}"


def _normalised_set(names: Iterable[str]) -> set[str]:
    return {normalize_distribution_name(name) for name in names if name.strip()}


def _failure(name: str, provider: str, exc: BaseException) -> PluginFailure:
    error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    conflicting = exc.conflicting_names if isinstance(exc, PluginError) else ()
    warnings.warn(
        f"accel plugin {name!r} from {provider} failed to load and was skipped ({error}); "
        f"the other accelerators still work. Fix or uninstall it, or {_SKIP_HINT}.",
        PluginWarning,
        stacklevel=5,
    )
    return PluginFailure(name, provider, error, tuple(conflicting))


def _warn_unmatched(allowed: set[str], found: list[EntryPoint]) -> None:
    installed = {normalize_distribution_name(ep.name) for ep in found}
    installed |= {_provider(ep)[0] for ep in found}
    unmatched = sorted(allowed - installed)
    if not unmatched:
        return
    there = ", ".join(sorted({f"{ep.name} (from {_provider(ep)[1]})" for ep in found}))
    warnings.warn(
        f"{PLUGINS_ENV} names {', '.join(map(repr, unmatched))}, but no installed accel plugin "
        f"has that entry-point or distribution name; installed: {there or 'none'}. Check "
        f"the spelling, or install the plugin's distribution.",
        PluginWarning,
        stacklevel=5,
    )
