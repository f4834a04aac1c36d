"""The checks of ``acc.save``'s and ``acc.load``'s arguments, made before anything is
read or written, each error saying what was expected and what was given."""

from __future__ import annotations

import os
from collections.abc import Mapping

from accel.errors import AcceleratorTypeError

__all__ = ["checked_path", "checked_state"]


def checked_path(operation: str, path: object) -> None:
    """:raises TypeError: ``path`` is neither a str nor an ``os.PathLike``."""
    if not isinstance(path, (str, os.PathLike)):
        raise AcceleratorTypeError(
            f"{operation} expects a file path (str or os.PathLike), got {type(path).__name__}"
        )


def checked_state(state: object) -> None:
    """:raises TypeError: ``state`` of ``load(path, state)`` is neither a dict nor one
    object with ``load_state_dict``."""
    if not (state is None or isinstance(state, Mapping) or hasattr(state, "load_state_dict")):
        raise AcceleratorTypeError(
            f"load(path, state) expects state to be a dict of the objects to restore "
            f"(model, optimizer, ...) or one object with load_state_dict, got "
            f"{type(state).__name__}"
        )
