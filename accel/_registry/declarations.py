"""What a plugin object is: its label for messages, the accelerators it declares, and
whether its hooks are accel's (pluggy checks their arguments when it registers it).
Every check names the plugin and says what to change, before the plugin can take part
in any call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from types import ModuleType

import pluggy

from accel import hookspecs
from accel._util.names import closest_name
from accel.errors import PluginError
from accel.types import AcceleratorSpec

__all__ = ["declared_specs", "plugin_label"]

_HOOK_NAMES = tuple(hookspecs.__all__)


def plugin_label(plugin: object) -> str:
    """A readable name for a plugin object: its module, or its class."""
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"


def declared_specs(
    plugin: object, label: str, provider: str, manager: pluggy.PluginManager
) -> list[AcceleratorSpec]:
    """Reject objects pluggy cannot hold, that implement no accel hook, or that implement
    a hook accel does not have (typos, stale names); call the plugin's
    ``register_accelerators`` (if any) and check what it returns.

    An empty list means a cross-cutting plugin.
    """
    try:
        hash(plugin)
    except TypeError:
        raise PluginError(
            f"plugin {label!r} from {provider} must be hashable (pluggy keeps plugins in "
            f"sets); use a module, a class instance, or a dataclass with eq=False"
        ) from None
    # Every hook implementation, as pluggy will read it when the plugin is registered.
    hooks = {
        attr: opts
        for attr in dir(plugin)
        if (opts := manager.parse_hookimpl_opts(plugin, attr)) is not None
    }
    if not hooks:
        hint = " (a class: pass an instance of it)" if isinstance(plugin, type) else ""
        raise PluginError(
            f"plugin {label!r} from {provider} has no accel hooks{hint}: mark its hook "
            f"implementations with @accel.hookimpl; the hooks are listed in accel.hookspecs"
        )
    # What pluggy's check_pending refuses: a hook without a spec, unless marked optional.
    unknown = [
        hook
        for attr, opts in hooks.items()
        if (hook := opts["specname"] or attr) not in _HOOK_NAMES and not opts["optionalhook"]
    ]
    if unknown:
        close = closest_name(unknown[0], _HOOK_NAMES)
        hint = f" Did you mean {close!r}?" if close else ""
        raise PluginError(
            f"plugin {label!r} from {provider} implements unknown hook "
            f"{', '.join(map(repr, unknown))}.{hint} accel's hooks are: "
            f"{', '.join(_HOOK_NAMES)}."
        )
    if "register_accelerators" not in hooks:
        return []
    if isinstance(plugin, type):
        raise PluginError(f"plugin {label!r} from {provider} is a class; register an instance")
    try:
        returned = plugin.register_accelerators()  # type: ignore[attr-defined]
    except Exception as exc:
        raise PluginError(
            f"plugin {label!r} from {provider} raised in register_accelerators: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(returned, AcceleratorSpec):
        returned = [returned]
    listed = isinstance(returned, Iterable) and not isinstance(returned, (str, bytes, Mapping))
    specs = list(returned) if listed else []
    if not listed or not all(isinstance(spec, AcceleratorSpec) for spec in specs):
        raise PluginError(
            f"plugin {label!r} from {provider}: register_accelerators must return "
            f"AcceleratorSpec objects, got {type(returned).__name__}: {returned!r}"
        )
    twice = [name for name, n in Counter(spec.name for spec in specs).items() if n > 1]
    if twice:
        raise PluginError(f"plugin {label!r} declares accelerator {twice[0]!r} twice")
    return specs
