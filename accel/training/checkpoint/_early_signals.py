"""Preemption signals noted from a run's first call into accel, before any guard.

A run spends its first seconds importing torch and building its model and process
group, and SLURM's ``--signal`` comes up to 60 s earlier than asked: a SIGUSR1 or
SIGTERM that arrives before :class:`~accel.training.checkpoint.PreemptionGuard` is
entered would end the process by its default action, without a checkpoint, and a batch
script that requeues only a run that left cleanly would not requeue it. So the first
call into accel that a run makes (selecting its accelerator, starting its process
group) installs a handler that only notes the signal; the guard takes the note over
when it is entered (and at each read), and the loop saves and leaves at its first step.

Nothing happens at import. The handler is installed once per process, from the main
thread only (Python sets handlers nowhere else), and only for a signal whose handler
is still the default one: a handler an embedding library or the user set (or
``SIG_IGN``) is left alone. It stays for the rest of the process (a guard puts it back
on exit), so a signal between two guards or after the last one is noted too, and does
not stop a process that never enters a guard again.

Whether it is installed is ``$ACCEL_EARLY_SIGNALS``: unset (or empty), under SLURM only
(``$SLURM_JOB_ID`` set), where every signal that asks a job to stop is followed by
SIGKILL once ``KillWait`` is over, so a noted signal never leaves a process that cannot
be stopped; ``1`` everywhere; ``0`` nowhere (the signals keep their default action until
a guard is entered, as before). Any other value warns (naming the variable, its value and
the accepted ones) and is read as unset: a misspelt switch for signal handling never
keeps a run from selecting its accelerator.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Final

from accel._util import names
from accel._util.warn import warn_at_caller
from accel.errors import PluginWarning

__all__ = [
    "DEFAULT_SIGNALS",
    "EARLY_SIGNALS_ENV",
    "early_signals_problem",
    "note_early_signals",
    "take_early_signal",
]

#: What the guard notes by default, and what is noted before it: SIGTERM (Kubernetes,
#: spot VMs, ``scancel``, SLURM's time limit) and SIGUSR1 (SLURM's ``--signal=USR1@90``).
DEFAULT_SIGNALS: Final = (signal.SIGTERM, signal.SIGUSR1)

#: Environment variable: ``1`` notes the signals from the first call into accel on
#: everywhere, ``0`` nowhere; unset, only under SLURM.
EARLY_SIGNALS_ENV: Final = names.EARLY_SIGNALS_ENV

_ON: Final = ("1", "true", "yes", "on")
_OFF: Final = ("0", "false", "no", "off")

#: The signals noted and not yet taken by a guard, oldest first. A list, since a
#: handler may run between any two bytecodes: ``append`` and ``pop`` are each atomic.
_NOTED: Final[list[int]] = []
#: The unrecognised values of ``$ACCEL_EARLY_SIGNALS`` warned about already.
_WARNED: Final[set[str]] = set()
#: Whether this process installed its handlers already (set in the main thread only).
_installed = False


def note_early_signals() -> None:
    """Note SIGTERM and SIGUSR1 from now on, where ``$ACCEL_EARLY_SIGNALS`` says so and
    their handlers are still the default ones; idempotent and cheap once done.

    A value of ``$ACCEL_EARLY_SIGNALS`` accel does not recognise warns
    (:class:`~accel.PluginWarning`) and counts as unset.
    """
    global _installed

    wanted = _wanted()  # read at every call: a bad value warns wherever it is met
    if _installed or not wanted:
        return
    if threading.current_thread() is not threading.main_thread():
        return  # handlers are set in the main thread only: its next call installs them
    for number in DEFAULT_SIGNALS:
        if signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, _note)
    _installed = True


def take_early_signal() -> int | None:
    """The first signal noted since the last take (``None``: none); the guard's."""
    taken = None
    while _NOTED:
        number = _NOTED.pop(0)  # a signal noted meanwhile stays for the next take
        taken = number if taken is None else taken
    return taken


def _note(number: int, frame: FrameType | None) -> None:
    _NOTED.append(number)


def early_signals_problem() -> str | None:
    """What is wrong with ``$ACCEL_EARLY_SIGNALS`` (``None``: nothing), for the
    warning and for ``accel list``."""
    raw = os.environ.get(EARLY_SIGNALS_ENV, "")
    value = raw.strip().lower()
    if not value or value in _ON or value in _OFF:
        return None
    return (
        f"${EARLY_SIGNALS_ENV}={raw!r} is not a value accel recognises, so it is read as "
        f"unset: SIGTERM and SIGUSR1 are noted from the first call into accel under SLURM "
        f"only. Set it to one of {', '.join(map(repr, _ON))} to note them everywhere, to "
        f"one of {', '.join(map(repr, _OFF))} to leave them their default action until "
        f"preemption_guard() is entered, or unset it."
    )


def _wanted() -> bool:
    raw = os.environ.get(EARLY_SIGNALS_ENV, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    problem = early_signals_problem()
    if problem is not None and raw not in _WARNED:
        _WARNED.add(raw)  # once per value: every selection would repeat it
        warn_at_caller(problem, PluginWarning)
    return bool(os.environ.get("SLURM_JOB_ID"))
