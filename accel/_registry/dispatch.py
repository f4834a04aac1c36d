"""Hook dispatch: one pluggy manager per registry; every accelerator calls only its own
plugin, the cross-cutting ones and accel's fallbacks.

Each accelerator's :class:`~accel._core.hooks.AcceleratorHooks` calls pluggy's loop
with the hook's implementations minus the other accelerators' plugins, read once per
hook and read again after a plugin is added or removed. One lock covers the manager, the
owners and those reads, so a call's implementations are always of one moment.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import final

import pluggy

from accel import hookspecs
from accel._core.hooks import AcceleratorHooks, blamed
from accel._core.listing import ACTION_HOOKS, FALLBACKS_NAME, plain_implementers
from accel.errors import PluginError
from accel.markers import PROJECT_NAME

__all__ = ["AcceleratorHooks", "Dispatcher"]


@final
class Dispatcher:
    """The plugin manager of one registry, and each accelerator's hooks."""

    __slots__ = ("_hooks", "_lock", "_manager", "_owners", "_providers")

    def __init__(self, fallbacks: object) -> None:
        self._manager = pluggy.PluginManager(PROJECT_NAME)
        self._manager.add_hookspecs(hookspecs)
        self._providers: dict[str, str] = {}
        # Each accelerator plugin and the accelerators it declared.
        self._owners: dict[object, tuple[str, ...]] = {}
        self._hooks: dict[str, AcceleratorHooks] = {}
        # Held while the manager, the owners or the hooks change, and while an
        # accelerator reads a hook's implementations (AcceleratorHooks._build). A call
        # runs on the snapshot it read, so a plugin unregistered meanwhile finishes it.
        self._lock = threading.RLock()
        self.add_plugin(fallbacks, FALLBACKS_NAME, "built-in", accelerators=[])

    def owns(self, hooks: AcceleratorHooks) -> bool:
        """Whether ``hooks`` are one of this registry's accelerators' (still registered)."""
        return any(mine is hooks for mine in self._hooks.values())

    def validator(self) -> pluggy.PluginManager:
        """The registry's plugin manager (it parses and validates hook implementations)."""
        return self._manager

    def add_plugin(
        self, plugin: object, label: str, provider: str, *, accelerators: list[str]
    ) -> None:
        """Validate and register ``plugin`` as ``label`` (made unique if another plugin
        has it): for its ``accelerators``, or for every accelerator (``accelerators=[]``,
        a cross-cutting plugin).

        :raises PluginError: its hooks' arguments do not fit accel's specs, or it does an
            action hook that another plugin already does for one of the same accelerators.
        """
        with self._lock:
            taken = self._manager.get_plugin(label) is not None
            name = f"{label}-{id(plugin):x}" if taken else label
            try:
                self._manager.register(plugin, name=name)
            except (ValueError, pluggy.PluginValidationError) as exc:
                detail = " ".join(str(exc).split())
                raise PluginError(
                    f"plugin {name!r} from {provider} does not match accel's hooks: {detail}. "
                    f"Hook names and arguments are listed in accel.hookspecs."
                ) from exc
            try:
                self._check_actions(plugin, name, provider, accelerators)
            except BaseException:
                self._manager.unregister(plugin)
                raise
            if accelerators:
                self._owners[plugin] = tuple(accelerators)
            self._providers[name] = provider
            self._blame(plugin)
            for accelerator in accelerators:
                self._hooks[accelerator] = AcceleratorHooks(
                    accelerator,
                    self._manager,
                    self._providers,
                    partial(self._foreign, accelerator),
                    self._lock,
                )
            self._forget()

    def remove_plugin(self, plugin: object) -> None:
        """Unregister ``plugin``; retire its accelerators' hooks."""
        with self._lock:
            # Each canonical name has one owner (the catalog keeps it so), so each
            # accelerator's hooks are its owner's.
            for accelerator in self._owners.pop(plugin, ()):
                self._hooks.pop(accelerator)._retire()
            self._providers.pop(self._manager.get_name(plugin) or "", None)
            self._manager.unregister(plugin)
            self._forget()

    def hooks(self, accelerator: str) -> AcceleratorHooks:
        """The hooks of a registered accelerator."""
        return self._hooks[accelerator]

    # -- internals -------------------------------------------------------------------

    def _blame(self, plugin: object) -> None:
        """Wrap each of ``plugin``'s hook implementations in :func:`blamed`: what it
        raises names it, and a first-result answer records it. pluggy read each one's
        argument names from the function itself, so a wrapper taking ``*args`` is
        called exactly as the function was."""
        for caller in self._manager.get_hookcallers(plugin) or []:
            firstresult = bool(caller.spec is not None and caller.spec.opts.get("firstresult"))
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    # Final in pluggy's stubs, a plain slot at run time: pluggy calls
                    # impl.function(*args) with the names it read at registration.
                    impl.function = blamed(  # type: ignore[misc]
                        impl, caller.name, self._provider_of, firstresult
                    )

    def _provider_of(self, plugin_name: str) -> str:
        return self._providers.get(plugin_name, "registered in code")

    def _foreign(self, accelerator: str | None) -> list[object]:
        """The plugins of every accelerator but ``accelerator`` (``None``: of all).
        Call with the lock held."""
        return [p for p, names in self._owners.items() if accelerator not in names]

    def _forget(self) -> None:
        for hooks in self._hooks.values():
            hooks._forget()

    def _check_actions(
        self, plugin: object, name: str, provider: str, accelerators: list[str]
    ) -> None:
        """An action hook is done by one plain implementation per accelerator (the rule
        in accel.hookspecs): refuse a plugin (registered in the manager, not yet among
        the owners) that would make it two."""
        scopes: list[str | None] = [*accelerators] if accelerators else [None, *self._hooks]
        for hook_name in sorted(ACTION_HOOKS):
            for scope in scopes:
                plain = plain_implementers(self._manager, hook_name, self._foreign(scope))
                if len(plain) > 1 and any(impl.plugin is plugin for impl in plain):
                    other = next(impl for impl in plain if impl.plugin is not plugin)
                    where = f"accelerator {scope!r}" if scope else "every accelerator"
                    raise PluginError(
                        f"plugin {name!r} from {provider} does the action hook "
                        f"{hook_name!r} (a plain implementation), which plugin "
                        f"{other.plugin_name!r} ({self._provider_of(other.plugin_name)}) "
                        f"already does for {where}; an action hook is done by one plain "
                        f"implementation. Make one of them a wrapper "
                        f"(@accel.hookimpl(wrapper=True): work before and after its yield), "
                        f"or register only one of them."
                    )
