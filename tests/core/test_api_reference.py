"""docs/api.md is the public API, all of it: the test keeps the page and the package's
``__all__`` lists equal, name for name (see docs/architecture.md), and the surface
small: at most 122 names, each public in one module."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

import accel
import accel.errors
import accel.plugins
import accel.training.step

PACKAGE = Path(accel.__file__).parent
API_PAGE = PACKAGE.parent / "docs" / "api.md"

#: The most distinct public names accel keeps: every name a user, a plugin author or an
#: embedding library has to learn, a re-export counted once (120, and two for large
#: models: the contract's parallelize_tied and, on XLA, spmd_fully_shard_tied).
MAX_PUBLIC_NAMES = 122
#: The modules ``accel`` itself is made of: the top level re-exports names of these only.
TOP_MODULES = (
    "accel.accelerator",
    "accel.errors",
    "accel.markers",
    "accel.registry",
    "accel.types",
)

# "::: target" and, indented under it, "options:" with "members: false" or a list.
_BLOCK = re.compile(r"^::: ([\w.]+)\n((?:[ ]{4}.*\n|\n(?=[ ]{4}))*)", re.MULTILINE)


def _public_sources() -> dict[str, str]:
    """Every module without a part starting with ``_``, and its source."""
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            sources[".".join(parts)] = path.read_text()
    return sources


def _declared_all(source: str) -> list[str] | None:
    """The module's ``__all__`` (plain or annotated), ``None`` where it has none."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(getattr(target, "id", None) == "__all__" for target in targets):
            return list(ast.literal_eval(node.value))
    return None


def _without_all(sources: dict[str, str]) -> list[str]:
    return [module for module, source in sources.items() if _declared_all(source) is None]


def _public_modules() -> dict[str, list[str]]:
    """Every public module and its ``__all__`` (read from the source: the integrations'
    libraries need not be installed); one without counts as none, which
    :func:`test_every_public_module_declares_its_all` refuses."""
    return {module: _declared_all(source) or [] for module, source in _public_sources().items()}


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
        # A name accel re-exports is documented once, at the top of the page.
        own = sorted(set(names) - top)
        if members is None:
            if own:
                problems.append(
                    f"{module}: members: false, yet its __all__ has names accel does not "
                    f"export: {own}"
                )
        elif sorted(members) != own:
            problems.append(f"{module}: the page lists {sorted(members)}, __all__ is {own}")
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


def _public_objects() -> dict[object, list[str]]:
    """Every public object, and the public paths (``module.name``) that name it: a
    re-export is the same object, so one entry."""
    objects: dict[object, list[str]] = {}
    for module_name, names in _public_modules().items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:  # an integration whose library is not installed
            module = None
        for name in names:
            value = getattr(module, name, None)
            # A string or a number is the same object wherever it is equal: its path
            # is its identity. So is the name of a module that cannot be imported here
            # (each integration defines its own names).
            plain = module is None or isinstance(value, (str, int, float))
            key: object = f"{module_name}.{name}" if plain else id(value)
            objects.setdefault(key, []).append(f"{module_name}.{name}")
    return objects


def _home_problems(objects: dict[object, list[str]]) -> list[str]:
    """Names public in more than one module, or re-exported by ``accel`` from a module
    that is not one of :data:`TOP_MODULES`."""
    problems = []
    for paths in objects.values():
        homes = [p for p in paths if p.rpartition(".")[0] != "accel"]
        if len(homes) > 1:
            problems.append(f"{sorted(paths)} name one object: keep one home, drop the others")
        elif len(homes) < len(paths) and homes and homes[0].rpartition(".")[0] not in TOP_MODULES:
            problems.append(
                f"accel re-exports {homes[0]}: the top level re-exports names of "
                f"{', '.join(TOP_MODULES)} only"
            )
    # The errors that mirror a built-in are caught as the built-in; their one home is
    # accel.errors (issue 38).
    mirrors = [
        p
        for paths in objects.values()
        for p in paths
        if p.rpartition(".")[0] == "accel"
        and p.rpartition(".")[2].removeprefix("Accelerator") in vars(builtins)
    ]
    problems += [f"{p} mirrors a built-in error: its one home is accel.errors" for p in mirrors]
    return problems


