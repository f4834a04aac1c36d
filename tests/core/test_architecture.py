"""The shape of the package, checked: no import circle, small modules, pluggy's public
API only, and a public surface equal to docs/api.md (see docs/architecture.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import accel

PACKAGE = Path(accel.__file__).parent
API_PAGE = PACKAGE.parent / "docs" / "api.md"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every accel module ``module`` imports anywhere: at the top, inside functions,
    and under ``TYPE_CHECKING`` alike."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            # "from accel.x import y": y may be a module of its own.
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # The package's lazy names (PEP 562) are imports too.
    lazy = getattr(accel, "_LAZY_NAMES", {})
    graph["accel"] |= set(lazy.values())
    # Importing accel.x.y runs accel/__init__.py and accel/x/__init__.py first: an edge
    # from a module to a package it lives in is not a circle (the packages' own imports
    # are checked like every other module's).
    return {
        name: {t for t in targets if not _is_ancestor(t, name)} for name, targets in graph.items()
    }


def _is_ancestor(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def test_no_module_of_accel_imports_itself_back_through_others() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: finished

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_circle_check_sees_function_level_and_type_checking_imports() -> None:
    graph = _graph()
    assert "accel.accelerator" in graph["accel._core.selection"]  # module level
    assert "accel._core.fallbacks" in graph["accel.registry"]  # inside a method
    assert "accel._core.hooks" in graph["accel.accelerator"]  # under TYPE_CHECKING


def test_no_layer_imports_the_tools_or_integrations_and_only_the_registry_knows_plugins() -> None:
    graph = _graph()

    def importers_of(package: str) -> set[str]:
        return {
            module
            for module, targets in graph.items()
            if not module.startswith(package)
            and any(t == package or t.startswith(package + ".") for t in targets)
        }

    assert importers_of("accel.tools") == {"accel.__main__"}
    assert importers_of("accel.integrations") == set()
    plugin_users = importers_of("accel.plugins")
    assert plugin_users <= {"accel.registry", "accel.tools.cli"}
    assert "accel.registry" in plugin_users  # the check sees the built-ins' registration


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    # accel.hookspecs is the plugin author's reference, one docstring and example per
    # hook (as conda's hookspec.py): it grows with the hooks, and splitting it would
    # scatter the one page authors read.
    sizes.pop("accel.hookspecs")
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_pluggy_is_used_through_its_public_api_only() -> None:
    private = re.compile(r"\bpluggy\._|from pluggy\._")
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in _modules().values()
        if private.search(path.read_text())
    ]
    assert offenders == []


def _documented() -> set[str]:
    return set(re.findall(r"^::: ([\w.]+)", API_PAGE.read_text(), flags=re.MULTILINE))


def test_every_public_name_and_module_is_in_the_api_reference() -> None:
    documented = _documented()
    public_modules = {
        name
        for name in _modules()
        if name != "accel" and not any(part.startswith("_") for part in name.split("."))
    }
    for name in accel.__all__:
        if name == "__version__":
            continue
        owner = getattr(accel, "_LAZY_NAMES", {}).get(name) or getattr(accel, name).__module__
        assert f"accel.{name}" in documented or owner in documented, f"accel.{name}"
    covered = {
        module
        for module in public_modules
        if module in documented  # the module itself
        or module.rpartition(".")[0] in documented  # its package (accel.plugins.cpu)
        or any(name.startswith(f"{module}.") for name in documented)  # one of its members
    }
    assert public_modules - covered == set(), "public modules missing from docs/api.md"


def test_the_api_reference_documents_nothing_private() -> None:
    private = {name for name in _documented() if any(p.startswith("_") for p in name.split("."))}
    assert private == set()
