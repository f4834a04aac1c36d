"""The sentences accel adds to errors, written once."""

from __future__ import annotations

from typing import Final

__all__ = ["REPORT_TO_AUTHORS", "add_note", "bad_result_error"]

#: Ends every message about a plugin that misbehaved.
REPORT_TO_AUTHORS: Final = "Report this to the plugin's authors."


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc`` where Python can (3.11+); on 3.10 the note is dropped."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def bad_result_error(hook_name: str, accelerator: str, problem: str, who: str) -> Exception:
    """The :class:`~accel.PluginError` for a hook result accel cannot use.

    :param problem: what is wrong, e.g. ``"returned list ([]), expected dict"``.
    :param who: the answering plugin, as :meth:`AcceleratorHooks.describe` names it.
    """
    from accel.errors import PluginError

    return PluginError(
        f"hook {hook_name!r} for accelerator {accelerator!r} {problem}, from {who}. "
        f"{REPORT_TO_AUTHORS}"
    )
