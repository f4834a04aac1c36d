"""The kernel's ceiling: the handle, the registry, dispatch, moves, ties, the fallbacks,
the types and the hookspecs hold at most ``CEILING`` lines of code (not counting blank
lines, comment lines and docstring lines). New jobs get modules of their own outside."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import accel

PACKAGE = Path(accel.__file__).parent

#: The kernel, as the issue names it: the handle (accelerator.py), the registry
#: (registry.py, _registry/ with dispatch), moves (_core/), ties (tying/), the
#: fallbacks, the types and the hookspecs.
KERNEL = [
    "accelerator.py",
    "registry.py",
    "_registry/*.py",
    "_core/*.py",
    "tying/*.py",
    "plugins/_fallbacks.py",
    "types.py",
    "hookspecs.py",
]

#: The most lines of code the kernel may hold.
CEILING = 2650

#: Where code that is not the kernel's job goes, for the ceiling's message.
ELSEWHERE = (
    "put new jobs in modules of their own outside the kernel: accel/training/ (the "
    "step, checkpoints, materialize), accel/distributed/ (process groups, FSDP2, tensor "
    "parallel, SPMD), accel/plugins/ (a device's hooks), accel/tools/ or accel/testing/ "
    "(docs/architecture.md, Layers)"
)

#: The tokens that are not code by themselves.
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of every module, class and function docstring."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def lines_of_code(source: str) -> int:
    """Lines that hold code: a token other than a comment or layout, not a docstring
    (a string spanning lines counts on each of them)."""
    docstrings = _docstring_lines(ast.parse(source))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(code - docstrings)


def kernel_sizes() -> dict[str, int]:
    files = sorted({path for pattern in KERNEL for path in PACKAGE.glob(pattern)})
    return {str(path.relative_to(PACKAGE)): lines_of_code(path.read_text()) for path in files}


def test_lines_of_code_leave_out_blanks_comments_and_docstrings() -> None:
    source = (
        '"""A module docstring,\non two lines."""\n\n'
        "import os  # a comment after code counts as code\n"
        "# a comment line\n\n"
        "def f(x):\n"
        '    """Its docstring."""\n'
        "    text = '''a string\n"
        "    that is no docstring'''\n"
        "    return (x,\n"
        "            text)\n"
    )
    # import, def, the two lines of the string, the two lines of the return
    assert lines_of_code(source) == 6


def test_the_kernel_is_measured_file_by_file() -> None:
    sizes = kernel_sizes()
    assert {"accelerator.py", "hookspecs.py", "plugins/_fallbacks.py"} <= set(sizes)
    assert all(n > 0 for name, n in sizes.items() if not name.endswith("__init__.py"))


def over_the_ceiling(sizes: dict[str, int]) -> str | None:
    """What the ceiling test says of ``sizes``: ``None`` at or under the ceiling."""
    total = sum(sizes.values())
    if total <= CEILING:
        return None
    largest = ", ".join(f"{name} {n}" for name, n in sorted(sizes.items(), key=lambda x: -x[1])[:5])
    return (
        f"the kernel holds {total} lines of code, over its ceiling of {CEILING} (largest: "
        f"{largest}); {ELSEWHERE}"
    )


def test_the_kernel_holds_at_most_its_ceiling() -> None:
    problem = over_the_ceiling(kernel_sizes())
    assert problem is None, problem


def test_the_check_fails_one_line_over_the_ceiling() -> None:
    sizes = kernel_sizes()
    room = CEILING - sum(sizes.values())
    assert over_the_ceiling({**sizes, "accelerator.py": sizes["accelerator.py"] + room}) is None
    message = over_the_ceiling({**sizes, "accelerator.py": sizes["accelerator.py"] + room + 1})
    assert message is not None
    assert f"{CEILING + 1} lines of code, over its ceiling of {CEILING}" in message
    assert "accel/distributed/" in message
