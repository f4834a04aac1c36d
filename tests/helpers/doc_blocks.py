"""The code blocks of README.md and docs/*.md, with their ``doc-test`` directives.

The convention is documented for contributors in docs/contributing.md: an HTML comment
on the last non-blank line before a fenced block (invisible on the site and on GitHub)
says how the block is tested::

    <!-- doc-test: skip (needs two CUDA GPUs) -->
    <!-- doc-test: given model, optimizer -->
    <!-- doc-test: xla; continue; given xla_device -->
    <!-- doc-test: output; vary (time per step) -->
    <!-- doc-test: output (no plugins); torch (2.14.1); build (cuda) -->

Blocks tagged ``python`` or ``pycon`` run (in the main tier unless marked ``xla``);
every fenced block must name its language, so that no Python slips through untagged.
A ``text`` block marked ``output`` is a sample of what a ``$ accel ...`` command prints:
the test runs that command and compares (numbers on lines starting with a ``vary``
prefix may differ; ``output (no plugins)`` runs it as on a fresh install). A sample
marked ``torch (VERSION)`` shows what torch VERSION from PyPI prints, as a default
install gets it (a CUDA build, on a machine with no GPU): the check reads the installed
torch's version for VERSION, and on a torch built without CUDA the lines starting with
a ``build`` prefix match that prefix and anything after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNABLE = frozenset({"python", "pycon"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test\s*:(?P<body>.*?)-->\s*$")
_SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$')
_SKIP = re.compile(r"^skip\s*\((?P<reason>.*)\)$")
_OUTPUT = re.compile(r"^output(\s*\((?P<how>[^)]*)\))?$")
_VARY = re.compile(r"^vary\s*\((?P<prefix>[^)]+)\)$")
_TORCH = re.compile(r"^torch\s*\((?P<version>[^)]*)\)$")
_BUILD = re.compile(r"^build\s*\((?P<prefix>[^)]+)\)$")
_NUMBER = re.compile(r"\d+(\.\d+)?")


def display(path: Path) -> str:
    """The path as messages show it: relative to the repository where it is inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def doc_pages() -> list[Path]:
    """README.md and every page under docs/: new pages are picked up as they appear."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]


@dataclass
class Block:
    """One fenced block, its code with snippets expanded, and how it is to be tested."""

    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    skip: str | None = None
    xla: bool = False
    continues: bool = False
    givens: list[str] = field(default_factory=list)
    #: A sample of a command's output, checked by running it (``output`` directive).
    output: bool = False
    #: ``output (no plugins)``: run with third-party plugins off, as on a fresh install.
    no_plugins: bool = False
    #: Prefixes of output lines whose numbers differ from run to run (times).
    vary: list[str] = field(default_factory=list)
    #: ``torch (VERSION)``: the torch the sample shows, as a default install gets it
    #: (PyPI's CUDA build); the check puts the installed torch's version in its place.
    torch: str | None = None
    #: ``build (PREFIX)``: lines starting with PREFIX show what a CUDA build of torch
    #: finds; on a torch built without CUDA only their prefix is compared.
    build: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{display(self.page)}:{self.line}"


@dataclass
class Page:
    blocks: list[Block]
    #: Malformed directives and untagged fences, each with its location.
    problems: list[str]


def parse_page(path: Path) -> Page:
    lines = path.read_text(encoding="utf-8").splitlines()
    name = display(path)
    blocks: list[Block] = []
    problems: list[str] = []
    pending: tuple[int, str] | None = None  # a directive waiting for its block
    index = 0
    while index < len(lines):
        line = lines[index]
        directive = _DIRECTIVE.match(line)
        opening = _FENCE.match(line)
        if directive:
            if pending:
                problems.append(f"{name}:{pending[0]}: doc-test directive without a block")
            pending = (index + 1, directive["body"].strip())
        elif "doc-test" in line and line.lstrip().startswith("<!--"):
            problems.append(f"{name}:{index + 1}: write '<!-- doc-test: ... -->' on one line")
        elif opening:
            end = _closing_fence(lines, index, opening["fence"])
            language = opening["info"].split()[0] if opening["info"].split() else ""
            if not language:
                problems.append(f"{name}:{index + 1}: fenced block without a language")
            indent = len(opening["indent"])
            body = [text[indent:] for text in lines[index + 1 : end]]
            block = Block(path, index + 1, language, _expand_snippets(body, problems, name))
            if pending:
                _apply(pending[1], block, problems, f"{name}:{pending[0]}")
                if block.output and language != "text":
                    problems.append(f"{name}:{pending[0]}: 'output' on a {language!r} block")
                elif language not in RUNNABLE and not block.output:
                    problems.append(f"{name}:{pending[0]}: directive on a {language!r} block")
                if (block.torch is not None or block.build) and not block.output:
                    problems.append(f"{name}:{pending[0]}: 'torch' and 'build' need 'output'")
                if block.build and block.torch is None:
                    problems.append(
                        f"{name}:{pending[0]}: 'build (PREFIX)' needs 'torch (VERSION)', "
                        "the torch whose build the sample shows"
                    )
            pending = None
            blocks.append(block)
            index = end
        elif line.strip() and pending:
            problems.append(f"{name}:{pending[0]}: doc-test directive not right before a block")
            pending = None
        index += 1
    if pending:
        problems.append(f"{name}:{pending[0]}: doc-test directive without a block")
    _check_chains([b for b in blocks if b.language in RUNNABLE], problems)
    return Page(blocks, problems)


def _closing_fence(lines: list[str], start: int, fence: str) -> int:
    for index in range(start + 1, len(lines)):
        stripped = lines[index].strip()
        if stripped.startswith(fence) and set(stripped) == {fence[0]}:
            return index
    return len(lines)


def _expand_snippets(body: list[str], problems: list[str], name: str) -> str:
    """``--8<-- "path"`` lines, as MkDocs' snippets extension expands them."""
    expanded: list[str] = []
    for text in body:
        snippet = _SNIPPET.match(text)
        if snippet is None:
            expanded.append(text)
            continue
        # "path:section" takes the lines between `--8<-- [start:section]` and
        # `--8<-- [end:section]` in that file, as the snippets extension does.
        relative, _, section = snippet["path"].partition(":")
        path = REPO / relative
        if not path.is_file():
            problems.append(f"{name}: snippet {relative!r} does not exist")
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        if section:
            starts = [i for i, line in enumerate(lines) if f"[start:{section}]" in line]
            ends = [i for i, line in enumerate(lines) if f"[end:{section}]" in line]
            if not starts or not ends:
                problems.append(f"{name}: {relative!r} has no snippet section {section!r}")
                continue
            lines = lines[starts[0] + 1 : ends[0]]
        expanded.extend(lines)
    return "\n".join(expanded) + "\n"


