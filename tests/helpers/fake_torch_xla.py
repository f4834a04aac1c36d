"""torch_xla that looks installed to ``importlib.util.find_spec`` but fails to import,
as one built for another torch does: the probes must answer without importing it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from typing import Any

import pytest

from accel.plugins import tpu


class _BrokenTorchXla:
    """A meta-path finder failing like a torch_xla built for another torch."""

    def find_spec(self, name: str, *args: Any) -> None:
        if name == "torch_xla" or name.startswith("torch_xla."):
            raise ImportError("_XLAC.so: undefined symbol: _ZN5torch8autograd")


def pretend_torch_xla(
    monkeypatch: pytest.MonkeyPatch, *, installed: bool = True, pjrt: str | None = None
) -> None:
    """Pretend torch_xla is (not) installed, importing it failing, and no TPU here;
    ``PJRT_DEVICE`` set to ``pjrt`` (``None``: unset)."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name == "torch_xla":
            return importlib.machinery.ModuleSpec("torch_xla", None) if installed else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchXla(), *sys.meta_path])
    monkeypatch.setattr(tpu, "tpu_hardware_present", lambda: False)
    if pjrt is None:
        monkeypatch.delenv("PJRT_DEVICE", raising=False)
    else:
        monkeypatch.setenv("PJRT_DEVICE", pjrt)
