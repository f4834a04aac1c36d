"""Which accelerators a registry has, who provides each, and which names select them.

Plain data: no pluggy, no torch, no probing. The registry owns one catalog and keeps
it in step with its hook dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

from accel._util.names import AUTO, PLUGINS_ENV
from accel.errors import PluginError
from accel.types import AcceleratorSpec

__all__ = ["BUILTIN_PROVIDER", "Catalog", "Conflict", "Registration"]

#: The provider of accel's own plugins.
BUILTIN_PROVIDER: Final = "built-in"


@dataclass(frozen=True)
class Registration:
    """One accelerator, as a plugin declared it."""

    spec: AcceleratorSpec
    plugin: object
    #: ``"built-in"``, the distribution that shipped the plugin (``"name version"``),
    #: or the plugin's class or module for a plugin registered in code.
    provider: str


@dataclass(frozen=True)
class Conflict:
    """A name or alias a new plugin wants that another provider already has."""

    #: The disputed name or alias.
    name: str
    #: The registration that holds it now.
    holder: Registration
    #: Whether ``name`` is a canonical name on either side (not only an alias).
    is_canonical: bool


@final
class Catalog:
    """Registrations by canonical name, and every name and alias that selects them.

    A name or alias belongs to exactly one provider. An alias may be shared by
    several accelerators of one provider (the built-in ``gpu`` names ``cuda`` and
    ``mps``): it then selects the best available of them. A name that two
    providers claim is *disputed*: selecting it raises :class:`PluginError` naming
    every claimant, whatever order they were installed in.
    """

    __slots__ = ("_alias_disputes", "_claims", "_disputes", "_registrations")

    def __init__(self) -> None:
        self._registrations: dict[str, Registration] = {}
        # Every name and alias -> the canonical names it selects, in registration order.
        self._claims: dict[str, list[str]] = {}
        # Disputed name -> every provider that claims it, sorted.
        self._disputes: dict[str, tuple[str, ...]] = {}
        # Alias a plugin kept out by a dispute declared -> the disputed name it is an
        # alias of: disputed too, as it is when that plugin happens to load first.
        self._alias_disputes: dict[str, str] = {}

    def conflicts(self, specs: list[AcceleratorSpec], provider: str) -> list[Conflict]:
        """What ``specs`` from ``provider`` would take from the plugins already here."""
        found: list[Conflict] = []
        for spec in specs:
            if AUTO in (spec.name, *spec.aliases):
                raise PluginError(f"{provider}: 'auto' is a reserved name, not an accelerator")
            for key in (spec.name, *spec.aliases):
                for holder_name in self._claims.get(key, []):
                    holder = self._registrations[holder_name]
                    is_canonical = key in (spec.name, holder.spec.name)
                    if is_canonical or holder.provider != provider:
                        found.append(Conflict(key, holder, is_canonical))
        return found

    def add(self, plugin: object, specs: list[AcceleratorSpec], provider: str) -> None:
        """Record ``specs``; the caller has dealt with :meth:`conflicts` first."""
        for spec in specs:
            self._registrations[spec.name] = Registration(spec, plugin, provider)
            for key in (spec.name, *spec.aliases):
                self._claims.setdefault(key, []).append(spec.name)

    def remove(self, plugin: object) -> None:
        """Forget every accelerator ``plugin`` declared."""
        kept = {name: r for name, r in self._registrations.items() if r.plugin is not plugin}
        claims = {key: [n for n in names if n in kept] for key, names in self._claims.items()}
        self._registrations = kept
        self._claims = {key: names for key, names in claims.items() if names}

    def dispute(self, conflicts: list[Conflict], provider: str) -> None:
        """Mark each conflict's name as claimed by its holder and ``provider``: it selects
        nothing."""
        for c in conflicts:
            claimants = {*self._disputes.get(c.name, ()), c.holder.provider, provider}
            self._disputes[c.name] = tuple(sorted(claimants))

    def dispute_aliases(self, specs: list[AcceleratorSpec]) -> None:
        """Mark the aliases of ``specs`` (disputed names, declared by a plugin kept out of
        the registry by that dispute) as disputed with them."""
        for spec in specs:
            for alias in spec.aliases:  # never the name itself (AcceleratorSpec drops it)
                self._alias_disputes.setdefault(alias, spec.name)

    def disputed_by(self, name: str) -> tuple[str, ...]:
        """The providers disputing ``name``; empty when it is not disputed."""
        return self._disputes.get(name, ())

    def check_undisputed(self, key: str, requested: str, source: str) -> None:
        """Raise :class:`PluginError` if selecting ``key`` (a name or alias) would select
        a disputed name: itself, one of the accelerators it selects, or the name it is a
        kept-out plugin's alias of."""
        selects = [key, *self._claims.get(key, []), self._alias_disputes.get(key, "")]
        name = next((name for name in selects if name in self._disputes), None)
        if name is None:
            return
        providers = self._disputes[name]
        raise PluginError(
            f"cannot select {requested!r}{source}: the name {name!r} is claimed by "
            f"{len(providers)} installed plugins ({', '.join(providers)}), so accel will not "
            f"guess which one you mean. Uninstall all but one of them, or load one with "
            f"{PLUGINS_ENV}=DISTRIBUTION."
        )

    def candidates(self, key: str) -> list[Registration]:
        """The registrations ``key`` (a canonical name or alias) may select, ranked."""
        claimed = (self._registrations[name] for name in self._claims.get(key, ()))
        return sorted(claimed, key=_rank)

    def get(self, canonical: str) -> Registration | None:
        return self._registrations.get(canonical)

    def names(self) -> list[str]:
        """Every canonical name and alias, sorted."""
        return sorted(self._claims)

    def ranked(self) -> list[Registration]:
        """Every registration in ``"auto"`` order: highest priority first, then by
        canonical name, so the order never depends on install or load order."""
        return sorted(self._registrations.values(), key=_rank)


def _rank(registration: Registration) -> tuple[int, str]:
    """The ``"auto"`` order's key: highest priority first, then canonical name."""
    return (-registration.spec.priority, registration.spec.name)
