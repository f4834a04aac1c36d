"""Finding which plugin is at fault when a hook raises or returns nonsense.

pluggy runs hook implementations for us and does not say which one misbehaved; these
helpers work it out so that every error names the plugin to blame.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["find_returner", "note_culprit"]


def _implementation_codes(caller: Any) -> list[tuple[Any, Any]]:
    pairs = []
    for impl in caller.get_hookimpls():
        function = getattr(impl.function, "__func__", impl.function)
        code = getattr(function, "__code__", None)
        if code is not None:
            pairs.append((code, impl))
    return pairs


def note_culprit(
    exc: BaseException, caller: Any, hook_name: str, provider_of: Callable[[str], str]
) -> None:
    """Add a note naming the plugin whose hook implementation raised ``exc``."""
    codes = dict(_implementation_codes(caller))
    culprit = None
    traceback = exc.__traceback__
    while traceback is not None:
        impl = codes.get(traceback.tb_frame.f_code)
        if impl is not None:
            culprit = impl  # keep the innermost: a wrapper may sit outside it
        traceback = traceback.tb_next
    if culprit is None or getattr(exc, "_accel_noted", False):
        return
    message = (
        f"raised in hook {hook_name!r} of plugin {culprit.plugin_name!r} "
        f"({provider_of(culprit.plugin_name)})"
    )
    if hasattr(exc, "add_note"):
        exc.add_note(message)
    with contextlib.suppress(AttributeError):
        exc._accel_noted = True  # type: ignore[attr-defined]


def find_returner(caller: Any, accelerator: str, kwargs: dict[str, Any], result: Any) -> Any:
    """Re-ask each implementation of a first-result hook to find who returned ``result``."""
    arguments = {"accelerator": accelerator, **kwargs}
    for impl in reversed(caller.get_hookimpls()):
        if impl.hookwrapper or impl.wrapper:
            continue
        try:
            value = impl.function(*(arguments[arg] for arg in impl.argnames))
        except Exception:
            continue
        if value is not None and (value is result or type(value) is type(result)):
            return impl.plugin_name
    return None
