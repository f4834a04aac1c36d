"""One way to warn: at the user's line, however deep inside accel the warning starts."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import warnings

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
