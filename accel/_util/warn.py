"""One way to warn: at the user's line, however deep inside accel the warning starts."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import warnings
from typing import Any, NamedTuple

import pluggy

# Frames in these files are accel's own (or call into it: pluggy runs the hooks,
# contextlib runs a context manager's exit), never the line a user wrote.
_INSIDE = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (os.path.dirname(os.path.abspath(__file__)), inspect.getfile(pluggy.PluginManager))
)
_CONTEXTLIB = os.path.abspath(contextlib.__file__)


def _inside(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_INSIDE) or path == _CONTEXTLIB


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """:func:`warnings.warn`, attributed to the first frame outside accel.

    A fixed ``stacklevel`` is wrong as soon as a second public entry point reaches the
    same warning (plugin loading runs from ``get_accelerator``, ``list_accelerators``,
    ``accel list``, ...), so the level is counted from the stack.
    """
    level = 2  # the caller of this function
    frame = sys._getframe(1)
    while frame.f_back is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


class CallerLine(NamedTuple):
    """The user's line a later warning is about, read when it was reached (a frame's
    line number moves on as its code runs)."""

    filename: str
    lineno: int
    module_globals: dict[str, Any]


def caller_line() -> CallerLine | None:
    """The first line outside accel on the stack now, for :func:`warn_at`."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
    if _inside(frame.f_code.co_filename):
        return None
    return CallerLine(frame.f_code.co_filename, frame.f_lineno, frame.f_globals)


def warn_at(line: CallerLine | None, message: str, category: type[Warning]) -> None:
    """Warn about ``line`` (from :func:`caller_line`), from wherever accel finds out
    later: inside a hook torch calls, say, where the stack has other code on top."""
    if line is None:
        warn_at_caller(message, category)
        return
    warnings.warn_explicit(
        message,
        category,
        line.filename,
        line.lineno,
        module=line.module_globals.get("__name__"),
        registry=line.module_globals.setdefault("__warningregistry__", {}),
        module_globals=line.module_globals,
    )