def _apply(body: str, block: Block, problems: list[str], where: str) -> None:
    # ";" separates directives, except inside a skip's (reason).
    for part in (p.strip() for p in re.split(r";(?![^(]*\))", body)):
        skip = _SKIP.match(part)
        if skip:
            if not skip["reason"].strip():
                problems.append(f"{where}: 'skip' needs a reason: skip (why)")
            block.skip = skip["reason"].strip()
        elif output := _OUTPUT.match(part):
            how = output["how"]
            if how not in (None, "no plugins"):
                problems.append(f"{where}: 'output' takes nothing or (no plugins), not {how!r}")
            block.output, block.no_plugins = True, how == "no plugins"
        elif vary := _VARY.match(part):
            block.vary.append(vary["prefix"].strip())
        elif shows := _TORCH.match(part):
            if not shows["version"].strip():
                problems.append(f"{where}: 'torch' needs the version the sample shows")
            block.torch = shows["version"].strip()
        elif build := _BUILD.match(part):
            block.build.append(build["prefix"].strip())
        elif part == "xla":
            block.xla = True
        elif part == "continue":
            block.continues = True
        elif part.startswith("given "):
            block.givens += [n.strip() for n in part[len("given ") :].split(",") if n.strip()]
        else:
            problems.append(
                f"{where}: unknown doc-test directive {part!r}; use skip (reason), xla, "
                f"continue, given NAME, ..., output, vary (PREFIX), torch (VERSION) or "
                f"build (PREFIX)"
            )


