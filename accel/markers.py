"""The pluggy markers of the ``accel`` project.

Plugin authors decorate their hook implementations with :data:`hookimpl`;
:data:`hookspec` marks the specifications in :mod:`accel.hookspecs`.
"""

from __future__ import annotations

from typing import Final

import pluggy

__all__ = ["hookimpl", "hookspec"]

#: pluggy project name, and the entry-point group third-party plugins register under.
PROJECT_NAME: Final = "accel"

hookspec: Final = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl: Final = pluggy.HookimplMarker(PROJECT_NAME)
