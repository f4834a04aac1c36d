"""The fixture distributions in tests/dists/, installed privately without pip.

pip takes seconds a project; `install_fixture_distributions` lays out what pip would leave
(the ``.dist-info`` with its metadata and entry points, the package's source) in
milliseconds, from the project's own pyproject.toml. Discovery reads only that layout
through importlib.metadata, so what the tests assert is the same. The example plugin
(examples/accel-example-plugin) is the one really pip-installed, by `bash scripts/test`.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib; every environment has pip, which vendors tomli.
    from pip._vendor import tomli as tomllib

DISTS = Path(__file__).resolve().parents[1] / "dists"


def install_fixture_distributions(target: Path, *projects: str) -> Path:
    """Install the named tests/dists/ projects into ``target`` (for PYTHONPATH), as
    ``pip install --no-deps --target`` would: metadata, entry points and packages."""
    for project in projects:
        source = DISTS / project
        with (source / "pyproject.toml").open("rb") as file:
            pyproject = tomllib.load(file)
        metadata = pyproject["project"]
        packages = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
        _write_dist_info(
            target,
            metadata["name"],
            metadata["version"],
            metadata.get("entry-points", {}),
        )
        for package in packages:
            shutil.copytree(
                source / package,
                target / package,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
    return target


def write_distribution(
    root: Path,
    name: str,
    *,
    group: str,
    entry_points: dict[str, str],
    modules: dict[str, str],
    version: str = "1.0",
) -> Path:
    """Lay out an installed distribution by hand in ``root`` (put it on sys.path): its
    ``.dist-info`` (metadata and entry points) and its modules' source, as pip would
    leave them. For in-process tests that need distinct distributions without pip."""
    _write_dist_info(root, name, version, {group: entry_points})
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source, encoding="utf-8")
    return root


def _write_dist_info(
    root: Path, name: str, version: str, groups: dict[str, dict[str, str]]
) -> Path:
    # The directory is named as a wheel names it (the escaped, lower-cased name);
    # METADATA keeps the name as the project spells it, which is what accel reports.
    escaped = re.sub(r"[-_.]+", "_", name).lower()
    info = root / f"{escaped}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    lines: list[str] = []
    for group, entry_points in groups.items():
        lines += [f"[{group}]", *(f"{key} = {value}" for key, value in entry_points.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines), encoding="utf-8")
    return info
