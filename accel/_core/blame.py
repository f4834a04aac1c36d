"""Finding which plugin is at fault when a hook raises.

Where pluggy runs the hook implementations it does not say which one raised; the
traceback does, so every error can name the plugin to blame. (Who *returned* a bad
result is known without this: :mod:`accel._core.hooks` walks the implementations.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from accel._util.notes import add_note

__all__ = ["note_culprit"]


def _implementation_codes(caller: Any) -> list[tuple[Any, Any]]:
    pairs = []
    for impl in caller.get_hookimpls():
        function = getattr(impl.function, "__func__", impl.function)
        code = getattr(function, "__code__", None)
        if code is not None:
            pairs.append((code, impl))
    return pairs


def note_culprit(
    exc: BaseException,
    caller: Any,
    hook_name: str,
    provider_of: Callable[[str], str],
    *,
    culprit: Any = None,
) -> None:
    """Add a note naming the plugin whose hook implementation raised ``exc``.

    :param culprit: the implementation that raised, where the caller knows it; else it
        is found in the traceback (pluggy ran the call).
    """
    if culprit is None:
        codes = dict(_implementation_codes(caller))
        traceback = exc.__traceback__
        while traceback is not None:
            impl = codes.get(traceback.tb_frame.f_code)
            if impl is not None:
                culprit = impl  # keep the innermost: a wrapper may sit outside it
            traceback = traceback.tb_next
    if culprit is None or getattr(exc, "_accel_noted", False):
        return
    add_note(
        exc,
        f"raised in hook {hook_name!r} of plugin {culprit.plugin_name!r} "
        f"({provider_of(culprit.plugin_name)})",
    )
    with contextlib.suppress(AttributeError):
        exc._accel_noted = True  # type: ignore[attr-defined]
