"""Fresh interpreters, for what a test cannot see in its own process.

What `import accel` imports, plugin autoload at first use, torch_xla's runtime
(which reads its settings once per process), the installed console script, a
private site directory on PYTHONPATH: these need a new Python process. Each one
starts from the test process's environment minus accel's own variables, so a
developer's ``ACCEL_ACCELERATOR`` (or a tier's ``ACCEL_TIER``) cannot change what
the child does; a test adds or deletes the variables it is about.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

#: The `accel` console script pip installed next to this interpreter.
ACCEL_SCRIPT: Final = Path(sys.executable).parent / "accel"

#: Variables to set (a string) or to delete (None) in a child's environment.
Environment = Mapping[str, str | None]


def clean_environment(
    env: Environment | None = None, *, drop_prefixes: tuple[str, ...] = ("ACCEL_",)
) -> dict[str, str]:
    """This process's environment without the variables named ``drop_prefixes*``,
    then ``env`` on top: a string sets a variable, None deletes it."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes)}
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    return environment


def run_command(
    command: Sequence[str | os.PathLike[str]],
    *,
    env: Environment | None = None,
    drop_prefixes: tuple[str, ...] = ("ACCEL_",),
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 120,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a clean environment (see `clean_environment`), capturing
    stdout and stderr as text. ``check`` raises CalledProcessError on a non-zero
    exit; a test that asserts on the status or on stderr leaves it False."""
    return subprocess.run(
        [os.fspath(part) for part in command],
        cwd=cwd,
        env=clean_environment(env, drop_prefixes=drop_prefixes),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def run_python(
    code_or_args: str | Sequence[str | os.PathLike[str]],
    *,
    env: Environment | None = None,
    drop_prefixes: tuple[str, ...] = ("ACCEL_",),
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 120,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter (this one's executable, so the same environment's packages).

    A string is code for ``python -c``, dedented, so it can be written indented in
    the test; a sequence is the arguments after ``python`` (a script, or ``-m``).
    """
    if isinstance(code_or_args, str):
        args: list[str | os.PathLike[str]] = ["-c", textwrap.dedent(code_or_args)]
    else:
        args = list(code_or_args)
    return run_command(
        [sys.executable, *args],
        env=env,
        drop_prefixes=drop_prefixes,
        cwd=cwd,
        timeout=timeout,
        check=check,
    )


def last_json_line(result: subprocess.CompletedProcess[str]) -> Any:
    """The child's last line of stdout, parsed as JSON: how a child reports back
    (whatever it printed before, warnings included). Asserts the child exited 0,
    showing its stderr when it did not."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_kit_under_pytest(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``pytest --pyargs accel.testing.conformance ARGS`` as a vendor's CI runs it: no
    TPU configured and no default accelerator name, ``env`` added."""
    autoloaded = any(
        ep.value == "accel.tools.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    # Where accel is not installed (the tests import the checkout), load accel's plugin
    # by hand; never twice, which pytest refuses.
    plugin = () if autoloaded else ("-p", "accel.tools.pytest_plugin")
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PJRT_DEVICE", "ACCEL_ACCELERATOR"}
    }
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--pyargs", "accel.testing.conformance"),
            *plugin,
            *("-p", "no:cacheprovider", "-q"),
            *args,
        ],
        cwd=cwd,
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
