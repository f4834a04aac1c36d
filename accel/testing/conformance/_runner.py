"""Run the promises against one accelerator and report each one's outcome."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

import accel
from accel._util.names import closest_name
from accel.accelerator import Accelerator
from accel.errors import AcceleratorValueError
from accel.testing.conformance._batches import PROMISES as _BATCHES
from accel.testing.conformance._catalog import Promise, Subject
from accel.testing.conformance._checkpoints import PROMISES as _CHECKPOINTS
from accel.testing.conformance._distributed import PROMISES as _DISTRIBUTED
from accel.testing.conformance._generators import PROMISES as _GENERATORS
from accel.testing.conformance._limits import Limits
from accel.testing.conformance._moves import PROMISES as _MOVES
from accel.testing.conformance._runtime import PROMISES as _RUNTIME
from accel.testing.conformance._selection import PROMISES as _SELECTION
from accel.testing.conformance._step import PROMISES as _STEP

if TYPE_CHECKING:
    from accel.registry import AcceleratorRegistry

__all__ = [
    "Outcome",
    "all_promises",
    "check_promise",
    "run",
    "select",
    "skip_reason",
    "subject_for",
]

#: Every promise, in the order a report lists them. (Each check module is imported by
#: its full name, never read off this package, which imports this module: no circle.)
_PROMISES: tuple[Promise, ...] = (
    *_SELECTION,
    *_MOVES,
    *_BATCHES,
    *_STEP,
    *_GENERATORS,
    *_CHECKPOINTS,
    *_RUNTIME,
    *_DISTRIBUTED,
)


@dataclass(frozen=True)
class Outcome:
    """What checking one promise found (one row of ``accel conformance``, one item of
    its ``--json`` list)."""

    #: The promise's name, e.g. ``"moves.ties_kept_back_to_cpu"``.
    promise: str
    outcome: Literal["passed", "failed", "skipped"]
    #: Why it failed or was skipped; empty when it passed.
    reason: str = ""


def all_promises() -> tuple[Promise, ...]:
    """Every promise the kit checks, in report order."""
    return _PROMISES


def select(names: Iterable[str] | None) -> tuple[Promise, ...]:
    """The promises named (a name or an ``area.`` prefix each); ``None``: all of them.

    :raises ValueError: a name matches no promise.
    """
    if names is None:
        return _PROMISES
    chosen: list[Promise] = []
    for name in names:
        matches = [p for p in _PROMISES if p.name == name or p.name.startswith(f"{name}.")]
        if not matches:
            areas = dict.fromkeys(p.name.partition(".")[0] for p in _PROMISES)
            close = closest_name(name, [*areas, *(p.name for p in _PROMISES)])
            hint = f" Did you mean {close!r}?" if close else ""
            raise AcceleratorValueError(
                f"no promise is called {name!r}.{hint} Name a promise or an area "
                f"({', '.join(areas)}); the kit's promises: "
                f"{', '.join(p.name for p in _PROMISES)}"
            )
        chosen.extend(p for p in matches if p not in chosen)
    return tuple(p for p in _PROMISES if p in chosen)


def skip_reason(promise: Promise, limits: Limits) -> str | None:
    """The declared reason ``promise`` cannot hold on this device; ``None``: it must."""
    reasons = [
        f"declared: no {need} ({why})"
        for need in promise.needs
        if (why := limits.reason(need)) is not None
    ]
    return "; ".join(reasons) or None


def subject_for(
    accelerator: str | Accelerator,
    workdir: Path,
    *,
    limits: Limits,
    registry: AcceleratorRegistry | None = None,
) -> Subject:
    """The accelerator to check, selected as a user would; an unknown or unavailable one
    raises the registry's error (never a skip)."""
    chosen = registry if registry is not None else accel.default_registry()
    if isinstance(accelerator, Accelerator):
        handle, requested = accelerator, accelerator.name
    else:
        handle, requested = chosen.get_accelerator(accelerator), accelerator
    return Subject(handle, chosen, workdir, requested, limits)


def check_promise(promise: Promise, subject: Subject) -> None:
    """Check one promise in a fresh directory of its own, with the host's generator put
    back afterwards (a check seeds it; the caller's run should not see that)."""
    workdir = subject.workdir / promise.name
    workdir.mkdir(parents=True, exist_ok=True)
    own = Subject(subject.accelerator, subject.registry, workdir, subject.requested, subject.limits)
    with torch.random.fork_rng(devices=[]):
        promise.check(own)


def _why(exc: BaseException) -> str:
    """One line for a report: the error's first line, then the notes accel added to it
    ("raised in hook 'synchronize' of plugin 'npu' (torch-npu-accel 1.0)"), which name
    the plugin at fault where pytest's traceback shows them."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(exc, AssertionError):
        why = text or "a check failed"
    else:
        why = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    notes = [" ".join(str(note).split()) for note in getattr(exc, "__notes__", ())]
    return "; ".join([why, *(note for note in notes if note)])


def run(
    accelerator: str | Accelerator,
    *,
    limits: Limits | None = None,
    registry: AcceleratorRegistry | None = None,
    promises: Sequence[str] | None = None,
) -> list[Outcome]:
    """Check every promise (or the ``promises`` named) on ``accelerator``.

    :param accelerator: a name (looked up in ``registry``) or a handle.
    :param limits: what the device cannot do; those promises are skipped with the reason.
    :param registry: default :func:`accel.default_registry`. The distributed promises'
        workers always use the default registry, which finds installed plugins.
    :param promises: names or ``area`` prefixes (``"moves"``); ``None``: all.
    :raises accel.AcceleratorNotFoundError: no accelerator has that name.
    :raises accel.AcceleratorUnavailableError: it cannot be used here.
    """
    declared = limits if limits is not None else Limits()
    chosen = select(promises)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="accel-conformance-") as tmp:
        subject = subject_for(accelerator, Path(tmp), limits=declared, registry=registry)
        for promise in chosen:
            reason = skip_reason(promise, declared)
            if reason is not None:
                outcomes.append(Outcome(promise.name, "skipped", reason))
                continue
            try:
                check_promise(promise, subject)
            except Exception as exc:
                outcomes.append(Outcome(promise.name, "failed", _why(exc)))
            else:
                outcomes.append(Outcome(promise.name, "passed"))
    return outcomes
