"""The doc-test convention itself: directives are read as documented, mistakes are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.doc_blocks import chains, output_matches, parse_page, pycon_examples

FENCE = "```"


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text.replace("FENCE", FENCE))
    return path


def test_directives_are_read_into_the_block(tmp_path: Path) -> None:
    parsed = parse_page(
        page(
            tmp_path,
            "# Title\n\n"
            "<!-- doc-test: skip (needs two GPUs; and a TPU) -->\nFENCEpython\nx = 1\nFENCE\n\n"
            "<!-- doc-test: xla; given model, optimizer -->\n\nFENCEpython\ny = 2\nFENCE\n"
            "<!-- doc-test: xla; continue -->\nFENCEpycon\n>>> y\n2\nFENCE\n"
            "FENCEbash\necho not python\nFENCE\n",
        )
    )
    assert parsed.problems == []
    skipped, given, continued, bash = parsed.blocks
    assert (skipped.skip, skipped.xla, skipped.code) == (
        "needs two GPUs; and a TPU",
        False,
        "x = 1\n",
    )
    assert (given.xla, given.givens, given.skip) == (True, ["model", "optimizer"], None)
    assert (continued.language, continued.continues) == ("pycon", True)
    assert bash.language == "bash"
    assert [[b.line for b in chain] for chain in chains(parsed)] == [[4], [10, 14]]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("FENCE\nx = 1\nFENCE\n", "fenced block without a language"),
        ("<!-- doc-test: skip () -->\nFENCEpython\nFENCE\n", "'skip' needs a reason"),
        ("<!-- doc-test: skip -->\nFENCEpython\nFENCE\n", "unknown doc-test directive 'skip'"),
        ("<!-- doc-test: givn model -->\nFENCEpython\nFENCE\n", "unknown doc-test directive"),
        ("<!-- doc-test: xla -->\ntext\n\nFENCEpython\nFENCE\n", "not right before a block"),
        ("<!-- doc-test: xla -->\n", "directive without a block"),
        ("<!-- doc-test: xla -->\nFENCEbash\nls\nFENCE\n", "directive on a 'bash' block"),
        ("<!-- doc-test:\nxla -->\nFENCEpython\nFENCE\n", "on one line"),
        ("<!-- doc-test: continue -->\nFENCEpython\nFENCE\n", "page's first runnable block"),
        (
            "<!-- doc-test: xla -->\nFENCEpython\nFENCE\n"
            "<!-- doc-test: continue -->\nFENCEpython\nFENCE\n",
            "'continue' across tiers",
        ),
        ('FENCEpython\n--8<-- "no/such/file.py"\nFENCE\n', "snippet 'no/such/file.py'"),
    ],
)
def test_mistakes_are_reported_with_their_line(tmp_path: Path, text: str, problem: str) -> None:
    problems = parse_page(page(tmp_path, text)).problems
    assert len(problems) == 1 and problem in problems[0], problems
    assert f"{tmp_path / 'page.md'}:" in problems[0]


def test_snippets_are_expanded_as_mkdocs_does(tmp_path: Path) -> None:
    text = 'FENCEpython\nimport os\n--8<-- "tests/helpers/cli_factories.py"\nFENCE\n'
    (block,) = parse_page(page(tmp_path, text)).blocks
    expected = (Path(__file__).resolve().parents[1] / "helpers" / "cli_factories.py").read_text()
    assert block.code == "import os\n" + expected


def test_pycon_statements_and_their_output() -> None:
    examples = pycon_examples(">>> import accel\n>>> for i in range(2):\n...     i\n0\n1\n")
    assert [(e.source, e.expected) for e in examples] == [
        ("import accel\n", ""),
        ("for i in range(2):\n    i\n", "0\n1\n"),
    ]


@pytest.mark.parametrize(
    ("expected", "got", "matches"),
    [
        ("ValueError: a long\nmessage, wrapped\n", "ValueError: a long message, wrapped", True),
        ("ValueError: a ... wrapped\n", "ValueError: a long message, wrapped", True),
        ("ValueError: a long message\n", "ValueError: a long message, wrapped", False),
        ("KeyError: a long message, wrapped\n", "ValueError: a long message, wrapped", False),
        (
            "Traceback (most recent call last):\n  ...\nValueError: boom\n",
            "ValueError: boom",
            True,
        ),
        ("", "", True),
        ("", "printed something", False),
    ],
)
def test_output_matches(expected: str, got: str, matches: bool) -> None:
    assert output_matches(expected, got) is matches
