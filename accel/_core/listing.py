"""What accel knows of each hook: the action hooks, the fallbacks' plugin name, the
call of one hook for one accelerator (its implementations, read from pluggy once), and
what accel says when a hook fails (only ever entered on that path)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, NamedTuple

import pluggy

from accel._util.names import describe_index_range, visibility_hint
from accel._util.notes import add_note
from accel.errors import AcceleratorNotFoundError, AcceleratorUnavailableError

__all__ = [
    "ACTION_HOOKS",
    "FALLBACKS_NAME",
    "HookCall",
    "count_problem",
    "hook_call",
    "index_error",
    "no_longer_registered",
    "note_blame",
    "plain_implementers",
    "plugins_plain",
    "shown",
]

#: The plugin name of accel's fallbacks in every registry's manager.
FALLBACKS_NAME: Final = "accel.fallbacks"

#: The hooks that do something rather than answer (the rule in accel.hookspecs): one
#: plain implementation does the action, accel's fallback where no plugin has one.
ACTION_HOOKS: Final = frozenset(
    {"optimizer_step", "mark_step", "synchronize", "manual_seed", "save", "set_rng_state"}
)


class HookCall(NamedTuple):
    """One hook as one accelerator calls it: ``execute(name, implementations, kwargs,
    firstresult)`` is what pluggy's ``HookCaller.__call__`` does, without filtering
    the subset and building the list again on every call."""

    #: The hook's implementations in pluggy's order, without the plugins of other
    #: accelerators (and, for an action hook a plugin does itself, without accel's
    #: fallback): a snapshot, so a call keeps the hooks it started with.
    implementations: tuple[pluggy.HookImpl, ...]
    firstresult: bool
    #: The manager's ``_hookexec``: pluggy's own loop (``_multicall``, or its tracer),
    #: taking the hook's name, the implementations (called last to first), the call's
    #: arguments and whether it stops at the first result.
    execute: Callable[..., Any]
    #: accel's fallback is the only implementation.
    fallback_only: bool


def plugins_plain(implementations: Iterable[pluggy.HookImpl]) -> list[pluggy.HookImpl]:
    """The plugins' plain implementations among ``implementations`` (not accel's
    fallback, not a wrapper), in pluggy's call order (the reverse of its list's)."""
    return [
        impl
        for impl in reversed(list(implementations))
        if not (impl.wrapper or impl.hookwrapper) and impl.plugin_name != FALLBACKS_NAME
    ]


def plain_implementers(
    manager: pluggy.PluginManager, hook_name: str, foreign: Iterable[object]
) -> list[pluggy.HookImpl]:
    """:func:`plugins_plain` of ``hook_name``'s implementations, without those of the
    ``foreign`` plugins."""
    excluded = set(foreign)
    implementations = getattr(manager.hook, hook_name).get_hookimpls()
    return [impl for impl in plugins_plain(implementations) if impl.plugin not in excluded]


def hook_call(manager: pluggy.PluginManager, hook_name: str, foreign: Iterable[object]) -> HookCall:
    """The call of ``hook_name`` without the ``foreign`` plugins (the subset pluggy's
    :meth:`~pluggy.PluginManager.subset_hook_caller` would call); for an action hook
    that a plugin does itself, without accel's fallback too. Read under the registry's
    dispatch lock, so the implementations and ``foreign`` are of one moment."""
    removed = set(foreign)
    if hook_name in ACTION_HOOKS and plain_implementers(manager, hook_name, removed):
        removed.add(manager.get_plugin(FALLBACKS_NAME))
    caller = getattr(manager.hook, hook_name)
    # Every typed call passes every argument of the spec, so pluggy's defaults for
    # missing ones (HookCaller.__call__ applies them) are never needed: no spec in
    # accel.hookspecs has defaults (tests/core/test_action_hooks.py checks).
    implementations = tuple(i for i in caller.get_hookimpls() if i.plugin not in removed)
    return HookCall(
        implementations=implementations,
        firstresult=bool(caller.spec and caller.spec.opts.get("firstresult")),
        execute=manager._hookexec,
        fallback_only=all(impl.plugin_name == FALLBACKS_NAME for impl in implementations),
    )


# -- what accel says when a hook fails ----------------------------------------------


_BLAME: Final = "raised in hook "


def note_blame(exc: BaseException, hook_name: str, plugin_name: str, provider: str) -> None:
    """Note on ``exc`` the hook and plugin it was raised in (the innermost one only)."""
    # An outer implementation (a wrapper) sees it too: the innermost one is at fault.
    if not any(note.startswith(_BLAME) for note in getattr(exc, "__notes__", ())):
        add_note(exc, f"{_BLAME}{hook_name!r} of plugin {plugin_name!r} ({provider})")


def shown(value: object) -> str:
    return f"{type(value).__name__} ({value!r})"


def count_problem(count: object) -> str | None:
    """What is wrong with a ``device_count`` answer, or ``None``."""
    if isinstance(count, bool) or not isinstance(count, int):
        return f"returned {shown(count)}; expected int"
    if count < 0:
        return f"returned {count}; a device count cannot be negative"
    return None


def index_error(
    accelerator: str, index: int, count: int, requested: str
) -> AcceleratorUnavailableError:
    """A device index beyond the count (``requested``: the name as written, and where
    it came from)."""
    if accelerator == "cpu":
        remedy = "The CPU accelerator has one device: use 'cpu'."
    else:
        hint = visibility_hint(accelerator)  # named by its device type (cuda), or no hint
        also = f", or check {hint}" if hint else ""
        remedy = f"Ask for {describe_index_range(accelerator, count)}{also}."
    return AcceleratorUnavailableError(
        f"device index {index} requested ({requested}) but "
        f"{accelerator!r} has {count} device{'s' if count != 1 else ''} here "
        f"(valid: {', '.join(str(i) for i in range(count)) or 'none'}). {remedy}",
        accelerator=accelerator,
        reason=f"index {index} >= device count {count}",
    )


def no_longer_registered(accelerator: str) -> AcceleratorNotFoundError:
    return AcceleratorNotFoundError(
        f"accelerator {accelerator!r} is no longer registered in this registry (its plugin "
        f"was unregistered); select one again with get_accelerator()",
        requested=accelerator,
        known=[],
        suggestion=None,
    )
