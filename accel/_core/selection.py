"""From a name to an accelerator handle: aliases, disputes, ``"auto"``, device indexes.

The only module that knows both the registry's parts (catalog and dispatch) and the
:class:`~accel.Accelerator` handle, so neither of them imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn, final

from accel._core.catalog import Catalog, Registration
from accel._core.dispatch import Dispatcher
from accel._core.names import (
    AUTO,
    closest_name,
    name_from_environment,
    normalize_name,
    parse_accelerator_name,
)
from accel.accelerator import Accelerator
from accel.errors import AcceleratorNotFoundError, AcceleratorUnavailableError
from accel.types import AcceleratorInfo, Availability, PluginFailure, TieCheck, checked_tie_check

__all__ = ["Selector"]


@final
class Selector:
    """Selection over one registry's catalog, dispatcher and load failures (it owns
    none of them: the registry does, and changes them under its lock)."""

    __slots__ = ("_catalog", "_dispatcher", "_failures")

    def __init__(
        self, catalog: Catalog, dispatcher: Dispatcher, failures: list[PluginFailure]
    ) -> None:
        self._catalog = catalog
        self._dispatcher = dispatcher
        self._failures = failures

    def select(self, name: str | None, tie_check: TieCheck) -> Accelerator:
        """The handle for ``name`` (see :meth:`accel.AcceleratorRegistry.get_accelerator`)."""
        checked_tie_check(tie_check)
        name, source = name_from_environment(name)
        try:
            base, index = parse_accelerator_name(name)
        except ValueError as exc:
            if source:
                raise ValueError(f"{exc} (read from{source.removeprefix(' in')})") from None
            raise
        if base == AUTO:
            if index is not None:
                raise ValueError(
                    f"'auto' takes no device index (got {name!r}); ask for a named "
                    f"accelerator such as 'cuda:{index}' instead"
                )
            registration = self._select_auto()
        else:
            registration = self._resolve(base, name, source)
        hooks = self._dispatcher.hooks(registration.spec.name)
        device = hooks.device(index, requested=name, source=source)
        return Accelerator(
            hooks, registration.spec, index=index, device=device, tie_check=tie_check
        )

    def _resolve(self, base: str, requested: str, source: str) -> Registration:
        if self._catalog.disputed_by(base):
            raise self._catalog.dispute_error(base, requested, source)
        candidates = self._catalog.candidates(base)
        if not candidates:
            known = sorted({*self._catalog.names(), AUTO})
            suggestion = closest_name(base, known)
            hint = f" Did you mean {suggestion!r}?" if suggestion else ""
            if any(normalize_name(f.name) == base for f in self._failures):
                hint += f" A plugin named {base!r} is installed but failed to load; see accel list."
            raise AcceleratorNotFoundError(
                f"unknown accelerator {requested!r}{source}.{hint} Known names: "
                f"{', '.join(known)}. Third-party accelerators come from installed plugins.",
                requested=requested,
                known=known,
                suggestion=suggestion,
            )
        # A shared alias ("gpu"): the best available of its accelerators.
        ranked = sorted(candidates, key=lambda r: (-r.spec.priority, r.spec.name))
        for registration in ranked:
            if self._dispatcher.hooks(registration.spec.name).availability().available:
                return registration
        first, *others = (registration.spec.name for registration in ranked)
        self._raise_unavailable(first, requested, source, others)

    def _raise_unavailable(
        self, canonical: str, requested: str, source: str, also: Iterable[str]
    ) -> NoReturn:
        availability = self._dispatcher.hooks(canonical).availability()
        remedy = f" To use it: {availability.remedy}." if availability.remedy else ""
        alternatives = "".join(
            f" {other!r} is not available either: {self._availability(other).reason}."
            for other in also
        )
        raise AcceleratorUnavailableError(
            f"accelerator {canonical!r} (asked for as {requested!r}{source}) is not available: "
            f"{availability.reason or 'its plugin says so'}.{remedy}{alternatives} "
            f"Run `accel list` to see what this machine offers.",
            accelerator=canonical,
            reason=availability.reason,
        )

    def _availability(self, canonical: str) -> Availability:
        return self._dispatcher.hooks(canonical).availability()

    def _select_auto(self) -> Registration:
        """The first available accelerator that ``"auto"`` may pick, in the catalog's
        ranking: highest priority, then canonical name. A disputed name is never picked."""
        for registration in self._catalog.ranked():
            if self._catalog.disputed_by(registration.spec.name):
                continue
            availability = self._dispatcher.hooks(registration.spec.name).availability()
            if availability.available and availability.auto:
                return registration
        rows = self.rows()
        reasons = "; ".join(f"{row.name}: {row.reason or 'not chosen by auto'}" for row in rows)
        raise AcceleratorUnavailableError(
            f"'auto' found no available accelerator ({reasons or 'none is registered'}). "
            f"Register the built-in plugins (builtins=True) or install a plugin.",
            accelerator=AUTO,
            reason="none available",
        )

    def rows(self) -> list[AcceleratorInfo]:
        """One row per accelerator in ``"auto"`` order, then one per failed plugin."""
        rows = [self._row(registration) for registration in self._catalog.ranked()]
        rows.extend(
            AcceleratorInfo(
                name=failure.name,
                aliases=(),
                available=False,
                device_count=0,
                priority=0,
                provider=failure.provider,
                description="(plugin failed to load)",
                reason=f"plugin failed to load: {failure.error}",
                remedy="fix or uninstall the plugin's distribution",
                auto=False,
            )
            for failure in self._failures
        )
        return rows

    def _row(self, registration: Registration) -> AcceleratorInfo:
        spec = registration.spec
        hooks = self._dispatcher.hooks(spec.name)
        disputed = self._catalog.disputed_by(spec.name)
        availability = (
            Availability(False, reason=f"its name is claimed by {', '.join(disputed)}", auto=False)
            if disputed
            else hooks.availability()
        )
        count, count_failed = 0, False
        # An available accelerator keeps its reason only when it explains why "auto"
        # passes it over (TPU on XLA:CPU).
        reason = "" if availability.available and availability.auto else availability.reason
        if availability.available:
            try:
                count = hooks.device_count()
            except Exception as exc:
                count_failed = True
                reason = f"device_count failed: {type(exc).__name__}: {exc}"
        return AcceleratorInfo(
            name=spec.name,
            aliases=spec.aliases,
            available=availability.available and not count_failed,
            device_count=count,
            priority=spec.priority,
            provider=registration.provider,
            description=spec.description,
            reason=reason,
            remedy=availability.remedy if not availability.available else "",
            auto=availability.auto,
        )
