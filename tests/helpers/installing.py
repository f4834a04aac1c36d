"""Installing the fixture distributions in tests/dists/ for real, but privately."""

from __future__ import annotations

from pathlib import Path

from helpers.processes import run_python

DISTS = Path(__file__).resolve().parents[1] / "dists"


def pip_install_into(target: Path, *projects: str) -> Path:
    """pip-install the named tests/dists/ projects into ``target`` (for PYTHONPATH)."""
    run_python(
        [
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            *(str(DISTS / project) for project in projects),
        ],
        timeout=300,
        check=True,
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
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    lines = [f"[{group}]", *(f"{key} = {value}" for key, value in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source, encoding="utf-8")
    return root
