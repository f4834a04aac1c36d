"""What pluggy lists of one hook, in the form the typed hook caller walks it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    import pluggy

__all__ = ["FALLBACKS_NAME", "Listed", "list_implementations"]

#: The plugin name of accel's fallbacks in every manager.
FALLBACKS_NAME: Final = "accel.fallbacks"


class Listed(NamedTuple):
    """A hook's implementations in pluggy's call order (last registered first,
    ``tryfirst``/``trylast`` honoured); whether a wrapper is among them (then pluggy runs
    the call); whether accel's fallback is the only one (then it is called directly)."""

    call_order: tuple[pluggy.HookImpl, ...]
    has_wrapper: bool
    fallback_only: bool


def list_implementations(caller: Any) -> Listed:
    """What pluggy's public ``get_hookimpls()`` says of the hook ``caller`` calls."""
    implementations = caller.get_hookimpls()
    return Listed(
        call_order=tuple(reversed(implementations)),
        has_wrapper=any(impl.wrapper or impl.hookwrapper for impl in implementations),
        fallback_only=all(impl.plugin_name == FALLBACKS_NAME for impl in implementations),
    )
