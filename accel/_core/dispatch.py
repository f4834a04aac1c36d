"""Hook dispatch: every accelerator calls only its own plugin and the cross-cutting ones.

Each accelerator gets a :class:`pluggy.PluginManager` of its own holding accel's
fallbacks, every cross-cutting plugin and the accelerator's plugin, registered in
the registry's order. A hook call is then a plain public pluggy call, and another
accelerator's plugin is never among the implementations, even one registered while
a call is in flight. One more manager holds every plugin, to validate new ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import pluggy

from accel._core.blame import find_returner, note_culprit
from accel._core.declarations import check_hook_names, new_plugin_manager
from accel._core.names import describe_index_range
from accel.errors import AcceleratorNotFoundError, AcceleratorUnavailableError, PluginError
from accel.types import Availability

if TYPE_CHECKING:
    import torch

__all__ = ["AcceleratorHooks", "Dispatcher"]

FALLBACKS_NAME: Final = "accel.fallbacks"
_T = TypeVar("_T")


@final
class AcceleratorHooks:
    """The hooks of one accelerator, as its handle calls them."""

    __slots__ = ("_alive", "_fallback_only", "_manager", "_providers", "name")

    def __init__(self, name: str, manager: pluggy.PluginManager, providers: dict[str, str]):
        #: Canonical accelerator name, passed to every hook as ``accelerator``.
        self.name = name
        self._manager = manager
        self._providers = providers  # plugin name -> provider, shared with the dispatcher
        self._fallback_only: dict[str, bool] = {}
        self._alive = True

    def call(self, hook_name: str, **kwargs: Any) -> Any:
        """Call a hook, adding a note that names the plugin at fault if it raises."""
        caller = self._caller(hook_name)
        try:
            return caller(accelerator=self.name, **kwargs)
        except Exception as exc:
            note_culprit(exc, caller, hook_name, self.provider_of)
            raise

    def query(self, hook_name: str, expected: type[_T], **kwargs: Any) -> _T:
        """Call a first-result hook and check the type of what it returned."""
        result = self.call(hook_name, **kwargs)
        if isinstance(result, expected) and not (isinstance(result, bool) and expected is int):
            return result
        culprit = find_returner(self._caller(hook_name), self.name, kwargs, result)
        who = f"plugin {culprit!r} ({self.provider_of(culprit)})" if culprit else "no plugin"
        raise PluginError(
            f"hook {hook_name!r} for accelerator {self.name!r} returned "
            f"{type(result).__name__} ({result!r}) from {who}; expected "
            f"{expected.__name__}. Report this to the plugin's authors."
        )

    def only_fallback(self, hook_name: str) -> bool:
        """Whether accel's fallback is the only implementation of ``hook_name`` here,
        so the handle may do the fallback's work without a hook call."""
        cached = self._fallback_only.get(hook_name)
        if cached is None:
            implementations = self._caller(hook_name).get_hookimpls()
            cached = all(impl.plugin_name == FALLBACKS_NAME for impl in implementations)
            self._fallback_only[hook_name] = cached
        return cached

    def answerers(self, hook_name: str) -> str:
        """Name the plugins that may have answered a first-result hook (for errors)."""
        names = [
            impl.plugin_name
            for impl in self._caller(hook_name).get_hookimpls()
            if not (impl.wrapper or impl.hookwrapper) and impl.plugin_name != FALLBACKS_NAME
        ]
        if not names:
            return "accel's built-in fallback"
        return "plugin " + " or ".join(f"{n!r} ({self.provider_of(n)})" for n in reversed(names))

    def provider_of(self, plugin_name: str) -> str:
        return self._providers.get(plugin_name, "registered in code")

    # -- the probing hooks, checked ---------------------------------------------

    def availability(self) -> Availability:
        """Ask whether the accelerator can be used; never raises."""
        try:
            return self.query("is_available", Availability)
        except Exception as exc:
            # The message already says whom to report it to.
            return Availability(False, reason=f"probing it failed: {type(exc).__name__}: {exc}")

    def device_count(self) -> int:
        """The device count of an accelerator found available."""
        count = self.query("device_count", int)
        if count < 0:
            culprit = find_returner(self._caller("device_count"), self.name, {}, count)
            raise PluginError(
                f"hook 'device_count' for accelerator {self.name!r} returned {count} from "
                f"plugin {culprit!r}; a device count cannot be negative. Report this to the "
                f"plugin's authors."
            )
        return count

    def device(self, index: int | None, *, requested: str, source: str = "") -> torch.device:
        """The device for ``index`` (``None``: the default one), checked against the count.

        :param requested: the name as the user wrote it, for the message.
        :param source: where that name came from (``" in $ACCEL_ACCELERATOR"``) or ``""``.
        """
        import torch

        count = self.device_count()  # asked even without an index: a bad count fails early
        if index is not None and index >= count:
            raise AcceleratorUnavailableError(
                f"device index {index} requested ({requested!r}{source}) but "
                f"{self.name!r} has {count} device{'s' if count != 1 else ''} here "
                f"(valid: {', '.join(str(i) for i in range(count)) or 'none'}). Ask for "
                f"{describe_index_range(self.name, count)}, or check device visibility "
                f"settings such as CUDA_VISIBLE_DEVICES.",
                accelerator=self.name,
                reason=f"index {index} >= device count {count}",
            )
        return self.query("get_device", torch.device, index=index)

    # -- internals ----------------------------------------------------------------

    def _caller(self, hook_name: str) -> Any:
        if not self._alive:
            raise _no_longer_registered(self.name)
        return getattr(self._manager.hook, hook_name)

    def _retire(self) -> None:
        self._alive = False
        self._fallback_only.clear()

    def _add(self, plugin: object, name: str) -> None:
        self._manager.register(plugin, name=name)
        self._fallback_only.clear()

    def _remove(self, plugin: object) -> None:
        if self._manager.is_registered(plugin):
            self._manager.unregister(plugin)
        self._fallback_only.clear()


@final
class Dispatcher:
    """The plugin managers of one registry: one per accelerator, one to validate."""

    __slots__ = ("_cross_cutting", "_hooks", "_providers", "_validator")

    def __init__(self, fallbacks: object) -> None:
        self._validator = new_plugin_manager()
        self._providers: dict[str, str] = {}
        # (plugin, name) of the fallbacks and every cross-cutting plugin, in order.
        self._cross_cutting: list[tuple[object, str]] = []
        self._hooks: dict[str, AcceleratorHooks] = {}
        self.add_plugin(fallbacks, FALLBACKS_NAME, "built-in", accelerators=[])

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
                self._hooks[accelerator] = AcceleratorHooks(accelerator, manager, self._providers)
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
            raise _no_longer_registered(accelerator)
        return hooks


def _no_longer_registered(accelerator: str) -> AcceleratorNotFoundError:
    return AcceleratorNotFoundError(
        f"accelerator {accelerator!r} is no longer registered in this registry (its plugin "
        f"was unregistered); select one again with get_accelerator()",
        requested=accelerator,
        known=[],
        suggestion=None,
    )
