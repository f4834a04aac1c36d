"""Entry-point plugins claiming names others hold, for tests/core/test_name_claims.py."""

from __future__ import annotations

from helpers.fakes import FakeAccelerator


class CpuClaimer(FakeAccelerator):
    """Claims the built-in CPU's canonical name as an alias."""

    def __init__(self) -> None:
        super().__init__("cpu2", aliases=("cpu",), priority=5)


class GpuAliasClaimer(FakeAccelerator):
    """Claims the built-in alias ``gpu`` (held by ``cuda`` and ``mps``)."""

    def __init__(self) -> None:
        super().__init__("npu", aliases=("gpu", "ascend"), priority=80)


class VendorAliasA(FakeAccelerator):
    def __init__(self) -> None:
        super().__init__("vendora", aliases=("vx",), priority=60)


class VendorAliasB(FakeAccelerator):
    def __init__(self) -> None:
        super().__init__("vendorb", aliases=("vx",), priority=60)


class VendorLateGpu(FakeAccelerator):
    """Claims VendorAliasA's name and the built-in alias ``gpu`` at once (loaded after
    VendorAliasA: distributions load in name order)."""

    def __init__(self) -> None:
        super().__init__("vendora", aliases=("gpu",), priority=60)


class NpxPlain(FakeAccelerator):
    """Claims ``npx``, with no alias."""

    def __init__(self) -> None:
        super().__init__("npx", priority=60)


class NpxAliased(FakeAccelerator):
    """Claims ``npx`` too, and declares the alias ``neuralpx`` for it."""

    def __init__(self) -> None:
        super().__init__("npx", aliases=("neuralpx",), priority=60)


class VendorXOne(FakeAccelerator):
    def __init__(self) -> None:
        super().__init__("vendorx", aliases=("vx",), priority=60)


class VendorXTwo(FakeAccelerator):
    """Claims both of VendorXOne's names: the canonical one and its alias."""

    def __init__(self) -> None:
        super().__init__("vendorx", aliases=("vx",), priority=60)
