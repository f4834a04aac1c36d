"""The shape of the package, checked: no import circle, small modules, pluggy's public
API only, and a public surface equal to docs/api.md (see docs/architecture.md)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import accel

PACKAGE = Path(accel.__file__).parent
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
    and under ``TYPE_CHECKING`` alike.

    Importing ``accel.x.y`` runs the packages ``accel`` and ``accel.x`` first, which is
    not a circle; but ``from accel.x import name`` in ``accel.x.y`` reads the package's
    own namespace (a submodule name included) while the package may still be importing
    ``accel.x.y``: that is an edge to the package, and a circle where the package
    imports the module back.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    read_from: set[str] = set()
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
            # accel/__init__.py reaches its submodules only through its lazy names,
            # after it has finished: reading its namespace is never a circle.
            if _is_ancestor(base, module) and base != "accel":
                read_from.add(base)
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and (not _is_ancestor(name, module) or name in read_from):
                targets.add(name)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # The package's lazy names (PEP 562) are imports too.
    lazy = getattr(accel, "_LAZY_NAMES", {})
    graph["accel"] |= set(lazy.values())
    return graph


def _is_ancestor(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
    return cycles


def test_no_module_of_accel_imports_itself_back_through_others() -> None:
    cycles = _cycles(_graph())
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_circle_check_sees_a_module_reading_its_own_package(tmp_path: Path) -> None:
    package = tmp_path / "accel" / "kit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from accel.kit._runner import run\n")
    (package / "_checks.py").write_text("CHECKS = ()\n")
    known = {"accel", "accel.kit", "accel.kit._runner", "accel.kit._checks"}

    def graph_of(runner_source: str) -> dict[str, set[str]]:
        (package / "_runner.py").write_text(runner_source)
        return {
            name: _imports(name, path, known)
            for name, path in {
                "accel.kit": package / "__init__.py",
                "accel.kit._runner": package / "_runner.py",
                "accel.kit._checks": package / "_checks.py",
            }.items()
        }

    # A submodule read off the package that is importing this module: a circle.
    for source in ("from accel.kit import _checks\n", "from . import _checks\n"):
        assert _cycles(graph_of(source)) == [["accel.kit", "accel.kit._runner", "accel.kit"]]
    # The module itself, imported by its full name: importing the package first is no circle.
    for source in ("from accel.kit._checks import CHECKS\n", "import accel.kit._checks\n"):
        assert _cycles(graph_of(source)) == []


#: The layers, bottom first: a module imports only from its own layer and the layers
#: below it (docs/architecture.md draws the same picture). Each is a list of module
#: prefixes; every module of accel belongs to exactly one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # Below everything: every layer raises them (the name rules too), and they import nothing.
    ("the exceptions", ("accel.errors",)),
    ("leaf helpers", ("accel._util",)),
    ("the plugin contract", ("accel.markers", "accel.types", "accel.hookspecs")),
    ("tying and the training helpers", ("accel.tying", "accel.training")),
    ("the built-in plugins", ("accel.plugins",)),
    ("the move machinery and the typed hook caller", ("accel._core",)),
    ("the handle", ("accel.accelerator",)),
    ("selection and the registry", ("accel._registry", "accel.registry")),
    (
        "on top",
        (
            "accel.distributed",
            "accel.integrations",
            "accel.tools",
            "accel.testing",
            "accel.__main__",
        ),
    ),
    ("the package's public names", ("accel",)),
]


def _layer_of(module: str) -> int:
    matches = [
        (len(prefix), position)
        for position, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} belongs to no layer: add it to LAYERS"
    return max(matches)[1]  # the longest prefix decides (accel.tying before accel)


def _arrows_up(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} ({LAYERS[_layer_of(module)][0]}) -> {target} ({LAYERS[_layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if _layer_of(target) > _layer_of(module)
    ]


def test_every_import_runs_down_the_layers() -> None:
    assert _arrows_up(_graph()) == []


def test_the_layer_check_sees_an_arrow_up_and_every_kind_of_import() -> None:
    graph = _graph()
    assert "accel._core.hooks" in graph["accel.accelerator"]  # module level, one layer down
    assert "accel.training.memory" in graph["accel._core.hooks"]  # skipping layers is fine
    assert "accel.accelerator" in graph["accel"]  # the package's lazy names count
    # An arrow up is reported, naming both layers.
    up = _arrows_up({"accel.training.step": {"accel._core.hooks"}})
    assert up == [
        "accel.training.step (tying and the training helpers) -> accel._core.hooks "
        "(the move machinery and the typed hook caller)"
    ]


def test_the_built_in_plugins_use_only_the_contract_and_the_helpers() -> None:
    graph = _graph()
    reached = {
        target
        for module, targets in graph.items()
        if module.startswith("accel.plugins")
        for target in targets
        if not target.startswith("accel.plugins")
    }
    assert reached, "the check sees what the plugins import"
    assert {t for t in reached if _layer_of(t) > _layer_of("accel.training")} == set()


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


#: The modules that ``import accel``, ``import accel.distributed``, ``accel --help`` and
#: pytest's loading of accel's pytest plugin reach: they must not import torch, so they
#: alone may import inside functions (and only what the torch-free path must not load).
TORCH_FREE = {
    "accel",
    "accel.__main__",
    "accel._util",
    "accel._util.lazy",
    "accel._util.names",
    "accel.errors",
    "accel.distributed",
    "accel.tools",
    "accel.tools.cli",
    "accel.tools._conformance",
    "accel.tools.pytest_plugin",
}


#: Imports inside functions that are a choice, not a way around a circle: each is
#: guarded by an ``if`` that finds the module loaded already (a compiled module or a
#: DTensor cannot exist otherwise, and importing them costs seconds).
GUARDED_IMPORTS = {
    ("accel.training.step", "torch._dynamo.eval_frame"),
    ("accel.training.step", "torch.distributed.tensor"),
    ("accel.training._filling", "torch.distributed.tensor"),
    # Asked only where the answer is needed: inductor's device backends, when compiling
    # on a device type other than torch's own.
    ("accel.training._compiling", "torch._inductor.codegen"),
    # Only where materialize(load=) names a save_sharded directory.
    ("accel.training._filling", "torch.distributed.checkpoint"),
    ("accel.training._filling", "torch.distributed.checkpoint.filesystem"),
    ("accel.training._filling", "torch.distributed.checkpoint.api"),
}


def _function_level_imports(module: str, path: Path) -> list[str]:
    """The accel and torch modules imported anywhere inside a function (under an
    ``if`` or a ``try`` too), but for :data:`GUARDED_IMPORTS`."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for statement in ast.walk(function):
            if isinstance(statement, ast.Import):
                names = [alias.name for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom) and not statement.level:
                names = [statement.module or ""]
            else:
                continue
            found += [
                f"{function.name}: {name}"
                for name in names
                if name.split(".")[0] in ("accel", "torch")
                and (module, name) not in GUARDED_IMPORTS
            ]
    return found


