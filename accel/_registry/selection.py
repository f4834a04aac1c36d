"""From a name to an accelerator handle: aliases, disputes, ``"auto"``, device indexes.

The only module that knows both the registry's parts (catalog and dispatch) and the
:class:`~accel.Accelerator` handle, so neither of them imports the other.

Another thread may register or unregister plugins while a selection runs. Selection
reads the catalog and the hooks together under the registry's lock (a snapshot), and
probes outside it, so a slow probe never holds up registration; an accelerator that
leaves during the probe is then passed over (``"auto"``, listing) or reported as
:class:`~accel.AcceleratorNotFoundError` (selected by name), never as a bare
``KeyError`` or a failure of an unrelated accelerator.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, final

import torch

from accel._registry.catalog import BUILTIN_PROVIDER, Catalog, Registration
from accel._registry.dispatch import AcceleratorHooks, Dispatcher
from accel._util.names import (
    ACCELERATOR_ENV,
    AUTO,
    closest_name,
    describe_difference,
    name_from_environment,
    normalize_name,
    parse_accelerator_name,
)
from accel.accelerator import Accelerator
from accel.errors import (
    AcceleratorNotFoundError,
    AcceleratorUnavailableError,
    AcceleratorValueError,
)
from accel.types import AcceleratorInfo, Availability, PluginFailure, TieCheck, checked_tie_check

__all__ = ["Selector"]


class _Entry(NamedTuple):
    """One accelerator as a snapshot holds it."""

    registration: Registration
    hooks: AcceleratorHooks
    #: The providers disputing its name; empty when undisputed.
    disputed: tuple[str, ...]


@final
class Selector:
    """Selection over one registry's catalog, dispatcher and load failures (it owns
    none of them: the registry does, and changes the first two under ``lock``; the
    failures are complete before the registry creates its selector)."""

    __slots__ = ("_catalog", "_device_failures", "_failures", "_lock", "_probed", "dispatcher")

    def __init__(
        self,
        catalog: Catalog,
        dispatcher: Dispatcher,
        failures: list[PluginFailure],
        lock: threading.RLock,
    ) -> None:
        self._catalog = catalog
        #: The registry's hook dispatch.
        self.dispatcher = dispatcher
        self._failures = failures
        self._lock = lock
        # Canonical name -> why "auto" last found its get_device unusable: listed as
        # the reason (listing never asks get_device, which on XLA hands a device out).
        self._device_failures: dict[str, str] = {}
        # Canonical names of accelerators whose probing initialises their device and
        # that were selected by name (so probed): listing and "auto" may ask them now.
        self._probed: set[str] = set()

    def select(self, name: str | Accelerator | None, tie_check: TieCheck) -> Accelerator:
        """The handle for ``name`` (see :meth:`accel.AcceleratorRegistry.get_accelerator`)."""
        tie_check = checked_tie_check(tie_check)
        if isinstance(name, Accelerator):
            # The one rule every "a handle or a name" argument in accel follows.
            if self.dispatcher.owns(name._hooks):
                return name
            raise AcceleratorValueError(
                f"the accelerator handle {name!r} belongs to another registry than the one "
                f"asked (registry=): pass the handle without a registry, or its name "
                f"({name.name!r}) to this registry"
            )
        name, source = name_from_environment(name)
        try:
            base, index = parse_accelerator_name(name)
        except ValueError as exc:
            if source:
                raise AcceleratorValueError(f"{exc} (read from ${ACCELERATOR_ENV})") from None
            raise
        if base == AUTO:
            if index is not None:
                raise AcceleratorValueError(
                    f"'auto' takes no device index (got {name!r}{source}); ask for a named "
                    f"accelerator such as 'cuda:{index}' instead"
                )
            entry, device = self._select_auto(source)
        else:
            entry = self._resolve(base, name, source)
            device = entry.hooks.device(index, requested=name, source=source)
        return Accelerator(
            entry.hooks, entry.registration.spec, index=index, device=device, tie_check=tie_check
        )

    # -- snapshots: read under the lock, probed outside it ----------------------------

    def _entry(self, registration: Registration) -> _Entry:
        """Call with the lock held: the registry changes its catalog and its dispatch
        together under it, so a registration here has its hooks."""
        name = registration.spec.name
        return _Entry(registration, self.dispatcher.hooks(name), self._catalog.disputed_by(name))

    def _ranked(self) -> list[_Entry]:
        with self._lock:
            return [self._entry(r) for r in self._catalog.ranked()]

    def _unprobed(self, entry: _Entry) -> bool:
        """Whether listing and ``"auto"`` must leave ``entry`` unprobed: its probing
        initialises its device, and it was never selected by name here."""
        spec = entry.registration.spec
        return spec.probing_initialises and spec.name not in self._probed

    def _still_registered(self, entry: _Entry) -> bool:
        with self._lock:
            return self._catalog.get(entry.registration.spec.name) is entry.registration

    # -- by name ----------------------------------------------------------------------

    def distributed_backends(self, name: str) -> dict[str, str]:
        """The backend of each accelerator ``name`` selects (see
        :meth:`accel.AcceleratorRegistry.distributed_backends`): declarations only, no
        probe and no device."""
        base, _index = parse_accelerator_name(name)
        if base == AUTO:
            raise AcceleratorValueError(
                "'auto' is decided by probing the machine, so it has no backend before it "
                "is selected; ask for an accelerator by name, or select 'auto' with "
                "get_accelerator() and read its distributed_backend"
            )
        entries = self._named(base, name, "")
        return {e.registration.spec.name: e.hooks.distributed_backend() for e in entries}

    def _resolve(self, base: str, requested: str, source: str) -> _Entry:
        # A shared alias ("gpu"): the best available of its accelerators, in ranking order.
        entries = self._named(base, requested, source)
        self._probed.update(
            e.registration.spec.name for e in entries if e.registration.spec.probing_initialises
        )
        probed = [
            (entry, entry.hooks.availability(provider=entry.registration.provider))
            for entry in entries
        ]
        for entry, availability in probed:
            if availability.available:
                return entry
        (first, availability), *others = probed
        canonical = first.registration.spec.name
        remedy = f" To use it: {_sentence(availability.remedy)}." if availability.remedy else ""
        alternatives = "".join(
            f" {other.registration.spec.name!r} is not available either: {_sentence(why.reason)}."
            for other, why in others
        )
        raise AcceleratorUnavailableError(
            f"accelerator {canonical!r} (asked for as {requested!r}{source}) is not available: "
            f"{_sentence(availability.reason or 'its plugin says so')}.{remedy}{alternatives} "
            f"Run `accel list` to see what this machine offers.",
            accelerator=canonical,
            reason=availability.reason,
        )

    def _named(self, base: str, requested: str, source: str) -> list[_Entry]:
        """The accelerators ``base`` (a name or alias) selects, unprobed; an unknown or
        disputed name raises."""
        with self._lock:
            # A name is disputed, and so is every alias of a disputed name.
            self._catalog.check_undisputed(base, requested, source)
            entries = [self._entry(r) for r in self._catalog.candidates(base)]
            # Only an unknown name needs them (the message lists them).
            known = [] if entries else sorted({*self._catalog.names(), AUTO})
        if not entries:
            suggestion = closest_name(base, known)
            hint = ""
            if suggestion:
                hint = f" Did you mean {suggestion!r}?{describe_difference(base, suggestion)}"
            if any(normalize_name(f.name) == base for f in self._failures):
                hint += f" A plugin named {base!r} is installed but failed to load; see accel list."
            raise AcceleratorNotFoundError(
                f"unknown accelerator {requested!r}{source}.{hint} Known names: "
                f"{', '.join(known)}. Third-party accelerators come from installed plugins.",
                requested=requested,
                known=known,
                suggestion=suggestion,
            )
        return entries

    # -- "auto" -----------------------------------------------------------------------

    def _select_auto(self, source: str) -> tuple[_Entry, torch.device]:
        """The first available accelerator that ``"auto"`` may pick, in the catalog's
        ranking: highest priority, then canonical name. A disputed name is never picked,
        nor one whose probing raises (its reason is in ``accel list``)."""
        for entry in self._ranked():
            if entry.disputed or self._unprobed(entry) or not _auto_may_pick(entry.hooks):
                continue
            name = entry.registration.spec.name
            try:
                device = entry.hooks.device(None, requested=AUTO, source=source)
            except AcceleratorNotFoundError:
                if self._still_registered(entry):
                    raise
                continue  # it left while being selected: passed over, as listing does
            except Exception as exc:
                # As with a device_count that raises: passed over, the reason listed.
                self._device_failures[name] = f"get_device failed: {type(exc).__name__}: {exc}"
                continue
            self._device_failures.pop(name, None)
            return entry, device
        rows = self.rows()
        reasons = "; ".join(f"{row.name}: {row.reason or 'not chosen by auto'}" for row in rows)
        # Advising to register the built-ins is right only where they are not.
        builtins = any(row.provider == BUILTIN_PROVIDER for row in rows)
        remedy = (
            "Install (or fix) a plugin for an accelerator this machine has, or select one "
            "by name; `accel list` shows each one's reason."
            if builtins
            else "Register the built-in plugins (builtins=True) or install a plugin."
        )
        raise AcceleratorUnavailableError(
            f"'auto'{source} found no available accelerator "
            f"({reasons or 'none is registered'}). {remedy}",
            accelerator=AUTO,
            reason="none available",
        )

    # -- listing ----------------------------------------------------------------------

    def rows(self) -> list[AcceleratorInfo]:
        """One row per accelerator in ``"auto"`` order, then one per failed plugin.

        An accelerator unregistered while it is being listed is left out.
        """
        rows = [(entry, self._row(entry)) for entry in self._ranked()]
        listed = [row for entry, row in rows if self._still_registered(entry)]
        listed.extend(
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
        return listed

    def _row(self, entry: _Entry) -> AcceleratorInfo:
        registration, hooks, disputed = entry
        spec = registration.spec
        if disputed:
            reason = f"its name is claimed by {', '.join(disputed)}"
            availability = Availability(False, reason=reason, auto=False)
        elif self._unprobed(entry):
            availability = Availability(
                False,
                reason="not probed: its plugin declares that probing initialises the device, "
                "which listing and 'auto' never do",
                remedy=f"select it by name (get_accelerator({spec.name!r}) or "
                f"{ACCELERATOR_ENV}={spec.name}), which probes it",
                auto=False,
            )
        else:
            availability = hooks.availability(provider=registration.provider)
        count, failure = 0, None
        # An available accelerator keeps its reason only when it explains why "auto"
        # passes it over (TPU on XLA:CPU).
        reason = "" if availability.available and availability.auto else availability.reason
        remedy = availability.remedy if not availability.available else ""
        if availability.available:
            try:
                count = hooks.device_count()
            except Exception as exc:
                failure = f"device_count failed: {type(exc).__name__}: {exc}"
            else:
                failure = self._device_failures.get(spec.name)
                if failure is not None:
                    remedy = "fix the plugin, or report this to its authors "
                    remedy += f"({registration.provider})"
        return AcceleratorInfo(
            name=spec.name,
            aliases=spec.aliases,
            available=availability.available and failure is None,
            device_count=count,
            priority=spec.priority,
            provider=registration.provider,
            description=spec.description,
            reason=failure or reason,
            remedy=remedy,
            auto=availability.auto,
        )


def _auto_may_pick(hooks: AcceleratorHooks) -> bool:
    """Available, open to ``"auto"``, and its device count can be read."""
    availability = hooks.availability()
    if not (availability.available and availability.auto):
        return False
    try:
        hooks.device_count()
    except Exception:  # listed with the reason by accel list
        return False
    return True


def _sentence(text: str) -> str:
    """``text`` without its closing period: the message adds one (a reason that is a
    whole sentence, such as another error's message, would end in two)."""
    return text.rstrip().removesuffix(".")
