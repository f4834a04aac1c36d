"""The accelerator registry: a pluggy plugin manager plus name resolution.

Each :class:`AcceleratorRegistry` owns its own :class:`pluggy.PluginManager`, so two
registries in one process never see each other's plugins. Plugins are loaded on
first use, not at construction, and never at ``import accel``.
"""

from __future__ import annotations

import difflib
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import pluggy
from pluggy._hooks import _SubsetHookCaller

from accel import hookspecs
from accel._blame import find_returner, note_culprit
from accel._names import (
    ACCELERATOR_ENV,
    AUTO,
    DISABLE_AUTOLOAD_ENV,
    PLUGINS_ENV,
    describe_index_range,
    parse_accelerator_name,
)
from accel.errors import (
    AcceleratorNotFoundError,
    AcceleratorUnavailableError,
    PluginError,
    PluginWarning,
)
from accel.markers import PROJECT_NAME
from accel.types import (
    TIE_CHECK_MODES,
    AcceleratorInfo,
    AcceleratorSpec,
    Availability,
    PluginFailure,
    TieCheck,
    normalize_name,
)

if TYPE_CHECKING:
    import torch

    from accel.accelerator import Accelerator

__all__ = ["AcceleratorRegistry", "PluginFailure", "PluginWarning"]

BUILTIN_PROVIDER: Final = "built-in"
_HOOK_NAMES: Final = tuple(hookspecs.__all__)
_T = TypeVar("_T")


class _NameConflict(PluginError):
    def __init__(self, message: str, names: tuple[str, ...]) -> None:
        super().__init__(message)
        self.names = names


@dataclass(frozen=True)
class _Registration:
    spec: AcceleratorSpec
    plugin: object
    provider: str


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _plugin_label(plugin: object) -> str:
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"