def test_imports_are_at_the_top_except_on_the_torch_free_path() -> None:
    local = {
        name: imports
        for name, path in _modules().items()
        if name not in TORCH_FREE and (imports := _function_level_imports(name, path))
    }
    assert local == {}


def _loaded_after(statement: str) -> set[str]:
    # A fresh interpreter: what an import pulls in shows only in a new sys.modules.
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(result.stdout.split())


def test_the_torch_free_path_imports_no_torch() -> None:
    loaded = _loaded_after("import accel, accel.distributed, accel.tools.cli")
    assert {m for m in loaded if m.split(".")[0] in ("torch", "pluggy")} == set()
    assert {m for m in loaded if m.split(".")[0] == "accel"} <= TORCH_FREE
    assert "accel.distributed" in loaded  # the probe imported what it names
    # pytest loads accel's pytest plugin in every session of an environment with accel.
    loaded = _loaded_after("import accel.tools.pytest_plugin")
    assert {m for m in loaded if m.split(".")[0] == "torch"} == set()
    assert {m for m in loaded if m.split(".")[0] == "accel"} <= TORCH_FREE
    # accel --help and --version answer without torch too.
    for flag in ("--help", "--version"):
        probe = (
            "import runpy, sys\n"
            f"sys.argv = ['accel', '{flag}']\n"
            "try:\n    runpy.run_module('accel', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
        )
        # A fresh interpreter: whether the command imports torch needs a new sys.modules.
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
        ).stdout
        assert out.strip().endswith("NO-TORCH"), (flag, out[-300:])
        assert len(out.strip().splitlines()) > 1, "the command printed its answer first"


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    # accel.hookspecs is the plugin author's reference, one docstring and example per
    # hook (as conda's hookspec.py): it grows with the hooks, and splitting it would
    # scatter the one page authors read.
    sizes.pop("accel.hookspecs")
    # accel.accelerator likewise is the user's reference: the handle declares every
    # public method itself, each with its docstring, and each one a thin call.
    sizes.pop("accel.accelerator")
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_pluggy_is_used_through_its_public_api_only() -> None:
    private = re.compile(r"\bpluggy\._|from pluggy\._")
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in _modules().values()
        if private.search(path.read_text())
    ]
    assert offenders == []
