"""``accel list``'s check of the environment variables accel reads: a value accel
cannot use, or a name that looks like a misspelling of one, is said on stderr before
a training script fails on it (or silently ignores it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import accel
from accel._util.names import ACCELERATOR_ENV, VARIABLES, misspelt_variables
from accel.training.checkpoint._early_signals import early_signals_problem

__all__ = ["warn_about_the_variables"]


def warn_about_the_variables(one_line: Callable[[BaseException], str]) -> None:
    """Warn about each variable accel reads that it cannot use as set.

    :param one_line: how the CLI shows an exception in one line.
    """
    _warn_about_the_default(one_line)
    _warn_about_the_values()


def _warn_about_the_default(one_line: Callable[[BaseException], str]) -> None:
    """Say so when ``$ACCEL_ACCELERATOR`` names something ``get_accelerator()`` rejects.

    A typo there (``tpuu``) otherwise goes unnoticed until a training script fails.
    """
    value = os.environ.get(ACCELERATOR_ENV, "")
    if not value.strip():
        return
    try:
        accel.get_accelerator()
    except Exception as exc:
        print(
            f"accel: warning: ${ACCELERATOR_ENV}={value!r} cannot be used, so "
            f"accel.get_accelerator() without a name fails: {one_line(exc)}",
            file=sys.stderr,
        )


def _warn_about_the_values() -> None:
    """Say so when a variable accel reads holds a value it does not recognise, or an
    ``ACCEL_*`` variable looks like a misspelling of one (its setting is then ignored).

    ``$ACCEL_DISABLE_PLUGIN_AUTOLOAD`` and ``$ACCEL_PLUGINS`` warn as the plugins load.
    """
    problem = early_signals_problem()
    if problem is not None:
        print(f"accel: warning: {problem}", file=sys.stderr)
    for name, meant in misspelt_variables(os.environ):
        print(
            f"accel: warning: ${name} is set, but accel reads no such variable, so it has "
            f"no effect; did you mean ${meant}? Rename it (accel reads: "
            f"{', '.join(VARIABLES)}).",
            file=sys.stderr,
        )