def test_every_public_module_declares_its_all() -> None:
    """A module without ``__all__`` would export every name it defines, yet count as
    none here: the limit below would not see them."""
    assert _without_all(_public_sources()) == [], (
        "public modules without __all__: list what users import from each, or "
        "`__all__: list[str] = []` with a comment saying where its names are public"
    )


def test_the_all_check_finds_a_module_without_one() -> None:
    sources = _public_sources()
    sources["accel.plugins.cpu"] = re.sub(r"(?m)^__all__.*$", "", sources["accel.plugins.cpu"])
    assert _without_all(sources) == ["accel.plugins.cpu"]


def test_the_surface_is_at_most_122_names() -> None:
    objects = _public_objects()
    assert len(objects) <= MAX_PUBLIC_NAMES, (
        f"{len(objects)} public names (a re-export counted once), at most "
        f"{MAX_PUBLIC_NAMES}: make private what users and plugin authors do not need"
    )


def test_every_public_name_has_one_home() -> None:
    assert _home_problems(_public_objects()) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda o: o[id(accel.plugins.TpuPlugin)].append("accel.plugins.tpu.TpuPlugin"),
            "name one object: keep one home",
        ),
        (
            lambda o: o[id(accel.training.step.clip_grad_norm)].append("accel.clip_grad_norm"),
            "accel re-exports accel.training.step.clip_grad_norm",
        ),
        (
            lambda o: o[id(accel.errors.AcceleratorKeyError)].append("accel.AcceleratorKeyError"),
            "accel.AcceleratorKeyError mirrors a built-in error",
        ),
    ],
)
def test_the_home_check_finds_each_kind_of_problem(edit: object, expected: str) -> None:
    objects = _public_objects()
    edit(objects)  # type: ignore[operator]
    assert any(expected in problem for problem in _home_problems(objects))


def test_every_error_and_warning_of_accel_errors_is_public_there() -> None:
    defined = {
        name
        for name, value in vars(accel.errors).items()
        if inspect.isclass(value)
        and issubclass(value, Warning | Exception)
        and value.__module__ == "accel.errors"
        and not name.startswith("_")
    }
    assert defined - set(accel.errors.__all__) == set()


# "accel.x.y" in text: the paths a docstring or a message sends a reader to.
_DOTTED = re.compile(r"(?<![\w.])accel(?:\.\w+)+")


def _is_public_path(path: str, modules: dict[str, list[str]]) -> bool:
    """``path`` is a public module, a public name, or an attribute of a public name."""
    parts = path.split(".")
    if any(part.startswith("_") for part in parts):
        return False
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            rest = parts[cut:]
            return not rest or rest[0] in modules[module]
    return False


def _docstring_problems() -> list[str]:
    """``where: path`` for every accel path a public docstring names that is not public."""
    modules = _public_modules()
    problems = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        documented: list[tuple[str, object]] = [(module_name, module)]
        for name in modules[module_name]:
            value = getattr(module, name)
            documented.append((f"{module_name}.{name}", value))
            if inspect.isclass(value):
                documented += [
                    (f"{module_name}.{name}.{attr}", member)
                    for attr, member in vars(value).items()
                    if not attr.startswith("_")
                ]
        for where, value in documented:
            value = getattr(value, "fget", getattr(value, "__func__", value))
            doc = value.__doc__ if inspect.ismodule(value) else inspect.getdoc(value)
            for path in _DOTTED.findall(doc or ""):
                if not _is_public_path(path.rstrip("."), modules):
                    problems.append(f"{where}: {path}")
    return sorted(set(problems))


def test_public_docstrings_name_public_paths_only() -> None:
    assert _docstring_problems() == []


def test_messages_name_no_private_module() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            # A string that is a module path and nothing else is an import target.
            if id(node) in docstrings or re.fullmatch(r"accel(\.\w+)+", node.value):
                continue
            problems += [
                f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {found}"
                for found in _DOTTED.findall(node.value)
                if any(part.startswith("_") for part in found.split("."))
            ]
    assert problems == []
