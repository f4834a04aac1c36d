"""The wheel stage's checks (scripts/stages/wheel.sh runs them; see there).

    python wheel_check.py artifacts DIST_DIR REPO   the built sdist and wheel, in the build env
    python -I wheel_check.py installed VERSION REPO NEWEST_TORCH
                                                     the wheel installed in a fresh venv

Each check prints what it looked at; any problem is listed and the exit status is 1.
The ``installed`` half uses the standard library only: it runs in a venv that holds
accel-torch, its dependencies and nothing else.
"""

from __future__ import annotations

import email
import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

DIST = "accel-torch"

#: Public modules that need a library accel does not depend on. The stage imports each
#: one anyway where that library is missing and accepts only a ModuleNotFoundError for
#: it; every other public module must import in the bare venv.
#: module (and its submodules) -> (the top-level module it needs, how a user gets it)
NEEDS_MORE: dict[str, tuple[str, str]] = {
    "accel.integrations.lightning": ("lightning", "the 'lightning' extra"),
    "accel.integrations.ray": ("ray", "the 'ray' extra"),
    "accel.tools.pytest_plugin": ("pytest", "pytest, which loads it through pytest11"),
    # The kit's pytest front end (`pytest --pyargs accel.testing.conformance`); the kit
    # itself (run(), `accel conformance`) needs no pytest.
    "accel.testing.conformance.test_conformance": ("pytest", "pytest, which runs it"),
}

#: Tracked files the sdist leaves out on purpose ([tool.hatch.build.targets.sdist]).
NOT_SHIPPED = (".ci/", ".gitignore")

#: Never in a release: build leftovers and tool caches.
JUNK_PARTS = {
    "__pycache__",
    ".git",
    ".venv",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    ".benchmarks",
    "build",
    "dist",
    "site",
}
JUNK_SUFFIXES = (".pyc", ".pyo", ".egg-info", ".so", ".whl", ".tar.gz")

#: Hosts no real project URL has.
PLACEHOLDERS = (".invalid", "example.com", "example.org", "localhost")

#: What an sdist needs to be a source a user can install, test and read.
SDIST_NEEDS = (
    "PKG-INFO",
    "pyproject.toml",
    "README.md",
    "CHANGELOG.md",
    "mkdocs.yml",
    "accel/__init__.py",
    "accel/py.typed",
    "docs/index.md",
    "tests/conftest.py",
    "scripts/test",
)

problems: list[str] = []


def problem(text: str) -> None:
    problems.append(text)
    print(f"   PROBLEM: {text}")


def say(text: str) -> None:
    print(f"   {text}")


def passed(before: int, text: str) -> None:
    """Say what was checked, if no problem came up since ``before`` problems."""
    if len(problems) == before:
        say(text)


def finish(what: str) -> int:
    if problems:
        print(f"error: {what}: {len(problems)} problem(s):", file=sys.stderr)
        for text in problems:
            print(f"  - {text}", file=sys.stderr)
        return 1
    print(f"-- {what}: all checks passed")
    return 0


