"""Two plugins of equal priority, loaded through fake entry points in the selection tests."""

from __future__ import annotations

from helpers.fakes import FakeAccelerator


class AlphaPlugin(FakeAccelerator):
    def __init__(self) -> None:
        super().__init__("alpha", priority=70)


class BetaPlugin(FakeAccelerator):
    def __init__(self) -> None:
        super().__init__("beta", priority=70)
