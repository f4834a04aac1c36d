"""CHANGELOG.md is release notes a user reads in five minutes, true to the code: short,
one section for the coming release, and every name and page it mentions exists."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import accel

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
TEXT = CHANGELOG.read_text(encoding="utf-8")
# A code span that starts with a dotted name of accel's (`accel.x.y`) or of a handle
# (`acc.x`), as in `acc.save(obj, path)`.
NAMES = sorted(set(re.findall(r"`((?:accel|acc)(?:\.\w+)+)", TEXT)))
PATHS = sorted(set(re.findall(r"`((?:docs|examples|scripts)/[\w./-]+)`", TEXT)))


def _resolve(dotted: str) -> Any:
    """The object a dotted name names: `acc.x` on the handle's class, `accel.a.b` by
    importing the longest module prefix and reading the rest from its `__all__`."""
    parts = dotted.split(".")
    if parts[0] == "acc":
        return getattr(accel.Accelerator, parts[1])
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:
                continue
            # A module of an extra whose library this env lacks (Ray): it exists all the same.
            if cut == len(parts) and importlib.util.find_spec(module_name) is not None:
                return module_name
            raise
        for part in parts[cut:]:
            if isinstance(found, ModuleType):  # public means in the module's __all__
                assert part in found.__all__, f"{dotted}: not in {found.__name__}.__all__"
            found = getattr(found, part)
        return found
    raise AssertionError(f"nothing imports as {dotted}")


def test_it_is_read_in_five_minutes() -> None:
    assert len(TEXT.encode("utf-8")) < 10 * 1024


def test_it_has_one_section_for_the_coming_release() -> None:
    assert "[Keep a Changelog](https://keepachangelog.com/" in TEXT
    assert "[Semantic Versioning](https://semver.org/)" in TEXT
    assert re.findall(r"^## .*$", TEXT, re.MULTILINE) == ["## 0.1.0 — Unreleased"]


def test_it_is_release_notes_not_a_diary() -> None:
    assert not re.search(r"\b(issue|PR) #?\d+|#\d{2,}|lines of code", TEXT, re.IGNORECASE)


@pytest.mark.parametrize("dotted", NAMES)
def test_every_name_it_mentions_is_public_and_exists(dotted: str) -> None:
    assert not any(part.startswith("_") for part in dotted.split(".")), dotted
    assert _resolve(dotted) is not None


@pytest.mark.parametrize("path", PATHS)
def test_every_page_and_file_it_names_exists(path: str) -> None:
    assert (REPO / path).exists(), path


def test_it_names_names_and_pages_at_all() -> None:
    """The two tests above would pass on a changelog that names nothing."""
    assert {"acc.materialize", "accel.distributed.parallelize_tied"} <= set(NAMES)
    assert "docs/large-models.md" in PATHS
