"""docs/api.md is the public API, all of it: the test keeps the page and the package's
``__all__`` lists equal, name for name (see docs/architecture.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import accel

PACKAGE = Path(accel.__file__).parent
API_PAGE = PACKAGE.parent / "docs" / "api.md"

# "::: target" and, indented under it, "options:" with "members: false" or a list.
_BLOCK = re.compile(r"^::: ([\w.]+)\n((?:[ ]{4}.*\n|\n(?=[ ]{4}))*)", re.MULTILINE)


def _public_modules() -> dict[str, list[str]]:
    """Every module without a part starting with ``_``, and its ``__all__`` (read from
    the source: the integrations' libraries need not be installed)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue
        names: list[str] = []
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                getattr(target, "id", None) == "__all__" for target in node.targets
            ):
                names = list(ast.literal_eval(node.value))
        modules[".".join(parts)] = names
    return modules


def _blocks(text: str) -> dict[str, list[str] | None]:
    """Each documented target and its members list (``None``: ``members: false``)."""
    blocks: dict[str, list[str] | None] = {}
    for match in _BLOCK.finditer(text):
        target, options = match.group(1), match.group(2)
        assert target not in blocks, f"{target} is documented twice"
        if re.search(r"members: false", options):
            blocks[target] = None
        else:
            blocks[target] = re.findall(r"^\s+- (\w+)$", options, flags=re.MULTILINE)
    return blocks


def _differences(text: str) -> list[str]:
    blocks = _blocks(text)
    modules = _public_modules()
    top = set(modules.pop("accel")) - {"__version__"}
    problems = []
    names_documented = {t.removeprefix("accel.") for t in blocks if t.count(".") == 1}
    names_documented -= {m.removeprefix("accel.") for m in modules}
    if names_documented != top:
        problems.append(
            f"accel.__all__ vs the page: missing {sorted(top - names_documented)}, "
            f"extra {sorted(names_documented - top)}"
        )
    for module, names in modules.items():
        if module not in blocks:
            problems.append(f"{module} is public but not on the page")
            continue
        members = blocks[module]
        if members is None:
            if not set(names) <= top:
                problems.append(
                    f"{module}: members: false, yet its __all__ has names accel does not "
                    f"export: {sorted(set(names) - top)}"
                )
        elif sorted(members) != sorted(names):
            problems.append(f"{module}: the page lists {members}, __all__ is {names}")
    private = [t for t in blocks if any(part.startswith("_") for part in t.split("."))]
    problems += [f"{t} is private but on the page" for t in private]
    unknown = [
        t
        for t in blocks
        if t not in modules
        and t.count(".") != 1
        and not any(p.startswith("_") for p in t.split("."))
    ]
    problems += [f"{t} is neither a public module nor a name of accel" for t in unknown]
    return problems


def test_the_api_page_lists_exactly_the_public_names() -> None:
    assert _differences(API_PAGE.read_text()) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("        - retie\n", ""), "accel.tying: the page lists"),
        (lambda t: t.replace("::: accel.list_accelerators\n", ""), "missing ['list_accelerators']"),
        (lambda t: t + "\n::: accel._registry.catalog\n", "is private but on the page"),
        (
            lambda t: re.sub(r"::: accel\.training\.buckets\n(    .*\n)+", "", t),
            "accel.training.buckets is public but not on the page",
        ),
    ],
)
def test_the_check_finds_each_kind_of_difference(edit: object, expected: str) -> None:
    edited = edit(API_PAGE.read_text())  # type: ignore[operator]
    assert any(expected in problem for problem in _differences(edited))
