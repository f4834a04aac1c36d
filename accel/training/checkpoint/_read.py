"""Reading a checkpoint file: the ``load`` hook's fallback, ``torch.load`` with
``weights_only=True`` and errors that say what the file is (missing, refused, torn).
The rest of a load (whose pipeline is :mod:`accel.training.checkpoint._load`) works on
what this returns."""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import torch

from accel.errors import AcceleratorFileNotFoundError, AcceleratorValueError

__all__ = ["load_checkpoint"]


def load_checkpoint(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True)``, tensors on the CPU, with errors that say
    what the file is.

    :raises FileNotFoundError: there is no file at ``path``.
    :raises pickle.UnpicklingError: the file asks to run or build something that
        ``weights_only`` refuses (it is never run).
    :raises ValueError: the file is not a checkpoint (torn, or not ``torch.save``'s).
    """
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise AcceleratorFileNotFoundError(
            2,
            f"load: there is no checkpoint file at {name!r}"
            + (" (a directory)" if os.path.isdir(name) else "")
            + "; check the path, or find the newest one with "
            "accel.training.checkpoint.latest_checkpoint(directory)",
            name,
        )
    try:
        return torch.load(name, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = re.search(r"Unsupported (?:global|class): (?:GLOBAL )?([\w.]+)", str(exc))
        if refused is None:  # not a refusal: bytes the unpickler cannot read at all
            raise _not_a_checkpoint(name, exc) from exc
        raise pickle.UnpicklingError(
            f"load refused {name!r}: it asks to build {refused.group(1)}, which "
            f"weights_only loading does not allow, and nothing in it was run. Load only "
            f"checkpoints written by acc.save (tensors, numbers, strings, containers); if "
            f"you trust this file, allow its types with torch.serialization.add_safe_globals"
        ) from exc
    except Exception as exc:  # a torn file fails anywhere in the unpickler: KeyError, ...
        raise _not_a_checkpoint(name, exc) from exc


def _not_a_checkpoint(name: str, exc: BaseException) -> ValueError:
    return AcceleratorValueError(
        f"load: {name!r} is not a checkpoint torch can read ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}): a file cut short, or "
        f"not written by acc.save or torch.save. acc.save never leaves a torn file; load "
        f"an older checkpoint (accel.training.checkpoint.latest_checkpoint)"
    )
