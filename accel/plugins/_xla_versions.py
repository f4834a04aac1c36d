"""Which torch goes with which torch_xla, read from package metadata alone.

torch_xla wheels are built against one torch minor release: torch_xla 2.9.0 needs
torch 2.9.x and fails to import (or crashes on undefined symbols) with any other.
pip does not prevent the mismatch, because torch_xla's wheels do not pin torch, so
a user who installs a new torch next to an old torch_xla gets an import error that
does not say what to do. This module recognises that case *without importing
torch_xla* (importing it has process-wide side effects, see
:mod:`accel.plugins.tpu`) and gives the exact command that fixes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Final

__all__ = [
    "DISTRIBUTION",
    "SUPPORTED_XLA_MINORS",
    "TorchXlaMismatch",
    "find_torch_xla_mismatch",
    "install_torch_xla_remedy",
    "installed_version",
    "minor_of",
    "reinstall_torch_xla_remedy",
]

#: accel's distribution name on PyPI (the import name is ``accel``; ``accel`` on
#: PyPI is an unrelated package).
DISTRIBUTION: Final = "accel-torch"
#: torch_xla minor releases accel is tested with; the ``tpu`` extra in
#: pyproject.toml allows exactly these (with the matching torch).
SUPPORTED_XLA_MINORS: Final[tuple[tuple[int, int], ...]] = ((2, 9),)

_MINOR = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True)
class TorchXlaMismatch:
    """The installed torch and torch_xla are of different minor releases."""

    #: The installed torch version, as its metadata says (``"2.13.0+cpu"``).
    torch: str
    #: The installed torch_xla version (``"2.9.0"``).
    torch_xla: str
    #: One sentence: what is installed and what torch_xla needs.
    reason: str
    #: The command that installs a matching pair.
    remedy: str


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def minor_of(version_text: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version such as ``"2.9.1+cpu"`` or ``"2.10.0.dev20250101"``."""
    match = _MINOR.match(version_text.strip())
    return (int(match[1]), int(match[2])) if match else None


def _pair_command(minor: tuple[int, int]) -> str:
    release = f"{minor[0]}.{minor[1]}"
    return f"pip install 'torch=={release}.*' 'torch_xla=={release}.*'"


def _newest_supported() -> tuple[int, int]:
    return max(SUPPORTED_XLA_MINORS)


def find_torch_xla_mismatch(
    torch_version: str | None = None, torch_xla_version: str | None = None
) -> TorchXlaMismatch | None:
    """The mismatch between installed torch and torch_xla, or None when they match.

    Versions not given are read from the installed packages' metadata. None also
    when either is missing or unparsable: there is nothing to compare then.
    """
    torch_version = torch_version or installed_version("torch")
    torch_xla_version = torch_xla_version or installed_version("torch_xla")
    if torch_version is None or torch_xla_version is None:
        return None
    torch_minor, xla_minor = minor_of(torch_version), minor_of(torch_xla_version)
    if torch_minor is None or xla_minor is None or torch_minor == xla_minor:
        return None
    # Keep torch_xla's release when accel supports it (only torch changes); otherwise
    # move both to the newest release accel supports.
    target = xla_minor if xla_minor in SUPPORTED_XLA_MINORS else _newest_supported()
    reason = (
        f"torch_xla {torch_xla_version} needs torch {xla_minor[0]}.{xla_minor[1]}.x, "
        f"but torch {torch_version} is installed"
    )
    return TorchXlaMismatch(torch_version, torch_xla_version, reason, _pair_command(target))


def install_torch_xla_remedy(torch_version: str | None = None) -> str:
    """The command that installs torch_xla to match the installed (or given) torch."""
    torch_version = torch_version or installed_version("torch")
    torch_minor = minor_of(torch_version) if torch_version else None
    if torch_minor is not None and torch_minor in SUPPORTED_XLA_MINORS:
        return f"pip install 'torch_xla=={torch_minor[0]}.{torch_minor[1]}.*'"
    target = _newest_supported()
    # torch_xla exists only for some torch releases, and accel supports fewer: install
    # the pair accel is tested with, which also changes torch.
    found = f"torch {torch_version} is installed" if torch_version else "torch is not installed"
    return (
        f"{_pair_command(target)} (accel supports torch_xla {target[0]}.{target[1]}, "
        f"which needs torch {target[0]}.{target[1]}.x; {found})"
    )


def reinstall_torch_xla_remedy(torch_xla_version: str | None = None) -> str:
    """The command that reinstalls a matching pair, for a torch_xla that fails to import."""
    torch_xla_version = torch_xla_version or installed_version("torch_xla")
    xla_minor = minor_of(torch_xla_version) if torch_xla_version else None
    if xla_minor is None or xla_minor not in SUPPORTED_XLA_MINORS:
        xla_minor = _newest_supported()
    return _pair_command(xla_minor).replace("pip install", "pip install --force-reinstall", 1)
