"""What accel knows of each hook: the action hooks, the fallbacks' plugin name, and the
call of one hook for one accelerator (pluggy's subset hook caller, built once)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, NamedTuple

import pluggy

__all__ = ["ACTION_HOOKS", "FALLBACKS_NAME", "HookCall", "hook_call", "plain_implementers"]

#: The plugin name of accel's fallbacks in every registry's manager.
FALLBACKS_NAME: Final = "accel.fallbacks"

#: The hooks that do something rather than answer (the rule in accel.hookspecs): one
#: plain implementation does the action, accel's fallback where no plugin has one.
ACTION_HOOKS: Final = frozenset(
    {"optimizer_step", "mark_step", "synchronize", "manual_seed", "save", "set_rng_state"}
)


class HookCall(NamedTuple):
    """One hook as one accelerator calls it."""

    #: pluggy's caller without the plugins of other accelerators (and, for an action
    #: hook a plugin does itself, without accel's fallback).
    caller: pluggy.HookCaller
    #: A plugin's wrapper is among the implementations: it may change the answer.
    has_wrapper: bool
    #: accel's fallback is the only implementation.
    fallback_only: bool


def _is_plain(impl: pluggy.HookImpl) -> bool:
    return not (impl.wrapper or impl.hookwrapper)


def plain_implementers(
    manager: pluggy.PluginManager, hook_name: str, foreign: Iterable[object]
) -> list[pluggy.HookImpl]:
    """The plugins' plain implementations of ``hook_name`` (not accel's fallback, not
    a wrapper), without those of the ``foreign`` plugins, in pluggy's call order."""
    excluded = set(foreign)
    return [
        impl
        for impl in reversed(getattr(manager.hook, hook_name).get_hookimpls())
        if _is_plain(impl) and impl.plugin_name != FALLBACKS_NAME and impl.plugin not in excluded
    ]


def hook_call(manager: pluggy.PluginManager, hook_name: str, foreign: Iterable[object]) -> HookCall:
    """The call of ``hook_name`` without the ``foreign`` plugins (pluggy's own
    :meth:`~pluggy.PluginManager.subset_hook_caller`); for an action hook that a plugin
    does itself, without accel's fallback too."""
    removed = set(foreign)
    if hook_name in ACTION_HOOKS and plain_implementers(manager, hook_name, removed):
        removed.add(manager.get_plugin(FALLBACKS_NAME))
    caller = manager.subset_hook_caller(hook_name, removed)
    implementations: list[Any] = caller.get_hookimpls()
    return HookCall(
        caller=caller,
        has_wrapper=any(
            not _is_plain(impl) and impl.plugin_name != FALLBACKS_NAME for impl in implementations
        ),
        fallback_only=all(impl.plugin_name == FALLBACKS_NAME for impl in implementations),
    )
