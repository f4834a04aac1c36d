"""Loading third-party plugins from entry points.

Each entry point loads inside its own guard: one that fails to import, to build or to
register becomes a :class:`~accel.PluginFailure` and a :class:`~accel.PluginWarning`,
and the others keep working. That includes a plugin calling ``sys.exit()`` at import
(any :class:`BaseException` but :class:`KeyboardInterrupt`): a plugin never ends its
caller's program. An interrupt while a plugin loads (one that hangs at import) goes
on, saying which plugin was loading. Entry points load in a fixed order (normalised
distribution name, then entry-point name), so what a registry holds never depends on
the order in which distributions were installed.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint
from typing import Final

from accel._util.names import DISABLE_AUTOLOAD_ENV, PLUGINS_ENV, normalize_distribution_name
from accel._util.warn import warn_at_caller
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
        #: ``(entry-point name, provider)`` of the plugin being loaded now, if any.
        self.current: tuple[str, str] | None = None

    def load(self, register: Register) -> list[PluginFailure]:
        """Load every allowed entry point of the group into ``register``."""
        if self._group is None or self._autoload is False:
            return []
        if self._autoload is None and _autoload_disabled():
            return []
        allowed, source = self._allow_list()
        # (normalised distribution name, provider, entry point), in load order.
        found = sorted(
            ((*_provider(ep), ep) for ep in importlib.metadata.entry_points(group=self._group)),
            key=lambda item: (item[0], item[2].name),
        )
        failures: list[PluginFailure] = []
        # A distribution found twice on sys.path is found once: importlib.metadata's
        # entry_points() keeps the first (Python 3.10 on).
        for dist_name, provider, entry_point in found:
            keys = {normalize_distribution_name(entry_point.name), dist_name}
            if allowed is not None and not keys & allowed:
                continue
            self.current = (entry_point.name, provider)
            try:
                loaded = entry_point.load()
                # An entry point may name a class: accel builds one with no arguments.
                plugin = loaded() if isinstance(loaded, type) else loaded
                register(plugin, entry_point.name, provider)
            except KeyboardInterrupt as exc:
                # Most likely a plugin that hangs at import: say which one.
                raise KeyboardInterrupt(
                    f"while loading accel plugin {entry_point.name!r} from {provider}; "
                    f"if it hangs, {_SKIP_HINT}"
                ) from exc
            except BaseException as exc:  # SystemExit too: a plugin never ends the program
                failures.append(_failure(entry_point.name, provider, exc))
            finally:
                self.current = None
        if allowed is not None:
            _warn_unmatched(allowed, found, source)
        return failures

    def _allow_list(self) -> tuple[set[str] | None, str]:
        """The allow-list, normalised, and what gave it: the registry's own, else
        ``$ACCEL_PLUGINS``."""
        if self._allowed is not None:
            return self._allowed, "the registry's plugins= argument"
        raw = os.environ.get(PLUGINS_ENV, "")
        allowed = _normalised_set(raw.split(",")) if raw.strip() else None
        if allowed == set():
            warn_at_caller(
                f"{PLUGINS_ENV}={raw!r} holds only separators, so it allows no plugin and "
                f"no third-party plugin loads (the built-ins still do). Name the plugins "
                f"to load ({PLUGINS_ENV}=accel-vendorx), unset it to load every plugin, or "
                f"set {DISABLE_AUTOLOAD_ENV}=1 to say you want none.",
                PluginWarning,
            )
        return allowed, PLUGINS_ENV


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
    message = str(exc).splitlines()[0] if str(exc) else ""
    error = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    conflicting = exc.conflicting_names if isinstance(exc, PluginError) else ()
    # The error's closing period would sit before the parenthesis: "hooks.); the".
    shown = error.rstrip().removesuffix(".")
    warn_at_caller(
        f"accel plugin {name!r} from {provider} failed to load and was skipped ({shown}); "
        f"the other accelerators still work. Fix or uninstall it, or {_SKIP_HINT}.",
        PluginWarning,
    )
    return PluginFailure(name, provider, error, tuple(conflicting))


def _warn_unmatched(
    allowed: set[str], found: list[tuple[str, str, EntryPoint]], source: str
) -> None:
    """:param source: what gave the allow-list: the variable, or the registry's argument."""
    installed = {normalize_distribution_name(ep.name) for _, _, ep in found}
    installed |= {dist for dist, _, _ in found}
    unmatched = sorted(allowed - installed)
    if not unmatched:
        return
    there = ", ".join(sorted({f"{ep.name} (from {provider})" for _, provider, ep in found}))
    what = (
        "that entry-point or distribution name"
        if len(unmatched) == 1
        else "any of these entry-point or distribution names"
    )
    warn_at_caller(
        f"{source} names {', '.join(map(repr, unmatched))}, but no installed accel plugin "
        f"has {what}; installed: {there or 'none'}. Check the spelling, or install the "
        f"plugin's distribution.",
        PluginWarning,
    )


_TRUE_VALUES: Final = ("1", "true", "yes", "on")
_FALSE_VALUES: Final = ("", "0", "false", "no", "off")


def _autoload_disabled() -> bool:
    """Whether ``$ACCEL_DISABLE_PLUGIN_AUTOLOAD`` is set to a true value (1, true, yes, on).

    Any other value means false; one that is not a recognised false value either
    (``maybe``) warns, naming the variable, since the user meant *something*.
    """
    raw = os.environ.get(DISABLE_AUTOLOAD_ENV, "")
    value = raw.strip().lower()
    if value in _TRUE_VALUES:
        return True
    if value not in _FALSE_VALUES:
        warn_at_caller(
            f"${DISABLE_AUTOLOAD_ENV}={raw!r} is not a value accel recognises, so it is read "
            f"as false: entry-point plugins still load. Set it to one of "
            f"{', '.join(map(repr, _TRUE_VALUES))} for true, or to one of "
            f"{', '.join(map(repr, _FALSE_VALUES))} for false.",
            PluginWarning,
        )
    return False
