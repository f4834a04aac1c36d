"""Test tools for accel plugin authors: :mod:`accel.testing.conformance`, the kit that
checks accel's promises against one accelerator, on its device."""

from __future__ import annotations

__all__: list[str] = []