def is_junk(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return any(part in JUNK_PARTS or part.endswith(JUNK_SUFFIXES) for part in parts)


# -- the artifacts ---------------------------------------------------------------------


def source_version(repo: Path) -> str:
    text = (repo / "accel" / "__init__.py").read_text()
    found = re.findall(r'^__version__ = "([^"]+)"$', text, flags=re.MULTILINE)
    if len(found) != 1:
        problem(f'accel/__init__.py has {len(found)} `__version__ = "..."` lines, not one')
        return "?"
    return found[0]


def check_one_version(repo: Path) -> str:
    # Here, not at the top: tomllib is 3.11+, and the venv's Python may be 3.10.
    import tomllib

    before = len(problems)
    version = source_version(repo)
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    if "version" in project:
        problem(
            f"pyproject.toml sets version = {project['version']!r}: "
            "the version lives only in accel/__init__.py"
        )
    if "version" not in project.get("dynamic", []):
        problem('pyproject.toml\'s [project] lacks dynamic = ["version"]')
    passed(before, f"version {version}: from accel/__init__.py only (pyproject.toml: dynamic)")
    return version


def tracked_files(repo: Path) -> tuple[set[str], set[str]]:
    """git's tracked files, and the untracked ones it does not ignore (not yet committed)."""

    def git(*args: str) -> set[str]:
        out = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return {name for name in out.split("\0") if name}

    try:
        return git(), git("--others", "--exclude-standard")
    except (OSError, subprocess.CalledProcessError) as exc:
        problem(f"`git ls-files` failed in {repo} ({exc}); the stage compares the sdist with git")
        return set(), set()


def check_sdist(path: Path, version: str, repo: Path) -> None:
    print(f"-- sdist {path.name}")
    root = f"accel_torch-{version}"
    with tarfile.open(path) as archive:
        members = [m for m in archive.getmembers() if not m.isdir()]
    names = set()
    for member in members:
        top, _, rest = member.name.partition("/")
        if top != root or not rest:
            problem(f"{member.name} is outside the sdist's folder {root}/")
            continue
        names.add(rest)
        if not (member.isfile() or member.issym()):
            problem(f"{member.name} is not a plain file")
    say(f"{len(names)} files under {root}/")
    before = len(problems)
    for needed in SDIST_NEEDS:
        if needed not in names:
            problem(f"the sdist lacks {needed}")
    passed(before, f"holds {', '.join(SDIST_NEEDS)}")
    before = len(problems)
    for name in sorted(name for name in names if is_junk(name)):
        problem(f"the sdist ships junk: {name}")
    passed(before, "no caches, bytecode or build leftovers")
    before = len(problems)
    tracked, untracked = tracked_files(repo)
    shipped = {name for name in tracked if not name.startswith(NOT_SHIPPED)}
    for name in sorted(shipped - names):
        problem(f"git tracks {name} but the sdist lacks it")
    passed(before, f"ships all {len(shipped)} tracked files but {', '.join(NOT_SHIPPED)}")
    for name in sorted(names - tracked - {"PKG-INFO"}):
        if name in untracked:
            say(f"note: ships {name}, which git does not track yet (a clean clone lacks it)")
        elif not is_junk(name):
            problem(f"the sdist ships {name}, which is neither tracked nor new")


def check_wheel(path: Path, version: str, repo: Path) -> str:
    """The wheel's files and metadata; returns its README (the index page's text)."""
    print(f"-- wheel {path.name}")
    info = f"accel_torch-{version}.dist-info"
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())

        def text(name: str) -> str:
            return wheel.read(f"{info}/{name}").decode() if f"{info}/{name}" in names else ""

        metadata = email.message_from_string(text("METADATA"))
        entry_points = text("entry_points.txt")
    source = {
        p.relative_to(repo).as_posix()
        for p in (repo / "accel").rglob("*")
        if p.is_file() and not is_junk(p.relative_to(repo).as_posix())
    }
    package = {name for name in names if name.startswith("accel/")}
    before = len(problems)
    for name in sorted(source - package):
        problem(f"the wheel lacks {name}")
    for name in sorted(package - source):
        problem(f"the wheel ships {name}, which accel/ does not hold")
    if "accel/py.typed" not in package:
        problem("the wheel lacks accel/py.typed (typed package marker)")
    passed(
        before, f"accel/: {len(package)} files, the checkout's accel/ exactly, py.typed included"
    )
    before = len(problems)
    others = sorted(name for name in names - package if not name.startswith(f"{info}/"))
    for name in others:
        problem(f"the wheel ships {name}, outside accel/ and {info}/")
    for needed in ("METADATA", "WHEEL", "RECORD", "entry_points.txt"):
        if f"{info}/{needed}" not in names:
            problem(f"the wheel lacks {info}/{needed}")
    passed(before, f"nothing outside accel/ and {info}/, which holds METADATA, RECORD...")
    before = len(problems)
    for line in ("accel = accel.tools.cli:main", "accel = accel.tools.pytest_plugin"):
        if line not in entry_points.splitlines():
            problem(f"entry_points.txt lacks `{line}`")
    passed(before, "entry points: the accel command, the pytest11 plugin")
    before = len(problems)
    if metadata["Name"] != DIST or metadata["Version"] != version:
        problem(f"METADATA names {metadata['Name']} {metadata['Version']}, not {DIST} {version}")
    if metadata["Description-Content-Type"] != "text/markdown":
        problem("METADATA's Description-Content-Type is not text/markdown")
    urls = [*metadata.get_all("Project-URL", []), *metadata.get_all("Home-page", [])]
    for url in urls:
        if any(placeholder in url for placeholder in PLACEHOLDERS):
            problem(f"METADATA carries a placeholder URL: {url}")
    passed(before, f"METADATA: {DIST} {version}, README as text/markdown, {len(urls)} URLs")
    return str(metadata.get_payload())