def _check_chains(blocks: list[Block], problems: list[str]) -> None:
    for previous, block in zip([None, *blocks][: len(blocks)], blocks, strict=True):
        if not block.continues:
            continue
        if previous is None:
            problems.append(f"{block.where}: 'continue' on the page's first runnable block")
        elif previous.skip is not None or block.skip is not None:
            problems.append(f"{block.where}: 'continue' and 'skip' do not mix")
        elif previous.xla != block.xla:
            problems.append(f"{block.where}: 'continue' across tiers (mark both 'xla' or none)")


def chains(page: Page) -> list[list[Block]]:
    """Runnable blocks grouped so that each ``continue`` block runs after its predecessor."""
    grouped: list[list[Block]] = []
    for block in page.blocks:
        if block.language not in RUNNABLE:
            continue
        if block.continues and grouped:
            grouped[-1].append(block)
        else:
            grouped.append([block])
    return grouped


@dataclass
class Example:
    """One ``>>>`` statement of a pycon block and the output the page shows for it."""

    source: str
    expected: str


def pycon_examples(code: str) -> list[Example]:
    examples: list[Example] = []
    for line in code.splitlines():
        if line.startswith(">>>"):
            examples.append(Example(line[4:] + "\n", ""))
        elif line.startswith("...") and examples and not examples[-1].expected:
            examples[-1].source += line[4:] + "\n"
        elif examples:
            examples[-1].expected += line + "\n"
    return examples


def output_matches(expected: str, got: str) -> bool:
    """Equal up to whitespace (wrapped lines), where ``...`` in ``expected`` matches anything."""
    lines = expected.strip().splitlines()
    if lines and lines[0].startswith("Traceback (most recent call last):"):
        lines = [line for line in lines[1:] if not line.startswith((" ", "\t"))]
    pieces = [re.escape(" ".join(piece.split())) for piece in " ".join(lines).split("...")]
    pattern = r"\s*.*?\s*".join(pieces)
    return re.fullmatch(pattern, " ".join(got.split()), flags=re.DOTALL) is not None


def sample_command(block: Block) -> tuple[dict[str, str], list[str], str]:
    """An ``output`` block's command: (environment it sets, ``accel`` arguments, the
    output the page shows). The block's first line is ``$ [VAR=value ...] accel ARGS``."""
    import shlex

    first, _, shown = block.code.partition("\n")
    words = shlex.split(first.removeprefix("$ "))
    if not first.startswith("$ "):
        raise ValueError(f"{block.where}: an output block starts with '$ accel ...'")
    environment: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        environment[key] = value
    if not words or words[0] != "accel":
        raise ValueError(f"{block.where}: an output block runs 'accel', not {first!r}")
    return environment, words[1:], shown


def masked(shown: str, vary: list[str]) -> str:
    """``shown`` with the numbers of lines starting with a ``vary`` prefix as ``...``."""
    lines = [
        _NUMBER.sub("...", line) if any(line.lstrip().startswith(p) for p in vary) else line
        for line in shown.splitlines()
    ]
    return "\n".join(lines)


def as_installed(block: Block, shown: str, torch_version: str, cuda_build: bool) -> str:
    """``shown`` as the installed torch prints it, for a ``torch (VERSION)`` sample:
    ``torch_version`` (as its distribution's metadata names it) where the sample names
    VERSION, and, unless ``cuda_build``, each line starting with a ``build`` prefix cut
    to ``PREFIX ...``. Other samples are returned as they are."""
    if block.torch is None:
        return shown
    # The version alone: not a part of 2.14.10, 12.14.1 or 2.14.1+cu130.
    version = re.compile(rf"(?<![\w.+]){re.escape(block.torch)}(?![\w+]|\.\d)")
    lines = []
    for line in version.sub(lambda _: torch_version, shown).splitlines():
        prefix = next((p for p in block.build if line.lstrip().startswith(p)), None)
        if prefix is not None and not cuda_build:
            line = f"{line[: line.index(prefix) + len(prefix)]} ..."
        lines.append(line)
    return "\n".join(lines)


def slurm_batch_script(path: Path) -> Block:
    """The one SLURM batch script ``path`` shows: its ``bash`` block with ``#SBATCH``
    lines. The tests run it as it is written there (docs/training.md's)."""
    blocks = [b for b in parse_page(path).blocks if b.language == "bash" and "#SBATCH" in b.code]
    if len(blocks) != 1:
        raise ValueError(f"{display(path)} shows {len(blocks)} SLURM batch scripts, not one")
    return blocks[0]
