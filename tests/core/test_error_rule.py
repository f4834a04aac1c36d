"""The error rule of docs/errors.md, checked on accel's source: every exception class
accel constructs (``raise X(...)``, or ``X(...)`` built by a helper and raised by its
caller) is an :class:`accel.AcceleratorError` subclass, or is on the allow-list below,
each entry with the reason it is not one.
"""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import pytest

import accel

PACKAGE = Path(accel.__file__).resolve().parent

#: (module, class name) -> why the class is not an AcceleratorError.
ALLOWED: dict[tuple[str, str], str] = {
    # The OS's own error, re-raised with the checkpoint named: same subclass (picked by
    # errno: FileNotFoundError, PermissionError, ...) and errno, so `except
    # FileNotFoundError` and `e.errno` keep working.
    (
        "accel.training.checkpoint._atomic",
        "OSError",
    ): "the OS's error, re-raised with the path named",
    # torch's weights_only refusal, re-worded: `except pickle.UnpicklingError` is what
    # torch users write.
    ("accel.training.checkpoint._read", "UnpicklingError"): "torch's refusal, re-worded",
    # Python's own for a missing optional dependency, raised at import time.
    ("accel.integrations.lightning", "ModuleNotFoundError"): "a missing 'lightning'",
    ("accel.integrations.ray", "ModuleNotFoundError"): "a missing 'ray[train]'",
    # The PEP 562 module __getattr__ protocol requires AttributeError.
    ("accel._util.lazy", "AttributeError"): "module __getattr__ protocol",
    # The user's Ctrl-C, re-raised with what was being loaded named.
    ("accel._registry.loading", "KeyboardInterrupt"): "the user's interrupt, passed on",
    # Internal control flow, caught where it is raised.
    ("accel.training.nested", "_CycleFound"): "caught in the same module",
    ("accel.tools.cli", "CliError"): "caught by main(), which exits with status 2",
    # The command line: argparse's and the interpreter's protocols.
    ("accel.tools.cli", "ArgumentTypeError"): "argparse's protocol",
    ("accel.__main__", "SystemExit"): "the CLI's exit status",
    # pytest's own protocol for a bad option and a failed test.
    ("accel.tools.pytest_plugin", "UsageError"): "pytest's protocol",
    ("accel.tools.pytest_plugin", "Failed"): "pytest.fail.Exception, pytest's protocol",
    # The conformance kit: a promise that does not hold is an AssertionError, pytest's
    # protocol for a failed check (run() reports it as "failed", with its message).
    ("accel.testing.conformance._batches", "AssertionError"): "a promise that failed",
    ("accel.testing.conformance._checkpoints", "AssertionError"): "a promise that failed",
    # The kit plants a full disk's OSError in the object a save writes.
    ("accel.testing.conformance._checkpoints", "OSError"): "the planted full disk",
    ("accel.testing.conformance._distributed", "AssertionError"): "a promise that failed",
    ("accel.testing.conformance._generators", "AssertionError"): "a promise that failed",
    ("accel.testing.conformance._moves", "AssertionError"): "a promise that failed",
    ("accel.testing.conformance._selection", "AssertionError"): "a promise that failed",
    # The failures the rollback and batch checks plant, each caught by its own check.
    ("accel.testing.conformance._moves", "_PlantedMoveError"): "caught by its own check",
    ("accel.testing.conformance._batches", "_RefusedBatchError"): "caught by its own check",
}

#: Hook specifications are protocols: their bodies say "implement me".
PROTOCOL_ONLY = {"NotImplementedError"}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def _resolve(expr: ast.expr, namespace: dict[str, object]) -> object:
    """The object ``expr`` (a name or a dotted attribute) names, or None."""
    if isinstance(expr, ast.Name):
        if expr.id in namespace:
            return namespace[expr.id]
        return getattr(builtins, expr.id, None)
    if isinstance(expr, ast.Attribute):
        owner = _resolve(expr.value, namespace)
        return None if owner is None else getattr(owner, expr.attr, None)
    return None


def _constructed(module: str, path: Path) -> list[tuple[int, str, type[BaseException]]]:
    """Every exception class ``module`` constructs or raises by name, with its line."""
    namespace: dict[str, object] = {}
    if not module.endswith("__main__"):  # importing it would run the CLI
        try:
            namespace = vars(importlib.import_module(module))
        except ImportError:  # an optional dependency (torch_xla) is missing here
            pass
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        target: ast.expr | None = None
        if isinstance(node, ast.Call):
            target = node.func
        elif isinstance(node, ast.Raise) and isinstance(node.exc, (ast.Name, ast.Attribute)):
            target = node.exc
        if target is None:
            continue
        obj = _resolve(target, namespace)
        # Warnings are classes passed to warn_at_caller, not raised.
        if (
            isinstance(obj, type)
            and issubclass(obj, BaseException)
            and not issubclass(obj, Warning)
        ):
            found.append((node.lineno, ast.unparse(target), obj))
    return found


def test_every_exception_accel_constructs_follows_the_rule() -> None:
    broken = []
    allowed_used = set()
    for module, path in _modules():
        for line, written, cls in _constructed(module, path):
            if issubclass(cls, accel.AcceleratorError) or cls.__name__ in PROTOCOL_ONLY:
                continue
            key = (module, cls.__name__)
            if key in ALLOWED:
                allowed_used.add(key)
                continue
            broken.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {written}")
    assert broken == [], (
        "raise an accel.errors class (AcceleratorValueError, ...) or add a commented "
        "entry to ALLOWED:\n" + "\n".join(broken)
    )
    # An entry that no longer matches anything is stale: the allow-list stays exact.
    assert set(ALLOWED) - allowed_used == set()


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (accel.AcceleratorTypeError, TypeError),
        (accel.AcceleratorValueError, ValueError),
        (accel.AcceleratorKeyError, KeyError),
        (accel.AcceleratorRuntimeError, RuntimeError),
        (accel.AcceleratorOSError, OSError),
        (accel.AcceleratorFileNotFoundError, FileNotFoundError),
        (accel.AcceleratorFileExistsError, FileExistsError),
    ],
)
def test_each_class_is_both_accels_and_the_builtin(
    cls: type[Exception], builtin: type[Exception]
) -> None:
    assert issubclass(cls, accel.AcceleratorError)
    assert issubclass(cls, builtin)


def test_an_os_error_keeps_errno_and_filename() -> None:
    error = accel.AcceleratorFileNotFoundError(2, "load: there is no checkpoint", "a.pt")
    assert type(error) is accel.AcceleratorFileNotFoundError
    assert (error.errno, error.filename, error.strerror) == (
        2,
        "a.pt",
        "load: there is no checkpoint",
    )