#: Markdown links and images, reference definitions, HTML href/src.
LINK_PATTERNS = (
    re.compile(r"\]\(\s*<?([^)\s>]+)"),
    re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?\s*$", re.MULTILINE),
    re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)"""),
)


def check_readme_links(readme: str) -> None:
    print("-- the README as the package index shows it (METADATA's description)")
    if not readme.strip():
        problem("the wheel's METADATA has no description (the README)")
        return
    # Code is not a link: drop fenced blocks and inline code first.
    prose = re.sub(r"^```.*?^```", "", readme, flags=re.MULTILINE | re.DOTALL)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    links = [match for pattern in LINK_PATTERNS for match in pattern.findall(prose)]
    for link in links:
        if not link.startswith(("https://", "http://", "mailto:")):
            problem(f"README link {link!r} is relative: it breaks on the index's page")
        elif any(placeholder in link for placeholder in PLACEHOLDERS):
            problem(f"README link {link!r} is a placeholder")
    say(f"{len(links)} links: {', '.join(sorted(set(links))) or 'none'}")


def artifacts(dist: Path, repo: Path) -> int:
    print("-- the version")
    version = check_one_version(repo)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        problem(
            f"expected one wheel and one sdist in {dist}, found {[p.name for p in dist.iterdir()]}"
        )
        return finish("the sdist and the wheel")
    if wheels[0].name != f"accel_torch-{version}-py3-none-any.whl":
        problem(f"the wheel is {wheels[0].name}, not accel_torch-{version}-py3-none-any.whl")
    check_sdist(sdists[0], version, repo)
    readme = check_wheel(wheels[0], version, repo)
    check_readme_links(readme)
    return finish("the sdist and the wheel")


# -- the installed wheel ---------------------------------------------------------------


def clean_environment() -> dict[str, str]:
    """This environment less what could point Python at the checkout or steer accel."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "ACCEL_", "PJRT_", "XRT_", "TPU_"))
    }


def inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def public_modules() -> list[str]:
    """Every module of the installed distribution whose dotted path has no part
    starting with ``_``, read from the installed files (RECORD), not from a list."""
    files = importlib.metadata.files(DIST) or []
    modules = []
    for file in files:
        parts = PurePosixPath(str(file)).parts
        if parts[0] != "accel" or not parts[-1].endswith(".py"):
            continue
        parts = (*parts[:-1], parts[-1].removesuffix(".py"))
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            modules.append(".".join(parts))
        if not inside(file.locate(), sys.prefix):
            problem(f"{file} is installed at {file.locate()}, outside the venv {sys.prefix}")
    return sorted(modules)


def needs_more(module: str) -> tuple[str, str] | None:
    for prefix, needed in NEEDS_MORE.items():
        if module == prefix or module.startswith(prefix + "."):
            return needed
    return None


def check_imports() -> None:
    modules = public_modules()
    print(f"-- importing the wheel's {len(modules)} public modules (found in its RECORD)")
    print("   may fail only for want of a library accel does not depend on:")
    for module, (library, how) in NEEDS_MORE.items():
        shipped = (
            "" if any(needs_more(m) == (library, how) for m in modules) else " (not in this wheel)"
        )
        print(f"     {module} -> {library}: {how}{shipped}")
    if "accel" not in modules:
        problem("the installed files have no accel/__init__.py")
    for module in modules:
        needed = needs_more(module)
        missing = needed is not None and importlib.util.find_spec(needed[0]) is None
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if missing and needed is not None and exc.name == needed[0]:
                say(f"skipped {module}: needs {needed[0]} ({needed[1]}), not installed")
                continue
            problem(f"import {module}: {type(exc).__name__}: {exc}")
        except Exception as exc:
            problem(f"import {module}: {type(exc).__name__}: {exc}")
        else:
            say(f"import {module}: ok")


