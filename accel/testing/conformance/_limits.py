"""What a device cannot do: the declaration a vendor's CI gives the kit.

One field per capability, its value the reason the device lacks it (``None``: it has
it), as SQLAlchemy's ``requirements.py`` has one property per feature. A field, not a
free-form mapping, so that a misspelt capability is an error when the declaration is
built rather than a promise that silently keeps running.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from accel._util.names import closest_name
from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__ = ["CAPABILITIES", "Limits", "load_limits"]

#: Each capability a promise may need, and what having it means.
CAPABILITIES: dict[str, str] = {
    "forward": (
        "runs a model's forward and backward pass on the device (matmul, embedding lookups, sums)"
    ),
    "reductions": "reduces on the device: sums and norms (clip_grad_norm_)",
    "random": "draws random numbers on the device (torch.rand(..., device=...))",
    "autocast": "torch.autocast runs on the device type",
    "compile": "torch.compile runs a model on the device with the accelerator's backend",
    "distributed": (
        "two processes on this machine run the accelerator's distributed backend "
        "(an all-reduce, a DDP step)"
    ),
}


@dataclass(frozen=True)
class Limits:
    """What the device under test cannot do, each with the reason.

    >>> Limits(compile="no inductor backend for this device yet").declared()
    {'compile': 'no inductor backend for this device yet'}

    A promise that needs a declared capability is skipped with its reason; every other
    promise must hold. Declare only what the device truly lacks: the kit cannot tell a
    declared gap from a bug it hides.
    """

    #: See :data:`CAPABILITIES` for what each field means.
    forward: str | None = None
    reductions: str | None = None
    random: str | None = None
    autocast: str | None = None
    compile: str | None = None
    distributed: str | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            reason = getattr(self, field.name)
            if reason is None:
                continue
            if not isinstance(reason, str):
                raise AcceleratorTypeError(
                    f"Limits.{field.name} must be the reason the device cannot do it (a "
                    f"str) or None, got {type(reason).__name__}"
                )
            if not reason.strip():
                raise AcceleratorValueError(
                    f"Limits.{field.name} is declared without a reason; say why the device "
                    f"cannot do it ({CAPABILITIES[field.name]})"
                )

    def reason(self, capability: str) -> str | None:
        """Why the device cannot do ``capability``; ``None`` when it can."""
        if capability not in CAPABILITIES:
            raise AcceleratorValueError(
                f"no capability is called {capability!r};{_did_you_mean(capability)} "
                f"known: {', '.join(CAPABILITIES)}"
            )
        reason: str | None = getattr(self, capability)
        return reason

    def declared(self) -> dict[str, str]:
        """Every declared capability and its reason."""
        return {
            field.name: getattr(self, field.name)
            for field in fields(self)
            if getattr(self, field.name) is not None
        }


def _did_you_mean(name: str) -> str:
    close = closest_name(name, CAPABILITIES)
    return f" Did you mean {close!r}?" if close else ""


def _refusing_unknown_capabilities(generated: Callable[..., None]) -> Callable[..., None]:
    """``Limits.__init__``, saying which capability a misspelt keyword meant."""

    @functools.wraps(generated)
    def __init__(self: Limits, *args: Any, **reasons: Any) -> None:
        unknown = next((name for name in reasons if name not in CAPABILITIES), None)
        if unknown is not None:
            raise AcceleratorTypeError(
                f"Limits() got an unknown capability {unknown!r}.{_did_you_mean(unknown)} "
                f"The capabilities: {', '.join(CAPABILITIES)}; declare each one the device "
                f"lacks with the reason, e.g. Limits(compile='no inductor backend yet')."
            )
        generated(self, *args, **reasons)

    return __init__


# The generated __init__ refuses a misspelt capability with a bare TypeError. Replaced
# after the class is built, so that type checkers still see the generated signature
# (and flag the misspelling before anything runs).
Limits.__init__ = _refusing_unknown_capabilities(Limits.__init__)  # type: ignore[method-assign]


def load_limits(spec: str) -> Limits:
    """The :class:`Limits` object named ``"module:attribute"`` (the vendor's declaration).

    :raises ValueError: ``spec`` is not ``module:attribute``, or the module does not
        import or lacks the attribute.
    :raises TypeError: the attribute is not a :class:`Limits`.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise AcceleratorValueError(
            f"limits: expected MODULE:ATTRIBUTE such as 'my_plugin.conformance:LIMITS', "
            f"got {spec!r}"
        )
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise AcceleratorValueError(f"limits: cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AcceleratorValueError(
                f"limits: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not isinstance(target, Limits):
        raise AcceleratorTypeError(
            f"limits: {spec!r} is a {type(target).__name__}, not an "
            f"accel.testing.conformance.Limits"
        )
    return target