@final
class AcceleratorRegistry:
    """A set of accelerator plugins and the way to select among them.

    :param entry_points: entry-point group to load third-party plugins from, or
        ``None`` to load none. Embedding libraries may use a group of their own.
    :param builtins: register the built-in ``cpu``, ``cuda``, ``mps`` and ``tpu``
        plugins.
    :param plugins: allow-list of entry-point names (or distribution names) to load;
        ``None`` means ``$ACCEL_PLUGINS`` if set, else all.
    :param autoload: load entry points at all; ``None`` means "unless
        ``$ACCEL_DISABLE_PLUGIN_AUTOLOAD=1``".

    Nothing is loaded until the registry is first used.
    """

    def __init__(
        self,
        *,
        entry_points: str | None = PROJECT_NAME,
        builtins: bool = True,
        plugins: Iterable[str] | None = None,
        autoload: bool | None = None,
    ) -> None:
        self._entry_point_group = entry_points
        self._builtins = builtins
        self._allowed = None if plugins is None else {normalize_name(p) for p in plugins}
        self._autoload = autoload
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        # Re-entrant: loading registers plugins, and registering makes sure loading ran.
        self._lock = threading.RLock()
        self._loaded = False
        self._registrations: dict[str, _Registration] = {}
        # Every name and alias -> the canonical names it may mean, in registration order.
        self._names: dict[str, list[str]] = {}
        # Accelerator name -> the other accelerators' plugins, which its hook calls
        # skip. Live sets: hook callers read them on every call (see hook()).
        self._excluded: dict[str, set[object]] = {}
        self._failures: list[PluginFailure] = []
        self._caller_cache: dict[tuple[str, str], Any] = {}
        self._fallback_only: dict[tuple[str, str], bool] = {}

    # -- loading ---------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._register_core()
            if self._builtins:
                self._register_builtins()
            if self._autoload_enabled():
                self._load_entry_points()
            # Set last: other threads wait on the lock until the registry is whole.
            self._loaded = True

    def _autoload_enabled(self) -> bool:
        if self._entry_point_group is None:
            return False
        if self._autoload is not None:
            return self._autoload
        return not _env_flag(DISABLE_AUTOLOAD_ENV)

    def _register_core(self) -> None:
        from accel import fallbacks

        self._pm.register(fallbacks, name="accel.fallbacks")

    def _register_builtins(self) -> None:
        from accel.plugins import BUILTIN_PLUGINS

        for name, factory in BUILTIN_PLUGINS:
            self._register(factory(), name=f"accel.builtin.{name}", provider=BUILTIN_PROVIDER)

    def _allowed_names(self) -> set[str] | None:
        if self._allowed is not None:
            return self._allowed
        raw = os.environ.get(PLUGINS_ENV)
        if raw is None or not raw.strip():
            return None
        return {normalize_name(part) for part in raw.split(",") if part.strip()}

    def _load_entry_points(self) -> None:
        from importlib.metadata import entry_points

        assert self._entry_point_group is not None
        allowed = self._allowed_names()
        for entry_point in entry_points(group=self._entry_point_group):
            dist = entry_point.dist
            dist_name = dist.metadata["Name"] if dist is not None else "unknown distribution"
            provider = f"{dist_name} {dist.version}" if dist is not None else dist_name
            if allowed is not None and not (
                {normalize_name(entry_point.name), normalize_name(dist_name)} & allowed
            ):
                continue
            if self._pm.has_plugin(entry_point.name):
                continue  # the same distribution installed twice on sys.path
            try:
                loaded = entry_point.load()
                plugin = loaded() if isinstance(loaded, type) else loaded
                self._register(plugin, name=entry_point.name, provider=provider)
            except Exception as exc:
                self._record_failure(entry_point.name, provider, exc)

    def _record_failure(self, name: str, provider: str, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        conflicting = exc.names if isinstance(exc, _NameConflict) else ()
        self._failures.append(PluginFailure(name, provider, error, conflicting))
        warnings.warn(
            f"accel plugin {name!r} from {provider} failed to load and was skipped "
            f"({error}); the other accelerators still work. Fix or uninstall it, or set "
            f"{DISABLE_AUTOLOAD_ENV}=1 / {PLUGINS_ENV}=... to skip third-party plugins.",
            PluginWarning,
            stacklevel=4,
        )

    # -- registration ----------------------------------------------------------

    def register(self, plugin: object, name: str | None = None, *, override: bool = False) -> None:
        """Register a plugin object (a module or an instance with ``@accel.hookimpl`` methods).

        :param name: plugin name; defaults to pluggy's (the object's id).
        :param override: let this plugin's accelerators replace registered ones with
            the same name or alias (built-ins included), instead of raising
            :class:`PluginError`.
        """
        self._ensure_loaded()
        with self._lock:
            self._register(plugin, name=name, provider=_plugin_label(plugin), override=override)

    def unregister(self, plugin: object) -> None:
        """Remove a plugin and every accelerator it declared."""
        self._ensure_loaded()
        with self._lock:
            if not self._pm.is_registered(plugin):
                raise PluginError(
                    f"cannot unregister {_plugin_label(plugin)!r}: it is not registered in "
                    f"this registry (registries never share plugins)"
                )
            self._pm.unregister(plugin)
            self._forget(plugin)

    def _forget(self, plugin: object) -> None:
        for canonical in [n for n, r in self._registrations.items() if r.plugin is plugin]:
            del self._registrations[canonical]
            self._excluded.pop(canonical, None)
            for names in self._names.values():
                if canonical in names:
                    names.remove(canonical)
        self._names = {k: v for k, v in self._names.items() if v}
        for excluded in self._excluded.values():
            excluded.discard(plugin)
        self._caller_cache.clear()
        self._fallback_only.clear()

    def _register(
        self, plugin: object, *, name: str | None, provider: str, override: bool = False
    ) -> None:
        label = name or _plugin_label(plugin)
        try:
            hash(plugin)
        except TypeError:
            raise PluginError(
                f"plugin {label!r} from {provider} must be hashable (pluggy keeps plugins in "
                f"sets); use a module, a class instance, or a dataclass with eq=False"
            ) from None
        if name is None:
            # A readable name for messages ("raised in hook ... of plugin NAME"),
            # unique as pluggy requires.
            name = label if self._pm.get_plugin(label) is None else f"{label}-{id(plugin):x}"
        if self._pm.is_registered(plugin):
            raise PluginError(f"plugin {label!r} from {provider} is already registered")
        if not any(self._pm.parse_hookimpl_opts(plugin, attr) for attr in dir(plugin)):
            hint = " (a class: pass an instance of it)" if isinstance(plugin, type) else ""
            raise PluginError(
                f"plugin {label!r} from {provider} has no accel hooks{hint}: mark its hook "
                f"implementations with @accel.hookimpl; the hooks are listed in accel.hookspecs"
            )
        # Learn what the plugin provides before pluggy can call any of its hooks:
        # from the moment it is registered, every other accelerator's calls must
        # already exclude it, even calls in flight on other threads.
        specs = self._declared_specs(plugin, label, provider)
        displaced = self._conflicting_plugins(specs, label, provider, override)
        if specs:
            for excluded in self._excluded.values():
                excluded.add(plugin)
        try:
            self._pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            self._forget(plugin)
            detail = " ".join(str(exc).split())
            raise PluginError(
                f"plugin {label!r} from {provider} does not match accel's hooks: {detail}. "
                f"Hook names and arguments are listed in accel.hookspecs."
            ) from exc
        try:
            self._check_hook_names(plugin, label, provider)
        except BaseException:
            self._pm.unregister(plugin)
            self._forget(plugin)
            raise
        for other in displaced:
            self._pm.unregister(other)
            self._forget(other)
        others = {registration.plugin for registration in self._registrations.values()}
        for spec in specs:
            self._excluded[spec.name] = set(others)
            self._registrations[spec.name] = _Registration(spec, plugin, provider)
            for key in (spec.name, *spec.aliases):
                self._names.setdefault(key, []).append(spec.name)
        self._caller_cache.clear()
        self._fallback_only.clear()

    def _declared_specs(self, plugin: object, label: str, provider: str) -> list[AcceleratorSpec]:
        """Call the plugin's ``register_accelerators`` (if any) and check what it returns."""
        if self._pm.parse_hookimpl_opts(plugin, "register_accelerators") is None:
            return []  # a cross-cutting plugin
        if isinstance(plugin, type):
            raise PluginError(
                f"plugin {label!r} from {provider} is a class; register an instance of it"
            )
        try:
            returned = plugin.register_accelerators()  # type: ignore[attr-defined]
        except Exception as exc:
            raise PluginError(
                f"plugin {label!r} from {provider} raised in register_accelerators: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        specs = _as_spec_list(returned)
        if specs is None:
            raise PluginError(
                f"plugin {label!r} from {provider}: register_accelerators must return "
                f"AcceleratorSpec objects, got {type(returned).__name__}: {returned!r}"
            )
        seen: set[str] = set()
        for spec in specs:
            if spec.name in seen:
                raise PluginError(f"plugin {label!r} declares accelerator {spec.name!r} twice")
            seen.add(spec.name)
        return specs

    def _check_hook_names(self, plugin: object, label: str, provider: str) -> None:
        """Reject hook implementations that match no accel hook (typos, stale names)."""
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            unknown = [
                name
                for name, caller in vars(self._pm.hook).items()
                if not name.startswith("_")
                and not caller.has_spec()
                and any(impl.plugin is plugin for impl in caller.get_hookimpls())
            ]
            close = difflib.get_close_matches(unknown[0], _HOOK_NAMES, n=1) if unknown else []
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise PluginError(
                f"plugin {label!r} from {provider} implements unknown hook "
                f"{', '.join(map(repr, unknown)) or '?'}.{hint} accel's hooks are: "
                f"{', '.join(_HOOK_NAMES)}."
            ) from exc

    def _conflicting_plugins(
        self, specs: list[AcceleratorSpec], label: str, provider: str, override: bool
    ) -> list[object]:
        """Plugins whose names the new ``specs`` take over (only with ``override``)."""
        if AUTO in {n for spec in specs for n in (spec.name, *spec.aliases)}:
            raise PluginError(f"plugin {label!r} from {provider}: 'auto' is a reserved name")
        displaced: list[object] = []
        for spec in specs:
            for key in (spec.name, *spec.aliases):
                for other_name in self._names.get(key, []):
                    other = self._registrations[other_name]
                    is_name_clash = key in (spec.name, other.spec.name)
                    if not is_name_clash and other.provider == provider:
                        continue  # one provider may share an alias among its accelerators
                    if override:
                        if other.plugin not in displaced:
                            displaced.append(other.plugin)
                        continue
                    raise _NameConflict(
                        f"accelerator name {key!r} is claimed twice: by {other.spec.name!r} "
                        f"from {other.provider} and by {spec.name!r} from {provider} "
                        f"(plugin {label!r}). Uninstall one of them, load only one with "
                        f"{PLUGINS_ENV}=..., or, registering in code, pass override=True to "
                        f"replace the existing one on purpose.",
                        names=(key,),
                    )
        return displaced

    # -- hook dispatch ---------------------------------------------------------

    def hook(self, accelerator: str, hook_name: str) -> Any:
        """The pluggy hook caller for ``hook_name`` as seen by ``accelerator``.

        It reaches the accelerator's own plugin and every cross-cutting plugin,
        never another accelerator's plugin, including one registered after the
        caller was made. Cached until plugins change.
        """
        key = (accelerator, hook_name)
        caller = self._caller_cache.get(key)
        if caller is None:
            self._ensure_loaded()
            with self._lock:
                excluded = self._excluded.get(accelerator)
                if excluded is None:
                    raise AcceleratorNotFoundError(
                        f"accelerator {accelerator!r} is not registered in this registry "
                        f"(it may have been unregistered); select one again with "
                        f"get_accelerator()",
                        requested=accelerator,
                        known=sorted(self._names),
                        suggestion=None,
                    )
                caller = _live_subset_caller(getattr(self._pm.hook, hook_name), excluded)
                self._caller_cache[key] = caller
        return caller

    def only_fallback_implements(self, accelerator: str, hook_name: str) -> bool:
        """Whether accel's built-in fallback is the only implementation ``accelerator``
        would reach for ``hook_name`` (so callers may skip the hook call). Cached."""
        key = (accelerator, hook_name)
        cached = self._fallback_only.get(key)
        if cached is None:
            implementations = self.hook(accelerator, hook_name).get_hookimpls()
            cached = all(impl.plugin_name == "accel.fallbacks" for impl in implementations)
            self._fallback_only[key] = cached
        return cached

    def call(self, accelerator: str, hook_name: str, **kwargs: Any) -> Any:
        """Call a hook for ``accelerator``, naming the plugin at fault on failure."""
        caller = self.hook(accelerator, hook_name)
        try:
            return caller(accelerator=accelerator, **kwargs)
        except Exception as exc:
            note_culprit(exc, caller, hook_name, self._provider_of)
            raise

    def _query(
        self, accelerator: str, hook_name: str, expected: type[_T] | tuple[type, ...], **kw: Any
    ) -> _T:
        """Call a first-result hook and check the type of what it returned."""
        result = self.call(accelerator, hook_name, **kw)
        if isinstance(result, expected) and not (isinstance(result, bool) and expected is int):
            return result  # type: ignore[return-value]
        culprit = find_returner(self.hook(accelerator, hook_name), accelerator, kw, result)
        who = (
            f"plugin {culprit!r} ({self._provider_of(culprit)})"
            if culprit is not None
            else "no plugin"
        )
        names = expected if isinstance(expected, tuple) else (expected,)
        raise PluginError(
            f"hook {hook_name!r} for accelerator {accelerator!r} returned "
            f"{type(result).__name__} ({result!r}) from {who}; expected "
            f"{' or '.join(t.__name__ for t in names)}. Report this to the plugin's authors."
        )

    def describe_answerers(self, accelerator: str, hook_name: str) -> str:
        """Name the plugins that may have answered a first-result hook (for errors)."""
        names = [
            impl.plugin_name
            for impl in self.hook(accelerator, hook_name).get_hookimpls()
            if not (impl.wrapper or impl.hookwrapper) and impl.plugin_name != "accel.fallbacks"
        ]
        if not names:
            return "accel's built-in fallback"
        return "plugin " + " or ".join(f"{n!r} ({self._provider_of(n)})" for n in reversed(names))

    def _provider_of(self, plugin_name: str) -> str:
        plugin = self._pm.get_plugin(plugin_name)
        for registration in self._registrations.values():
            if registration.plugin is plugin:
                return registration.provider
        return BUILTIN_PROVIDER if plugin_name.startswith("accel.") else "registered in code"

    # -- probing ---------------------------------------------------------------

    def availability(self, accelerator: str) -> Availability:
        """Ask the accelerator's plugins whether it can be used; never raises."""
        try:
            return self._query(accelerator, "is_available", Availability)
        except Exception as exc:
            # The message already says whom to report it to.
            return Availability(False, reason=f"probing it failed: {type(exc).__name__}: {exc}")

    def device_count(self, accelerator: str) -> int:
        """Number of devices of an accelerator; 0 when unavailable."""
        if not self.availability(accelerator).available:
            return 0
        return self._device_count_of_available(accelerator)

    def _device_count_of_available(self, accelerator: str) -> int:
        """:meth:`device_count` for an accelerator just found available (no re-probe)."""
        count = self._query(accelerator, "device_count", int)
        if count < 0:
            culprit = find_returner(self.hook(accelerator, "device_count"), accelerator, {}, count)
            raise PluginError(
                f"hook 'device_count' for accelerator {accelerator!r} returned {count} from "
                f"plugin {culprit!r}; a device count cannot be negative. Report this to the "
                f"plugin's authors."
            )
        return count

    # -- public queries ----------------------------------------------------------

    def list_accelerators(self) -> list[AcceleratorInfo]:
        """Every registered accelerator, available or not, highest priority first.

        Plugins that failed to load appear too, unavailable, with their error.
        """
        self._ensure_loaded()
        with self._lock:
            registrations = list(self._registrations.values())
            failures = list(self._failures)
        rows = [self._info(r) for r in registrations]
        rows.sort(key=lambda row: -row.priority)
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
            for failure in failures
        )
        return rows

    def plugin_failures(self) -> list[PluginFailure]:
        """Plugins that failed to load or register, with their errors."""
        self._ensure_loaded()
        return list(self._failures)

    def names(self) -> list[str]:
        """Every canonical name and alias, sorted."""
        self._ensure_loaded()
        return sorted(self._names)

    def _info(self, registration: _Registration) -> AcceleratorInfo:
        spec = registration.spec
        availability = self.availability(spec.name)
        count, count_failed = 0, False
        # An available accelerator keeps its reason only when it explains why
        # "auto" passes it over (TPU on XLA:CPU).
        keep_reason = not (availability.available and availability.auto)
        reason = availability.reason if keep_reason else ""
        if availability.available:
            try:
                count = self._device_count_of_available(spec.name)
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

    # -- selection ---------------------------------------------------------------

    def get_accelerator(
        self, name: str | None = None, *, tie_check: TieCheck = "error"
    ) -> Accelerator:
        """Return a handle to the accelerator called ``name``.

        :param name: a name or alias, optionally with a device index (``"cuda:1"``),
            or ``"auto"``. ``None`` means ``$ACCEL_ACCELERATOR``, else ``"auto"``.
        :param tie_check: what a move does when tied weights came apart:
            ``"error"`` (raise :class:`WeightTyingError`), ``"warn"`` or ``"off"``.
        :raises AcceleratorNotFoundError: no accelerator has that name.
        :raises AcceleratorUnavailableError: it exists but cannot be used here, or
            the device index is beyond its device count.
        """
        from accel.accelerator import Accelerator

        if tie_check not in TIE_CHECK_MODES:
            raise ValueError(
                f"tie_check must be one of {', '.join(map(repr, TIE_CHECK_MODES))}, "
                f"got {tie_check!r}"
            )
        self._ensure_loaded()
        source = ""  # where the name came from, for messages: "" or " in $ACCEL_..."
        if name is None:
            from_env = os.environ.get(ACCELERATOR_ENV)
            if from_env is not None and from_env.strip():
                name, source = from_env, f" in ${ACCELERATOR_ENV}"
            else:
                name = AUTO
        try:
            base, index = parse_accelerator_name(name)
        except ValueError as exc:
            if source:
                raise ValueError(f"{exc} (read from ${ACCELERATOR_ENV})") from None
            raise
        if base == AUTO:
            if index is not None:
                raise ValueError(
                    f"'auto' takes no device index (got {name!r}); ask for a named "
                    f"accelerator such as 'cuda:{index}' instead"
                )
            canonical = self._select_auto()
        else:
            canonical = self._resolve(base, requested=name, source=source)
        count = self._device_count_of_available(canonical)  # resolving checked availability
        if index is not None and index >= count:
            raise AcceleratorUnavailableError(
                f"device index {index} requested ({name!r}{source}) but {canonical!r} has "
                f"{count} device{'s' if count != 1 else ''} here (valid: "
                f"{', '.join(str(i) for i in range(count)) or 'none'}). Ask for "
                f"{describe_index_range(canonical, count)}, or check device visibility "
                f"settings such as CUDA_VISIBLE_DEVICES.",
                accelerator=canonical,
                reason=f"index {index} >= device count {count}",
            )
        device = self._query(canonical, "get_device", _torch_device_type(), index=index)
        return Accelerator(
            registry=self,
            spec=self._registrations[canonical].spec,
            index=index,
            device=device,
            tie_check=tie_check,
        )

    def _resolve(self, base: str, *, requested: str, source: str) -> str:
        for failure in self._failures:
            if base in failure.conflicting_names:
                raise PluginError(
                    f"cannot select {requested!r}{source}: {failure.error.partition(': ')[2]}"
                )
        candidates = self._names.get(base)
        if not candidates:
            known = sorted({*self._names, AUTO})
            close = difflib.get_close_matches(base, known, n=1, cutoff=0.6)
            suggestion = close[0] if close else None
            hint = f" Did you mean {suggestion!r}?" if suggestion else ""
            failed = [f.name for f in self._failures if normalize_name(f.name) == base]
            if failed:
                hint += f" A plugin named {base!r} is installed but failed to load; see accel list."
            raise AcceleratorNotFoundError(
                f"unknown accelerator {requested!r}{source}.{hint} Known names: "
                f"{', '.join(known)}. Third-party accelerators come from installed plugins.",
                requested=requested,
                known=known,
                suggestion=suggestion,
            )
        if len(candidates) > 1:
            # A shared alias ("gpu"): the best available of its accelerators.
            ranked = sorted(candidates, key=lambda n: -self._registrations[n].spec.priority)
            for canonical in ranked:
                if self.availability(canonical).available:
                    return canonical
            self._raise_unavailable(ranked[0], requested, source, also=ranked[1:])
        canonical = candidates[0]
        if not self.availability(canonical).available:
            self._raise_unavailable(canonical, requested, source)
        return canonical

    def _raise_unavailable(
        self, canonical: str, requested: str, source: str, also: Iterable[str] = ()
    ) -> None:
        availability = self.availability(canonical)
        remedy = f" To use it: {availability.remedy}." if availability.remedy else ""
        alternatives = "".join(
            f" {other!r} is not available either: {self.availability(other).reason}."
            for other in also
        )
        raise AcceleratorUnavailableError(
            f"accelerator {canonical!r} (asked for as {requested!r}{source}) is not available: "
            f"{availability.reason or 'its plugin says so'}.{remedy}{alternatives} "
            f"Run `accel list` to see what this machine offers.",
            accelerator=canonical,
            reason=availability.reason,
        )

    def _select_auto(self) -> str:
        candidates = []
        for position, registration in enumerate(list(self._registrations.values())):
            availability = self.availability(registration.spec.name)
            if availability.available and availability.auto:
                # Highest priority wins; among equals, the one registered first.
                candidates.append((-registration.spec.priority, position, registration.spec.name))
        if not candidates:
            reasons = "; ".join(
                f"{info.name}: {info.reason or 'not chosen by auto'}"
                for info in self.list_accelerators()
            )
            raise AcceleratorUnavailableError(
                f"'auto' found no available accelerator ({reasons or 'none is registered'}). "
                f"Register the built-in plugins (builtins=True) or install a plugin.",
                accelerator=AUTO,
                reason="none available",
            )
        return min(candidates)[2]


def _live_subset_caller(orig: pluggy.HookCaller, excluded: set[object]) -> Any:
    """A hook caller that skips the plugins in ``excluded``, read at every call.

    pluggy's public ``subset_hook_caller`` copies the set it is given, so a plugin
    registered afterwards would reach callers made before. Its proxy class
    (stable from pluggy 1.5 through 1.7) keeps whatever set it is handed; giving it
    our live set closes that gap.
    """
    return _SubsetHookCaller(orig, excluded)


def _as_spec_list(returned: object) -> list[AcceleratorSpec] | None:
    """``returned`` as a list of specs, or ``None`` if it is anything else."""
    if isinstance(returned, AcceleratorSpec):
        return [returned]
    if not isinstance(returned, Iterable) or isinstance(returned, (str, bytes, Mapping)):
        return None
    items = list(returned)
    if all(isinstance(item, AcceleratorSpec) for item in items):
        return items
    return None


def _torch_device_type() -> type[torch.device]:
    import torch

    return torch.device
