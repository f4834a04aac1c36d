"""The registry's constructor arguments, checked before anything is stored.

Checked at once: a wrong type otherwise shows much later, or never (``"no"`` is true,
and a string is an iterable of its letters).
"""

from __future__ import annotations

from collections.abc import Iterable

from accel._util.names import DISABLE_AUTOLOAD_ENV, PLUGINS_ENV
from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__ = ["checked_arguments"]


def checked_arguments(
    entry_points: object,
    builtins: object,
    plugins: object,
    autoload: object,
    default_from_env: object,
) -> tuple[str, ...] | None:
    """The constructor's arguments checked; returns ``plugins`` as a tuple (or ``None``)."""
    if entry_points is not None and not isinstance(entry_points, str):
        raise AcceleratorTypeError(
            f"entry_points must be an entry-point group name (a str: 'accel', "
            f"'mylib.accelerators') or None to load none, got "
            f"{type(entry_points).__name__}: {entry_points!r}"
        )
    if isinstance(entry_points, str) and not entry_points.strip():
        raise AcceleratorValueError(
            f"entry_points is blank ({entry_points!r}): pass a group name such as "
            f"'mylib.accelerators', or None to load no entry points"
        )
    or_none = "True, False or None (None: unless"
    for argument, value, means in (
        ("builtins", builtins, "True or False"),
        ("autoload", autoload, f"{or_none} ${DISABLE_AUTOLOAD_ENV}=1)"),
        ("default_from_env", default_from_env, f"{or_none} a group of its own)"),
    ):
        if (value is not None or argument == "builtins") and not isinstance(value, bool):
            raise AcceleratorTypeError(
                f"{argument} must be {means}, got {type(value).__name__}: {value!r}"
            )
    if plugins is None:
        return None
    if isinstance(plugins, (str, bytes)):
        raise AcceleratorTypeError(
            f"plugins must be a list of entry-point or distribution names, got a "
            f"{type(plugins).__name__}: {plugins!r} (read as its letters); pass "
            f"plugins=[{plugins!r}]"
        )
    if not isinstance(plugins, Iterable):
        raise AcceleratorTypeError(
            f"plugins must be a list of entry-point or distribution names (or None: "
            f"${PLUGINS_ENV}, else all), got {type(plugins).__name__}: {plugins!r}"
        )
    names = tuple(plugins)
    wrong = [name for name in names if not isinstance(name, str)]
    if wrong:
        raise AcceleratorTypeError(
            f"plugins must hold names (str), but holds {type(wrong[0]).__name__}: "
            f"{wrong[0]!r}; pass entry-point or distribution names such as 'accel-vendorx'"
        )
    return names
