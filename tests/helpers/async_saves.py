"""For the asynchronous-save tests: a background write held until the test lets it go,
and a tensor on a device the host cannot read but through a copy."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_map

from accel.training import atomic

HOLD_TIMEOUT_S = 60


class HeldWrites:
    """Every write of a checkpoint's bytes waits until :meth:`release`; ``started`` is
    set by the first one, so the test knows the save is in the middle of its write."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = threading.Event()
        self._released = threading.Event()
        self.threads: list[str] = []
        real = atomic._RecordingFile.write

        def write(file: atomic._RecordingFile, data: Any) -> int:
            if not self.started.is_set():
                self.threads.append(threading.current_thread().name)
                self.started.set()
            if not self._released.wait(HOLD_TIMEOUT_S):
                raise AssertionError("the held write was never released")
            return real(file, data)

        monkeypatch.setattr(atomic._RecordingFile, "write", write)

    def release(self) -> None:
        self._released.set()

    def wait_started(self) -> None:
        assert self.started.wait(HOLD_TIMEOUT_S), "the background write never started"


class OffHostTensor(torch.Tensor):
    """A tensor on the ``meta`` device that holds values, as a vendor device's memory
    does: the host sees it only through a copy (``aten._to_copy`` to the CPU), and
    every other operation runs on the values it wraps."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> OffHostTensor:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device="meta", strides=inner.stride()
        )
        wrapper.inner = inner
        return wrapper  # type: ignore[no-any-return]

    def __repr__(self) -> str:  # type: ignore[override]
        return f"OffHostTensor({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu"):
            COPIES.append(func)
            return args[0].inner.clone()
        unwrapped = tree_map(lambda x: x.inner if isinstance(x, OffHostTensor) else x, args)
        result = func(*unwrapped, **tree_map(lambda x: x, kwargs))
        if func._schema.name.endswith("_") or func._schema.is_mutable:
            return args[0]  # in place: the same tensor, its values changed
        return tree_map(lambda x: OffHostTensor(x) if isinstance(x, torch.Tensor) else x, result)


#: Every copy an :class:`OffHostTensor` made to the host.
COPIES: list[Any] = []
