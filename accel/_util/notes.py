"""The sentences accel adds to errors, written once."""

from __future__ import annotations

from typing import Final

__all__ = ["REPORT_TO_AUTHORS", "add_note"]

#: Ends every message about a plugin that misbehaved.
REPORT_TO_AUTHORS: Final = "Report this to the plugin's authors."


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc`` where Python can (3.11+); on 3.10 the note is dropped."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
