"""The plugin guide's hook table (docs/plugins.md): every hook of accel.hookspecs once,
with the arguments its specification has."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from accel import hookspecs

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
ROW = re.compile(r"^\| `(\w+)\(([^)]*)\)` \|", flags=re.MULTILINE)


def test_every_hook_has_one_row_with_its_specifications_arguments() -> None:
    rows = ROW.findall(PAGE.read_text(encoding="utf-8"))
    names = [name for name, _ in rows]
    assert sorted(names) == sorted(hookspecs.__all__), "each hook once, and only hooks"
    for name, arguments in rows:
        expected = list(inspect.signature(getattr(hookspecs, name)).parameters)
        assert [a.strip() for a in arguments.split(",") if a.strip()] == expected, name
