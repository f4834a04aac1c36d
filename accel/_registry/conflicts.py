"""The messages and warnings of a name two plugins claim, for the registry's ``_add``."""

from __future__ import annotations

from accel._registry.catalog import BUILTIN_PROVIDER, Conflict
from accel._util.names import PLUGINS_ENV
from accel._util.warn import warn_at_caller
from accel.errors import PluginError, PluginWarning
from accel.types import AcceleratorSpec

__all__ = [
    "builtin_conflict_error",
    "conflict_error",
    "warn_builtin_aliases",
    "warn_disputed_alias",
]


def _claiming_name(conflict: Conflict, specs: list[AcceleratorSpec]) -> str:
    return next(s.name for s in specs if conflict.name in (s.name, *s.aliases))


def builtin_conflict_error(
    conflict: Conflict, specs: list[AcceleratorSpec], label: str, provider: str
) -> PluginError:
    holder = conflict.holder
    return PluginError(
        f"accelerator name {conflict.name!r} belongs to the built-in {holder.spec.name!r}; "
        f"{_claiming_name(conflict, specs)!r} from {provider} (plugin {label!r}) claims it too, so "
        f"that plugin is not registered and the built-in keeps the name. Ask its authors "
        f"for a name of its own, or, registering in code, pass override=True to replace the "
        f"built-in on purpose.",
        conflicting_names=(conflict.name,),
    )


def warn_builtin_aliases(
    specs: list[AcceleratorSpec], dropped: list[Conflict], label: str, provider: str
) -> None:
    for name in dict.fromkeys(conflict.name for conflict in dropped):
        held_by = [repr(c.holder.spec.name) for c in dropped if c.name == name]
        claimant = next(s.name for s in specs if name in s.aliases)
        warn_at_caller(
            f"accel plugin {label!r} from {provider} declares the alias {name!r} for "
            f"{claimant!r}, but the built-in {' and '.join(held_by)} has that alias; the "
            f"built-in keeps it, and {claimant!r} is registered without it (select it as "
            f"{claimant!r}). Ask the plugin's authors to drop the alias.",
            PluginWarning,
        )


def warn_disputed_alias(
    conflict: Conflict, specs: list[AcceleratorSpec], label: str, provider: str
) -> None:
    warn_at_caller(
        f"accel plugin {label!r} from {provider} declares the alias {conflict.name!r} for "
        f"{_claiming_name(conflict, specs)!r}, but {conflict.holder.spec.name!r} from "
        f"{conflict.holder.provider} has it too; the alias now selects neither (selecting "
        f"it raises PluginError naming both), while their own names still work. Uninstall "
        f"one of them, or load only one with {PLUGINS_ENV}=DISTRIBUTION.",
        PluginWarning,
    )


def conflict_error(
    conflict: Conflict,
    specs: list[AcceleratorSpec],
    label: str,
    provider: str,
    named: set[str],
    *,
    in_code: bool = False,
) -> PluginError:
    """:param named: every name of ``specs`` the conflict leaves disputed, for
    ``conflicting_names`` (in the order the plugin declares them).
    :param in_code: the second claimant is being registered in code, where installing
    and ``$ACCEL_PLUGINS`` are beside the point."""
    holder = conflict.holder
    claimant = _claiming_name(conflict, specs)
    remedy = (
        "Give yours another name, or pass override=True to replace the built-in on purpose."
        if in_code and holder.provider == BUILTIN_PROVIDER
        else "Register each accelerator once: unregister the registered plugin first "
        "(registry.unregister(plugin)), or pass override=True to replace it on purpose."
        if in_code
        else f"Uninstall one of them, load only one with {PLUGINS_ENV}=..., or, registering "
        f"in code, pass override=True to replace the existing one on purpose."
    )
    return PluginError(
        f"accelerator name {conflict.name!r} is claimed twice: by {holder.spec.name!r} from "
        f"{holder.provider} and by {claimant!r} from {provider} (plugin {label!r}). {remedy}",
        conflicting_names=tuple(
            dict.fromkeys(key for s in specs for key in (s.name, *s.aliases) if key in named)
        ),
    )
