"""Public names a package imports on first use (PEP 562): the one lazy-loading device.

``import accel`` and ``import accel.distributed`` must stay cheap and free of torch, yet
offer names whose modules need torch. Their ``__init__`` maps each name to the module
that defines it; :func:`lazy_names` gives the package's ``__getattr__`` and ``__dir__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    namespace: dict[str, Any], definitions: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose globals are ``namespace``.

    :param definitions: public name -> the module defining it, imported on first access.
    :param public: the package's ``__all__``, listed by ``dir()``.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module_name = definitions.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__
