"""The accelerator registry: a set of plugins and the way to select among them.

A small facade over four parts, each owning its own state: the catalog of
accelerators and names, the entry-point loader, hook dispatch (one pluggy manager per
registry) and selection (see docs/architecture.md). Devices torch drives that no plugin
claims are added last. Two registries in one process share nothing. Plugins load on
first use, never at ``import accel``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, final

import accel.plugins as builtin_plugins
import accel.plugins._fallbacks as fallbacks
from accel._registry.arguments import checked_arguments
from accel._registry.catalog import BUILTIN_PROVIDER, Catalog
from accel._registry.conflicts import (
    builtin_conflict_error,
    conflict_error,
    warn_builtin_aliases,
    warn_disputed_alias,
)
from accel._registry.declarations import declared_specs, plugin_label
from accel._registry.dispatch import Dispatcher
from accel._registry.loading import EntryPointLoader
from accel._registry.selection import Selector
from accel._util.names import AUTO
from accel.errors import PluginError
from accel.markers import PROJECT_NAME
from accel.plugins.torch_device import NO_PLUGIN, privateuse1_name, unclaimed_devices
from accel.training.checkpoint._early_signals import note_early_signals
from accel.types import AcceleratorInfo, PluginFailure, TieCheck

if TYPE_CHECKING:
    from accel.accelerator import Accelerator

__all__ = ["AcceleratorRegistry"]


@final
class AcceleratorRegistry:
    """A set of accelerator plugins and the way to select among them.

    :param entry_points: entry-point group to load third-party plugins from, or
        ``None`` to load none. Embedding libraries may use a group of their own.
    :param builtins: register the built-in ``cpu``, ``cuda``, ``mps`` and ``tpu``
        plugins.
    :param plugins: allow-list of entry-point or distribution names to load, compared
        as packaging compares names (``-``, ``_``, ``.`` and case alike); ``None``
        means ``$ACCEL_PLUGINS`` if set, else all.
    :param autoload: load entry points at all; ``None`` means "unless
        ``$ACCEL_DISABLE_PLUGIN_AUTOLOAD=1``".
    :param default_from_env: whether ``get_accelerator()`` without a name reads
        ``$ACCEL_ACCELERATOR``; ``None``: unless ``entry_points`` is a group of the
        registry's own (the variable names accelerators of accel's group).
    :raises AcceleratorTypeError: an argument of the wrong type (``plugins="x"``).

    Nothing is loaded until the registry is first used.
    """

    def __init__(
        self,
        *,
        entry_points: str | None = PROJECT_NAME,
        builtins: bool = True,
        plugins: Iterable[str] | None = None,
        autoload: bool | None = None,
        default_from_env: bool | None = None,
    ) -> None:
        allowed = checked_arguments(entry_points, builtins, plugins, autoload, default_from_env)
        if default_from_env is None:
            default_from_env = entry_points in (PROJECT_NAME, None)
        #: Whether ``get_accelerator()`` without a name reads ``$ACCEL_ACCELERATOR``.
        self._from_env = default_from_env
        self._loader = EntryPointLoader(entry_points, allowed=allowed, autoload=autoload)
        self._builtins = builtins
        self._catalog = Catalog()
        #: The hook dispatch, created by the first load.
        self._dispatcher: Dispatcher
        #: Set once the plugins are loaded, after everything else.
        self._selector: Selector | None = None
        self._failures: list[PluginFailure] = []
        # Re-entrant: loading registers plugins, and registering makes sure loading ran.
        # It also guards the catalog: selection reads it under this lock (see Selector).
        self._lock = threading.RLock()
        # The thread loading the plugins now, so that a plugin using this registry
        # while it is being loaded gets a true error instead of a second load.
        self._loading_thread: int | None = None
        # The PrivateUse1 name when devices without a plugin were last added ("": not
        # yet, so _renamed() is true until the first load has added them).
        self._privateuse1 = ""

    # -- registration ------------------------------------------------------------

    def register(self, plugin: object, name: str | None = None, *, override: bool = False) -> None:
        """Register a plugin object (a module or an instance with ``@accel.hookimpl`` methods).

        :param name: plugin name; defaults to the plugin's module or class.
        :param override: let this plugin's accelerators replace registered ones with
            the same name or alias (built-ins included), instead of raising
            :class:`PluginError`.
        :raises PluginError: the plugin is malformed, or a name it declares is taken.
        """
        self._loaded()
        with self._lock:
            self._add(plugin, name or plugin_label(plugin), plugin_label(plugin), override=override)

    def unregister(self, plugin: object) -> None:
        """Remove a plugin and every accelerator it declared.

        Handles of its accelerators raise :class:`AcceleratorNotFoundError` from then on.
        """
        self._loaded()
        with self._lock:
            if not self._dispatcher.validator().is_registered(plugin):
                raise PluginError(
                    f"cannot unregister {plugin_label(plugin)!r}: it is not registered in "
                    f"this registry (registries never share plugins)"
                )
            self._remove(plugin)

    # -- queries -------------------------------------------------------------------

    def get_accelerator(
        self, name: str | Accelerator | None = None, *, tie_check: TieCheck = "error"
    ) -> Accelerator:
        """Return a handle to the accelerator called ``name``.

        :param name: a name or alias, optionally with a device index (``"cuda:1"``),
            or ``"auto"``. ``None`` means ``$ACCEL_ACCELERATOR`` (if the registry
            reads it: ``default_from_env``), else ``"auto"``. A
            handle of this registry's is returned as it is (so every API that takes
            "a handle or a name" with ``registry=`` follows one rule); a handle of
            another registry is an :class:`AcceleratorValueError`.
            ``"auto"`` picks the available accelerator with the highest priority
            (ties broken by canonical name) that allows being picked automatically.
        :param tie_check: what a move does when the model's ties changed during it:
            ``"error"`` (raise :class:`WeightTyingError`, model restored), ``"warn"``
            or ``"off"`` (keep the ties the model had before the move).
        :raises AcceleratorNotFoundError: no accelerator has that name.
        :raises AcceleratorUnavailableError: it exists but cannot be used here, or
            the device index is beyond its device count.
        :raises PluginError: several installed plugins claim that name.
        :raises AcceleratorValueError: a malformed name (``"cuda:x"``, ``":0"``).
        :raises AcceleratorTypeError: a name or ``tie_check`` of the wrong type.
        """
        # A run's first call into accel: from here on (loading plugins may take
        # seconds) a preemption signal is noted for the guard, not fatal.
        note_early_signals()
        if name is None and not self._from_env:
            name = AUTO
        return self._loaded().select(name, tie_check)

    def distributed_backends(self, name: str) -> dict[str, str]:
        """The :mod:`torch.distributed` backend of each accelerator ``name`` selects, by
        canonical name: one, or several for an alias shared by several (the built-in
        ``gpu``). Asked of their plugins without probing them or creating a handle, so
        nothing is started (on XLA, a handle hands a device out).

        :param name: a name or alias, optionally with a device index; not ``"auto"``.
        :raises AcceleratorNotFoundError: no accelerator has that name.
        :raises PluginError: several installed plugins claim that name.
        :raises AcceleratorValueError: ``name`` is ``"auto"`` or malformed.
        """
        return self._loaded().distributed_backends(name)

    def list_accelerators(self) -> list[AcceleratorInfo]:
        """Every registered accelerator, available or not, in ``"auto"`` order
        (highest priority first, then by name); then plugins that failed to load,
        unavailable, with their error."""
        return self._loaded().rows()

    def plugin_failures(self) -> list[PluginFailure]:
        """Plugins that failed to load or register, with their errors."""
        self._loaded()
        return list(self._failures)

    def names(self) -> list[str]:
        """Every canonical name and alias, sorted."""
        self._loaded()
        with self._lock:
            return self._catalog.names()

    # -- internals -------------------------------------------------------------------

    def _loaded(self) -> Selector:
        """The selector, after loading the built-ins and entry points once, then adding
        the devices torch drives that no plugin claims (again when the PrivateUse1
        backend is renamed)."""
        selector = self._selector
        if selector is not None and not self._renamed():
            return selector
        with self._lock:
            if self._selector is None:
                self._selector = self._load()
            # After every plugin (a plugin's own name takes precedence). Until then
            # _renamed() is true, so other threads wait on the lock for them.
            if self._renamed():
                self._add_torch_devices()
            return self._selector

    def _load(self) -> Selector:
        """Load the built-ins and the entry points, once (under the lock)."""
        if self._loading_thread == threading.get_ident():
            current = self._loader.current
            who = (
                f"accel plugin {current[0]!r} from {current[1]}"
                if current is not None
                else "a built-in plugin"
            )
            raise PluginError(
                f"{who} used accel (selected, listed or registered an accelerator) while "
                f"accel was still loading it; accel can answer only once every plugin has "
                f"loaded. Move that call out of the plugin's import-time code into a hook, "
                f"which accel calls after loading."
            )
        self._loading_thread = threading.get_ident()
        try:
            self._dispatcher = Dispatcher(fallbacks)
            if self._builtins:
                # BUILTIN_PLUGINS is read now: tests replace it.
                for builtin_name, factory in builtin_plugins.BUILTIN_PLUGINS:
                    self._add(factory(), f"accel.builtin.{builtin_name}", BUILTIN_PROVIDER)
            self._failures.extend(self._loader.load(partial(self._add, entry_point=True)))
        except BaseException:
            # An interrupt while a plugin hangs: the next use starts afresh.
            self._catalog = Catalog()
            self._failures = []
            raise
        finally:
            self._loading_thread = None
        return Selector(self._catalog, self._dispatcher, self._failures, self._lock)

    def _add_torch_devices(self) -> None:
        self._privateuse1 = privateuse1_name()
        for plugin in unclaimed_devices(lambda name: bool(self._catalog.candidates(name))):
            self._add(plugin, f"accel.torch.{plugin.device_type}", NO_PLUGIN)

    def _renamed(self) -> bool:
        """Whether the PrivateUse1 backend has a new name since its devices were added."""
        return self._builtins and self._privateuse1 != privateuse1_name()

    def _remove(self, plugin: object) -> None:
        self._dispatcher.remove_plugin(plugin)
        self._catalog.remove(plugin)

    def _add(
        self,
        plugin: object,
        label: str,
        provider: str,
        *,
        override: bool = False,
        entry_point: bool = False,
    ) -> None:
        if self._dispatcher.validator().is_registered(plugin):
            raise PluginError(
                f"plugin {label!r} from {provider} is already registered in this registry, "
                f"and a plugin object is registered once. Register it once; to register it "
                f"anew (with another name=), unregister it first (registry.unregister(plugin))."
            )
        specs = declared_specs(plugin, label, provider, self._dispatcher.validator())
        conflicts = self._catalog.conflicts(specs, provider)
        # A device's own plugin replaces accel's stand-in for it; override=True, any holder.
        replaced = [c for c in conflicts if override or c.holder.provider == NO_PLUGIN]
        for holder in {id(c.holder.plugin): c.holder.plugin for c in replaced}.values():
            self._remove(holder)
        conflicts = [] if override else [c for c in conflicts if c.holder.provider != NO_PLUGIN]
        if conflicts and not entry_point:
            raise conflict_error(
                conflicts[0], specs, label, provider, {c.name for c in conflicts}, in_code=True
            )
        # A built-in always keeps its names: an installed plugin cannot take them, and
        # disputes nothing, so the built-in keeps working. A built-in's canonical name
        # keeps the plugin out; a built-in's alias is only taken from the plugin.
        dropped = [c for c in conflicts if c.holder.provider == BUILTIN_PROVIDER]
        for conflict in dropped:
            if conflict.is_canonical:
                raise builtin_conflict_error(conflict, specs, label, provider)
        # Two installed distributions claim a name: selecting it then raises, naming
        # both, whichever was installed first. A disputed alias costs neither plugin
        # its own names; a disputed canonical name keeps the second plugin out.
        disputed = [c for c in conflicts if c.holder.provider != BUILTIN_PROVIDER]
        canonical = [c for c in disputed if c.is_canonical]
        if canonical:
            self._catalog.dispute(canonical, provider)
            # Its aliases of a disputed name are disputed too: had it loaded first,
            # they would select the disputed accelerator.
            kept_out = [s for s in specs if s.name in {c.name for c in canonical}]
            self._catalog.dispute_aliases(kept_out)
            named = {c.name for c in disputed}.union(*(s.aliases for s in kept_out))
            raise conflict_error(canonical[0], specs, label, provider, named)
        lost = {c.name for c in dropped}  # built-ins' aliases: the plugin loses them
        kept = [
            dataclasses.replace(s, aliases=tuple(a for a in s.aliases if a not in lost))
            for s in specs
        ]
        self._dispatcher.add_plugin(plugin, label, provider, accelerators=[s.name for s in specs])
        self._catalog.add(plugin, kept, provider)
        self._catalog.dispute(disputed, provider)
        # Warned once registered: each warning says what the registry now holds.
        warn_builtin_aliases(specs, dropped, label, provider)
        for conflict in disputed:
            warn_disputed_alias(conflict, specs, label, provider)