def run_command(*args: str, expect: str | None = None) -> str:
    command = [os.path.join(sys.prefix, "bin", "accel"), *args]
    print(f"-- $ accel {' '.join(args)}")
    done = subprocess.run(
        command, capture_output=True, text=True, env=clean_environment(), timeout=300
    )
    for line in (done.stderr + done.stdout).splitlines():
        print(f"   | {line}")
    if done.returncode != 0:
        problem(f"`accel {' '.join(args)}` exited {done.returncode}")
    elif expect is not None and expect not in done.stdout:
        problem(f"`accel {' '.join(args)}` printed no {expect!r}")
    return done.stdout


def release(version: str) -> tuple[int, ...]:
    """``2.14.1+cu130`` -> ``(2, 14, 1)``: the release numbers, for comparing versions
    with the standard library only."""
    found = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else ()


def check_torch(newest: str) -> None:
    """The torch pip chose for the unpinned install: the newest tier's, or newer."""
    print("-- the torch an unpinned `pip install accel-torch` brought")
    before = len(problems)
    found = importlib.metadata.version("torch")
    if release(found) < release(newest):
        problem(
            f"pip installed torch {found}, older than {newest}, the newest torch the tests "
            "run (requirements/newest.txt): this venv does not show the newest torch"
        )
    elif release(found) > release(newest):
        say(f"note: torch {found} is newer than {newest}, the newest torch the tests run")
    passed(before, f"torch {found}, not pinned: the newest torch pip finds here")


def installed(version: str, repo: str, newest_torch: str) -> int:
    # Here, not at the top: the artifacts half runs where accel is not installed.
    import accel

    print(f"-- the installed accel (python {sys.version.split()[0]}, {sys.prefix})")
    before = len(problems)
    for entry in sys.path:
        if entry and inside(entry, repo):
            problem(f"sys.path holds {entry}, inside the checkout {repo}")
    if inside(os.getcwd(), repo):
        problem(f"the working directory {os.getcwd()} is inside the checkout")
    if not inside(accel.__file__, sys.prefix):
        problem(f"accel is imported from {accel.__file__}, not from the venv {sys.prefix}")
    passed(before, f"accel.__file__ = {accel.__file__}; nothing of the checkout on sys.path")
    before = len(problems)
    found = importlib.metadata.version(DIST)
    if not (found == accel.__version__ == version):
        problem(
            f"versions differ: built {version}, installed metadata {found}, "
            f"accel.__version__ {accel.__version__}"
        )
    passed(before, f"version {version}: the built wheel's, the installed metadata's, accel's")
    before = len(problems)
    if "torch" in sys.modules:
        problem("`import accel` imported torch")
    passed(before, "`import accel` imports no torch")
    before = len(problems)
    probe = (
        "import sys\nfrom accel.tools.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    loaded = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, env=clean_environment()
    )
    if loaded.returncode != 0 or loaded.stdout.splitlines()[-1:] != ["False"]:
        problem(f"`accel --version` imported torch or failed: {loaded.stdout}{loaded.stderr}")
    passed(before, "`accel --version` imports no torch")
    check_torch(newest_torch)

    out = run_command("--version")
    if out.strip() != f"accel {version}":
        problem(f"`accel --version` printed {out.strip()!r}, not 'accel {version}'")
    run_command("list", expect="cpu")
    run_command("demo", "--steps", "2")
    check_imports()
    return finish("the installed wheel")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "artifacts":
        return artifacts(Path(argv[1]), Path(argv[2]).resolve())
    if len(argv) == 4 and argv[0] == "installed":
        return installed(argv[1], argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
