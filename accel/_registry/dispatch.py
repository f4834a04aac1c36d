"""Hook dispatch: every accelerator calls only its own plugin and the cross-cutting ones.

Each accelerator gets a :class:`pluggy.PluginManager` of its own holding accel's
fallbacks, every cross-cutting plugin and the accelerator's plugin, registered in
the registry's order. The handle calls them through
:class:`~accel._core.hooks.AcceleratorHooks`, and another accelerator's plugin is never
among the implementations, even one registered while a call is in flight. One more
manager holds every plugin, to validate new ones.
"""

from __future__ import annotations

from typing import final

import pluggy

from accel._core.hooks import FALLBACKS_NAME, AcceleratorHooks, no_longer_registered
from accel._core.untying import UntyingDeviceTypes
from accel._registry.declarations import check_hook_names, new_plugin_manager
from accel.errors import PluginError

__all__ = ["AcceleratorHooks", "Dispatcher"]


@final
class Dispatcher:
    """The plugin managers of one registry: one per accelerator, one to validate."""

    __slots__ = ("_cross_cutting", "_hooks", "_providers", "_untying", "_validator")

    def __init__(self, fallbacks: object) -> None:
        self._validator = new_plugin_manager()
        self._providers: dict[str, str] = {}
        # (plugin, name) of the fallbacks and every cross-cutting plugin, in order.
        self._cross_cutting: list[tuple[object, str]] = []
        self._hooks: dict[str, AcceleratorHooks] = {}
        # One per registry: another registry's untying devices never change its moves.
        self._untying = UntyingDeviceTypes()
        self.add_plugin(fallbacks, FALLBACKS_NAME, "built-in", accelerators=[])

    def owns(self, hooks: AcceleratorHooks) -> bool:
        """Whether ``hooks`` are one of this registry's accelerators' (still registered)."""
        return any(mine is hooks for mine in self._hooks.values())

    def validator(self) -> pluggy.PluginManager:
        """The manager that parses hook implementations (holds every plugin)."""
        return self._validator

    def unique_name(self, label: str, plugin: object) -> str:
        """``label``, or ``label`` made unique if another plugin already has it."""
        return label if self._validator.get_plugin(label) is None else f"{label}-{id(plugin):x}"

    def is_registered(self, plugin: object) -> bool:
        return self._validator.is_registered(plugin)

    def add_plugin(
        self, plugin: object, name: str, provider: str, *, accelerators: list[str]
    ) -> None:
        """Validate ``plugin`` and give it to the managers it belongs in.

        An accelerator plugin gets a manager per accelerator it declares; a
        cross-cutting one (``accelerators=[]``) joins every manager, now and later.
        """
        label = name
        try:
            self._validator.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            detail = " ".join(str(exc).split())
            raise PluginError(
                f"plugin {label!r} from {provider} does not match accel's hooks: {detail}. "
                f"Hook names and arguments are listed in accel.hookspecs."
            ) from exc
        try:
            check_hook_names(plugin, label, provider, self._validator)
        except BaseException:
            self._validator.unregister(plugin)
            raise
        self._providers[name] = provider
        if accelerators:
            for accelerator in accelerators:
                manager = new_plugin_manager()
                for other, other_name in self._cross_cutting:
                    manager.register(other, name=other_name)
                manager.register(plugin, name=name)
                self._hooks[accelerator] = AcceleratorHooks(
                    accelerator, manager, self._providers, untying=self._untying
                )
        else:
            self._cross_cutting.append((plugin, name))
            for hooks in self._hooks.values():
                hooks._add(plugin, name)

    def remove_plugin(self, plugin: object, accelerators: list[str]) -> None:
        """Take ``plugin`` out of every manager; retire its accelerators' hooks."""
        name = self._validator.get_name(plugin)
        self._validator.unregister(plugin)
        self._providers.pop(name or "", None)
        for accelerator in accelerators:
            hooks = self._hooks.pop(accelerator, None)
            if hooks is not None:
                hooks._retire()
        self._cross_cutting = [(p, n) for p, n in self._cross_cutting if p is not plugin]
        for hooks in self._hooks.values():
            hooks._remove(plugin)

    def hooks(self, accelerator: str) -> AcceleratorHooks:
        hooks = self._hooks.get(accelerator)
        if hooks is None:  # unregistered by another thread since it was looked up
            raise no_longer_registered(accelerator)
        return hooks
