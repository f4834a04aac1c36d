"""What :meth:`accel.Accelerator.memory_stats` reports, the same keys on every accelerator.

Lightning's ``get_device_stats`` returns whatever each runtime happens to name its
counters; a dashboard then needs a branch per device. Here every accelerator answers
the same three questions, and says ``None`` when its runtime cannot answer one.
"""

from __future__ import annotations

import os
import sys
from typing import Final

from accel.types import MemoryStats

__all__: list[str] = []


MEMORY_KEYS: Final = ("allocated_bytes", "peak_allocated_bytes", "total_bytes")


def unknown() -> MemoryStats:
    """Stats of a runtime that reports nothing."""
    return MemoryStats(allocated_bytes=None, peak_allocated_bytes=None, total_bytes=None)


def host_memory_stats() -> MemoryStats:
    """This process's resident memory (now and peak) and the machine's RAM."""
    resident = _resident_bytes()
    peak = _peak_resident_bytes()
    if resident is not None and peak is not None:
        peak = max(peak, resident)  # the kernel updates its high-water mark lazily
    return MemoryStats(
        allocated_bytes=resident, peak_allocated_bytes=peak, total_bytes=_physical_ram_bytes()
    )


def memory_stats_problem(result: object) -> str | None:
    """What keeps ``result`` (a ``memory_stats`` hook's answer) from being
    :class:`MemoryStats`, or ``None`` when it is one."""
    if not isinstance(result, dict):
        return f"returned {type(result).__name__} ({result!r}), not a dict"
    if set(result) != set(MEMORY_KEYS):
        return f"returned keys {sorted(map(str, result))}, expected {list(MEMORY_KEYS)}"
    bad = {
        key: value
        for key, value in result.items()
        if value is not None
        and (isinstance(value, bool) or not isinstance(value, int) or value < 0)
    }
    if bad:
        return f"returned {bad!r}; each value must be an int >= 0 or None"
    return None


def _resident_bytes() -> int | None:
    try:  # Linux: the second field of statm is resident pages
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None  # macOS and Windows expose no cheap current-RSS counter to Python


def _peak_resident_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _physical_ram_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None
