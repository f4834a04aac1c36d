"""docs/plugins.md's promise table and the tutorial's inlined code stay true.

The table lists every promise of the kit (all_promises()), in report order, with its
summary as the check and the planted bugs of test_planted_bugs.py that it catches; the
tutorial's code blocks are the example plugin's files, character for character.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_planted_bugs import CASES, DISTRIBUTED_CASES

import accel.hookspecs
from accel.testing.conformance import all_promises

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "plugins.md"
_CELL = r" \| (?P<{}>[^|]+)"
_ROW = re.compile(
    r"^\| `(?P<promise>[a-z_]+\.[a-z_]+)`"
    + "".join(_CELL.format(name) for name in ("where", "check", "bugs"))
    + r" \|$"
)


def _table() -> list[re.Match[str]]:
    text = PAGE.read_text(encoding="utf-8").partition("### Every promise, and the bug it catches")[
        2
    ]
    return [m for line in text.splitlines() if (m := _ROW.match(line))]


def _bugs() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for plugin, promise, _ in CASES:
        found.setdefault(promise, []).append(type(plugin).__name__)
    for name, promise, _ in DISTRIBUTED_CASES:
        found.setdefault(promise, []).append(name)
    return found


def test_the_table_lists_every_promise_with_its_check_and_planted_bug() -> None:
    rows = _table()
    expected = [
        (p.name, p.summary, ", ".join(f"`{bug}`" for bug in _bugs().get(p.name, [])))
        for p in all_promises()
    ]
    got = [(m["promise"], m["check"].strip(), m["bugs"].strip()) for m in rows]
    lines = "\n".join(f"| `{name}` | ... | {check} | {bugs} |" for name, check, bugs in expected)
    assert got == expected, f"docs/plugins.md's promise table should read:\n{lines}"


def test_every_promise_has_a_planted_bug_and_says_where_it_is_stated() -> None:
    bugs = _bugs()
    assert [p.name for p in all_promises() if p.name not in bugs] == []
    for row in _table():
        where = row["where"].strip()
        if where.startswith("hookspecs."):
            hooks = [name.strip() for name in where.removeprefix("hookspecs.").split(",")]
            assert set(hooks) <= set(accel.hookspecs.__all__), (row["promise"], hooks)
        else:
            section = where.removeprefix("plugins.md: ")
            assert where.startswith("plugins.md: ") and f"# {section}\n" in PAGE.read_text(), where


def _blocks_after(marker: str) -> str:
    text = PAGE.read_text(encoding="utf-8").partition(marker)[2]
    match = re.search(r"```[a-z]*\n(.*?)```\n", text, re.DOTALL)
    assert match is not None, marker
    return match.group(1)


def test_the_tutorials_inlined_code_is_the_example_plugins_files() -> None:
    example = REPO / "examples" / "accel-example-plugin"
    assert _blocks_after("The package's\nwhole `pyproject.toml`, build system included:") == (
        example / "pyproject.toml"
    ).read_text(encoding="utf-8")
    assert _blocks_after("`src/accel_example_plugin/__init__.py`, exactly as it is") == (
        example / "src" / "accel_example_plugin" / "__init__.py"
    ).read_text(encoding="utf-8")
    for name in ("opencl", "nntile"):
        path = REPO / "examples" / f"accel-{name}-plugin" / "src" / f"accel_{name}_plugin"
        assert _blocks_after(f"<!-- {name}'s conformance.py -->") == (
            path / "conformance.py"
        ).read_text(encoding="utf-8")
