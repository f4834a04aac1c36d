"""The exceptions accel raises.

Every message says what was asked, what was found, and what to do about it.
`AcceleratorError` is the base, so ``except accel.AcceleratorError`` catches
everything accel itself raises; each subclass also derives from the built-in
exception a caller would naturally expect.
"""

from __future__ import annotations

__all__ = [
    "AcceleratorError",
    "AcceleratorNotFoundError",
    "AcceleratorUnavailableError",
    "PluginError",
    "PluginWarning",
    "TyingWarning",
    "WeightTyingError",
]


class AcceleratorError(Exception):
    """Base class of every error accel raises on purpose."""


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
    """A plugin could not be loaded; the others keep working."""


class GradientSyncWarning(UserWarning):
    """``acc.no_sync(model)`` cannot skip the gradient all-reduce it was asked to skip:
    ``model`` is the module a ``DistributedDataParallel`` wraps (``ddp.module``), whose
    ``backward()`` all-reduces all the same. Pass the wrapper, ``acc.no_sync(ddp)``."""


class TyingWarning(UserWarning):
    """A move kept the model's ties as they were before it, though something asked
    otherwise: the model's own ``tie_weights()`` would have changed them.

    Given when accel undid ties that ``tie_weights()`` added (a checkpoint saved
    untied, loaded with a config that ties), under every ``tie_check`` but ``"off"``,
    as transformers itself warns; and with ``tie_check="warn"`` for anything else that
    would have raised :class:`WeightTyingError`.
    """
