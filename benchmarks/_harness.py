"""What every benchmark script shares: timing, and tables that paste into the docs.

In-process timings are taken as samples round-robin across the candidates, so a slow
spell on this (shared, 2-core) machine hits every candidate alike, and reported as the
best sample, as :mod:`timeit` advises: other processes only ever add time, so the
minimum is the most repeatable estimate of a candidate's own cost. The garbage
collector is paused inside a sample and run between samples.
"""

from __future__ import annotations

import gc
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "compare_per_call",
    "environment_line",
    "fmt_ms",
    "fmt_ratio",
    "fmt_us",
    "print_table",
    "timed",
    "verdict",
]


class timed:  # a verb at the call site: `with timed() as clock:`
    """Context manager: ``seconds`` is the wall time of the block, GC paused inside."""

    __slots__ = ("_gc_was_enabled", "_start", "seconds")

    def __enter__(self) -> timed:
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self.seconds = 0.0
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.seconds = time.perf_counter() - self._start
        if self._gc_was_enabled:
            gc.enable()


def _run_calls(fn: Callable[[], object], number: int) -> float:
    with timed() as clock:
        for _ in range(number):
            fn()
    return clock.seconds


def _calls_per_sample(fn: Callable[[], object], min_sample_s: float) -> int:
    number = 1
    while _run_calls(fn, number) < min_sample_s and number < 1 << 20:
        number *= 2
    return number


def compare_per_call(
    candidates: dict[Any, Callable[[], object]],
    *,
    samples: int = 15,
    min_sample_s: float = 0.02,
) -> dict[Any, float]:
    """Best seconds per call of each candidate, sampled round-robin."""
    numbers = {name: _calls_per_sample(fn, min_sample_s) for name, fn in candidates.items()}
    per_call: dict[Any, list[float]] = {name: [] for name in candidates}
    for _ in range(samples):
        for name, fn in candidates.items():
            gc.collect()
            per_call[name].append(_run_calls(fn, numbers[name]) / numbers[name])
    return {name: min(values) for name, values in per_call.items()}


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds * 1e3:,.0f} ms"


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def fmt_ratio(ratio: float) -> str:
    return f"{ratio:.2f}×"


def verdict(met: bool) -> str:
    return "met" if met else "**MISSED**"


def print_table(
    title: str,
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    notes: Iterable[str] = (),
) -> None:
    """Print a Markdown table (so the output pastes into docs/benchmarks.md as is)."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    print(f"\n### {title}\n")
    print(line(cells[0]))
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in cells[1:]:
        print(line(row))
    notes = list(notes)
    if notes:
        print()
        for note in notes:
            print(f"- {note}")
    sys.stdout.flush()


def environment_line(**versions: str) -> str:
    """Python, platform and the versions passed in, as one line."""
    parts = [f"Python {platform.python_version()}", *(f"{k} {v}" for k, v in versions.items())]
    return ", ".join(parts)
