"""The exceptions accel raises.

Every message says what was asked, what was found, and what to do about it.

The rule (attrs' way): every exception accel raises on purpose is an
`AcceleratorError` subclass that also derives from the built-in exception a caller
would naturally catch (``AcceleratorValueError`` is a ``ValueError``), so both
``except accel.AcceleratorError`` and ``except ValueError`` work. Exceptions that
accel only lets through (torch's, pluggy's, the OS's, a plugin hook's own) keep their
type; so do the OS's errors when accel re-raises them with the checkpoint named in
the message (same ``OSError`` subclass, same ``errno``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AcceleratorError",
    "AcceleratorFileExistsError",
    "AcceleratorFileNotFoundError",
    "AcceleratorKeyError",
    "AcceleratorNotFoundError",
    "AcceleratorOSError",
    "AcceleratorRuntimeError",
    "AcceleratorTypeError",
    "AcceleratorUnavailableError",
    "AcceleratorValueError",
    "GradientSyncWarning",
    "PluginError",
    "PluginWarning",
    "RankGeneratorsWarning",
    "TyingWarning",
    "WeightTyingError",
]


class AcceleratorError(Exception):
    """Base class of every error accel raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickling re-runs __init__ with the message alone, which the subclasses'
        # keyword-only arguments refuse; a worker process handing its error back (Ray
        # Train's, multiprocessing's) would then lose it. Rebuild from the message and
        # the attributes (notes included) instead.
        return (_rebuild, (type(self), self.args), self.__dict__)


def _rebuild(cls: type[AcceleratorError], args: tuple[Any, ...]) -> AcceleratorError:
    return cls.__new__(cls, *args)


class AcceleratorTypeError(AcceleratorError, TypeError):
    """An argument (or a value a plugin returned) has the wrong type."""


class AcceleratorValueError(AcceleratorError, ValueError):
    """An argument has the right type but a value accel cannot use (also a file that is
    not a checkpoint, or an environment variable that cannot be read)."""


class AcceleratorKeyError(AcceleratorError, KeyError):
    """A key that was asked for is not there (an entry missing from a checkpoint)."""


class AcceleratorRuntimeError(AcceleratorError, RuntimeError):
    """A call was made where it cannot work (outside the main thread, say)."""


class AcceleratorOSError(AcceleratorError, OSError):
    """A file operation cannot be done as asked; ``errno`` and ``filename`` are set
    where there is one."""


class AcceleratorFileNotFoundError(AcceleratorOSError, FileNotFoundError):
    """There is no checkpoint at the path given."""


class AcceleratorFileExistsError(AcceleratorOSError, FileExistsError):
    """A path that must be new (a sharded checkpoint's) exists already."""


class AcceleratorNotFoundError(AcceleratorError, LookupError):
    """No registered accelerator has the requested name or alias."""

    def __init__(self, message: str, *, requested: str, known: list[str], suggestion: str | None):
        super().__init__(message)
        #: The name as the caller gave it.
        self.requested = requested
        #: Every name and alias the registry knows.
        self.known = known
        #: The closest known name, if any is close.
        self.suggestion = suggestion


class AcceleratorUnavailableError(AcceleratorError, RuntimeError):
    """The accelerator is known, but cannot be used in this process."""

    def __init__(self, message: str, *, accelerator: str, reason: str = ""):
        super().__init__(message)
        #: Canonical name of the accelerator that was asked for.
        self.accelerator = accelerator
        #: Why it is unavailable, as its plugin reported it.
        self.reason = reason


class WeightTyingError(AcceleratorError, RuntimeError):
    """A move would change which tensors are tied: a tied group came apart, or slots
    that held separate tensors before the move would share one after it.

    Raised (with ``tie_check="error"``) after the model's own ``tie_weights()`` ran;
    the model is then restored as it was before the move.
    """

    def __init__(
        self,
        message: str,
        *,
        count_before: int,
        count_after: int,
        broken_groups: list[tuple[str, ...]],
        appeared_groups: list[tuple[str, ...]] | None = None,
    ):
        super().__init__(message)
        #: Unique parameters before the move.
        self.count_before = count_before
        #: Unique parameters after the move, the re-tie and the model's ``tie_weights()``.
        self.count_after = count_after
        #: The qualified names of every group that came apart.
        self.broken_groups = broken_groups
        #: The qualified names of every group that appeared: slots that held separate
        #: tensors before the move and one tensor after it (the whole group as it was
        #: then, e.g. ``("transformer.wte.weight", "lm_head.weight")``).
        self.appeared_groups = [] if appeared_groups is None else appeared_groups


class PluginError(AcceleratorError):
    """A plugin is malformed, conflicts with another, or misbehaved."""

    def __init__(self, message: str, *, conflicting_names: tuple[str, ...] = ()):
        super().__init__(message)
        #: The accelerator names this plugin claimed that another plugin holds, and
        #: its aliases of those names (empty unless the error is such a conflict).
        self.conflicting_names = conflicting_names


class PluginWarning(UserWarning):
    """Something about the installed plugins, or the variables that choose them, is
    wrong, and accel carried on without it; the other accelerators keep working.

    Given when a third-party plugin fails to load (it is skipped and listed by
    ``accel list`` with its error); when ``ACCEL_PLUGINS`` names a plugin that is not
    installed, or holds only separators (so it allows none); when a boolean variable
    such as ``ACCEL_DISABLE_PLUGIN_AUTOLOAD`` or ``ACCEL_EARLY_SIGNALS`` holds a value
    that is neither true nor false; and when a plugin claims an alias that a built-in
    or another plugin holds (the alias is kept by the built-in or left to neither).
    """


class GradientSyncWarning(UserWarning):
    """``acc.no_sync(model)`` cannot skip the gradient all-reduce it was asked to skip:
    ``model`` is the module a ``DistributedDataParallel`` wraps (``ddp.module``), whose
    ``backward()`` all-reduces all the same. Pass the wrapper, ``acc.no_sync(ddp)``."""


class RankGeneratorsWarning(UserWarning):
    """A checkpoint holds the random generators of another number of ranks than the
    job that loads it: rank ``r`` gets saved rank ``r``'s, a rank beyond the saved
    ones rank 0's, and the draws after this resume differ from an uninterrupted run."""


class TyingWarning(UserWarning):
    """A move kept the model's ties as they were before it, though something asked
    otherwise: the model's own ``tie_weights()`` would have changed them.

    Given when accel undid ties that ``tie_weights()`` added (a checkpoint saved
    untied, loaded with a config that ties), under every ``tie_check`` but ``"off"``,
    as transformers itself warns; and with ``tie_check="warn"`` for anything else that
    would have raised :class:`WeightTyingError`.
    """
