"""Naming the plugin at fault, read from pluggy's hook implementation.

When a plugin is registered, each of its hook implementations is given a thin shim
(:func:`blame_implementations`): an exception it raises gets a note naming the hook
and the plugin, and a first-result answer records who gave it (:func:`who_answered`),
so an answer accel cannot use names its plugin without calling anyone again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator
from typing import Any, cast

import pluggy

from accel._util.notes import add_note

__all__ = ["blame_implementations", "who_answered"]

# Per thread: the plugin whose implementation last gave a first-result hook's answer.
_answered = threading.local()


def who_answered() -> str | None:
    """The plugin name of the implementation that answered the last first-result call
    in this thread (read right after the call)."""
    return getattr(_answered, "who", None)


def blame_implementations(
    manager: pluggy.PluginManager, plugin: object, provider_of: Callable[[str], str]
) -> None:
    """Give each of ``plugin``'s hook implementations in ``manager`` its shim.

    pluggy computed each implementation's argument names from the function itself,
    so a shim taking ``*args`` is called exactly as the function was.
    """
    for caller in manager.get_hookcallers(plugin) or []:
        spec = caller.spec
        firstresult = bool(spec is not None and spec.opts.get("firstresult"))
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin:
                # Final in pluggy's stubs, a plain slot at run time: pluggy calls
                # impl.function(*args) with the argument names it read at registration.
                impl.function = _shim(  # type: ignore[misc]
                    impl, caller.name, provider_of, firstresult
                )


def _note(exc: BaseException, hook_name: str, plugin_name: str, provider: str) -> None:
    if getattr(exc, "_accel_noted", False):  # the innermost implementation is at fault
        return
    add_note(exc, f"raised in hook {hook_name!r} of plugin {plugin_name!r} ({provider})")
    with contextlib.suppress(AttributeError):
        exc._accel_noted = True  # type: ignore[attr-defined]


def _shim(
    impl: pluggy.HookImpl,
    hook_name: str,
    provider_of: Callable[[str], str],
    firstresult: bool,
) -> Callable[..., Any]:
    function = impl.function
    name = impl.plugin_name

    if impl.wrapper or impl.hookwrapper:

        def wrapper(*args: Any) -> Generator[Any, Any, Any]:
            try:
                return (yield from cast("Generator[Any, Any, Any]", function(*args)))
            except Exception as exc:  # an inner implementation's is noted already
                _note(exc, hook_name, name, provider_of(name))
                raise

        return wrapper

    def plain(*args: Any) -> Any:
        try:
            result = function(*args)
        except Exception as exc:
            _note(exc, hook_name, name, provider_of(name))
            raise
        if firstresult and result is not None:
            _answered.who = name
        return result

    return plain
