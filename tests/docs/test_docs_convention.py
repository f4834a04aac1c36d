"""The doc-test convention itself: directives are read as documented, mistakes are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.doc_blocks import (
    as_installed,
    chains,
    masked,
    output_matches,
    parse_page,
    pycon_examples,
)

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
        ("<!-- doc-test: output; torch () -->\nFENCEtext\n$ accel list\nFENCE\n", "'torch' needs"),
        (
            "<!-- doc-test: output; build (cuda) -->\nFENCEtext\n$ accel list\nFENCE\n",
            "'build (PREFIX)' needs 'torch (VERSION)'",
        ),
        ("<!-- doc-test: torch (2.14.1) -->\nFENCEpython\nFENCE\n", "need 'output'"),
    ],
)
def test_mistakes_are_reported_with_their_line(tmp_path: Path, text: str, problem: str) -> None:
    problems = parse_page(page(tmp_path, text)).problems
    assert len(problems) == 1 and problem in problems[0], problems
    assert f"{tmp_path / 'page.md'}:" in problems[0]


#: A sample as a default install prints it (torch 2.14.1 from PyPI, a CUDA build, no GPU).
SAMPLE = (
    "<!-- doc-test: output; torch (2.14.1); build (cuda); vary (time) -->\n"
    "FENCEtext\n$ accel list\n"
    "tpu  no  torch 2.9.x needed; torch 2.14.1 is installed\n"
    "cuda  no  no GPU driver found\n"
    "time: 2.14 ms\n"
    "FENCE\n"
)


def test_torch_and_build_are_read_into_the_block(tmp_path: Path) -> None:
    parsed = parse_page(page(tmp_path, SAMPLE))
    assert parsed.problems == []
    (block,) = parsed.blocks
    assert (block.output, block.torch, block.build, block.vary) == (
        True,
        "2.14.1",
        ["cuda"],
        ["time"],
    )


@pytest.mark.parametrize(
    ("version", "cuda_build", "printed", "matches"),
    [
        # The torch the sample shows: compared as shown, the build's line included.
        ("2.14.1", True, "torch 2.14.1 is installed\ncuda  no  no GPU driver found", True),
        ("2.14.1", True, "torch 2.14.1 is installed\ncuda  no  no CUDA support", False),
        ("2.14.1", True, "torch 2.13.0 is installed\ncuda  no  no GPU driver found", False),
        # Another CUDA build: its version where the sample shows 2.14.1.
        ("2.13.0", True, "torch 2.13.0 is installed\ncuda  no  no GPU driver found", True),
        ("2.13.0", True, "torch 2.14.1 is installed\ncuda  no  no GPU driver found", False),
        # A build without CUDA: its version, and the build's line only by its prefix.
        ("2.13.0+cpu", False, "torch 2.13.0+cpu is installed\ncuda  no  no CUDA support", True),
        ("2.13.0+cpu", False, "torch 2.13.0 is installed\ncuda  no  no CUDA support", False),
        ("2.13.0+cpu", False, "torch 2.13.0+cpu is installed\ncpu  yes", False),
    ],
)
def test_a_torch_sample_is_checked_against_the_installed_torch(
    tmp_path: Path, version: str, cuda_build: bool, printed: str, matches: bool
) -> None:
    (block,) = parse_page(page(tmp_path, SAMPLE)).blocks
    shown = block.code.partition("\n")[2]
    expected = masked(as_installed(block, shown, version, cuda_build), block.vary)
    got = f"tpu  no  torch 2.9.x needed; {printed.splitlines()[0]}\n"
    got += "\n".join(printed.splitlines()[1:]) + "\ntime: 3.5 ms\n"
    assert output_matches(expected, got) is matches, expected


def test_only_the_version_the_sample_names_is_replaced(tmp_path: Path) -> None:
    text = SAMPLE.replace("$ accel list\n", "$ accel list\n2.14.10 12.14.1 2.14.1+cu130 2.14.1.\n")
    (block,) = parse_page(page(tmp_path, text)).blocks
    shown = block.code.partition("\n")[2]
    replaced = as_installed(block, shown, "2.15.0", True).splitlines()[0]
    assert replaced == "2.14.10 12.14.1 2.14.1+cu130 2.15.0."
    # A sample without 'torch (VERSION)' is compared as it is, whatever torch runs.
    plain = SAMPLE.replace("torch (2.14.1); build (cuda); ", "")
    (block,) = parse_page(page(tmp_path, plain)).blocks
    assert as_installed(block, block.code, "2.13.0+cpu", False) == block.code


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
