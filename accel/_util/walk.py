"""Walking a model's modules, each once.

``Module.modules()`` builds a dotted name for every module on the way; the tying
checks and the restore point run on every move and need only the modules, so they
walk with an explicit stack instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["each_module"]


def each_module(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` and every module under it, each once (a shared submodule too)."""
    visited: set[int] = set()
    stack = [model]
    while stack:
        module = stack.pop()
        if id(module) in visited:
            continue
        visited.add(id(module))
        yield module
        stack.extend(child for child in module._modules.values() if child is not None)
