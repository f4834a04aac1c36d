"""The one error accel.distributed raises for a job it cannot set up."""

from __future__ import annotations

from accel.errors import AcceleratorError

__all__ = ["DistributedSetupError"]


class DistributedSetupError(AcceleratorError, RuntimeError):
    """The job cannot be set up as asked: a half-set or invalid launch environment,
    a group already running with another backend, a runtime that does not see the
    processes the launcher started, or an XLA runtime in SPMD mode asked for a
    process group."""

    def __init__(self, message: str, *, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        #: The launcher's variables that were expected but not set (empty if none).
        self.missing = missing


# Tracebacks and messages name the class where users import it from.
DistributedSetupError.__module__ = "accel.distributed"
